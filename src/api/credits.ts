// The contracts of paying for inference (docs/inference.md, "Payment"): API
// keys bound to a wallet, and the wallet's prepaid credit held in JobEscrow
// escrows. TypeBox schemas shared by the server
// (src/orchestrator/routes/credits.ts) and the client (./credit-client.ts).
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const Hex32 = Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' });
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

/** An API key: `nk-` and 48 hex digits (24 random bytes). */
export const API_KEY_PATTERN = '^nk-[0-9a-f]{48}$';
export const ApiKeyId = Type.String({ pattern: '^key-[0-9a-f]{12}$' });

/** POST /api-keys */
export const CreateApiKeyRequest = Type.Object(
  { name: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9][A-Za-z0-9 _.-]*$' })) },
  { additionalProperties: false },
);
export type CreateApiKeyRequest = Static<typeof CreateApiKeyRequest>;

export const ApiKeyView = Type.Object({
  /** how the key is named in list and revoke (not the secret) */
  id: ApiKeyId,
  name: Type.String(),
  /** the key's first characters */
  prefix: Type.String(),
  /** the wallet whose credit it spends */
  owner: Address,
  createdAt: Ms,
  lastUsedAt: Nullable(Ms),
  revokedAt: Nullable(Ms),
});
export type ApiKeyView = Static<typeof ApiKeyView>;
export const ApiKeyList = Type.Array(ApiKeyView);

/** The answer to POST /api-keys: the only time the key itself is shown. */
export const CreatedApiKey = Type.Object({ key: Type.String({ pattern: API_KEY_PATTERN }), apiKey: ApiKeyView });
export type CreatedApiKey = Static<typeof CreatedApiKey>;

/** GET /credits/terms: where credit is escrowed (null: an unpaid network, where every model is free) and how a payment is split. */
export const CreditTerms = Type.Object({
  payment: Nullable(Type.Object({ chainId: Type.Integer({ minimum: 1 }), jobEscrow: Address })),
  /** the serving miners' share of what a request pays, in basis points; the model's owner receives the rest */
  minersShareBps: Type.Integer({ minimum: 0, maximum: 10_000 }),
  /** tokens run through a stage that make one unit of inference work */
  tokensPerUnit: Type.Integer({ minimum: 1 }),
});
export type CreditTerms = Static<typeof CreditTerms>;

/** POST /credits: an escrow the signer opened on JobEscrow, to add to their balance. */
export const AddCreditRequest = Type.Object({ escrowId: Hex32 }, { additionalProperties: false });
export type AddCreditRequest = Static<typeof AddCreditRequest>;

export const CreditEscrowView = Type.Object({
  escrowId: Hex32,
  /** wei escrowed */
  amount: Wei,
  /** wei drawn from it for closed epochs (paid or being paid) */
  committed: Wei,
  status: Type.Union([Type.Literal('open'), Type.Literal('ending'), Type.Literal('closing'), Type.Literal('closed')]),
  refunded: Nullable(Wei),
  /** from then its owner could close it on chain alone: it stops counting in the balance a day before */
  refundAfter: Ms,
  error: Nullable(Type.String()),
  /** ms until which the orchestrator's lock on chain holds it: its owner cannot close it alone before (null: closed, or not locked) */
  lockedUntil: Type.Optional(Nullable(Ms)),
  /** failed tries of its failing chain call (a payment, its lock, its close), retried with backoff */
  attempts: Type.Optional(Type.Integer({ minimum: 0 })),
  /** ms of that call's next try (null: none pending) */
  retryAt: Type.Optional(Nullable(Ms)),
});
export type CreditEscrowView = Static<typeof CreditEscrowView>;

/** GET /credits: the signer's balance (wei, decimal strings). */
export const CreditView = Type.Object({
  owner: Address,
  /** what a new request may reserve: open escrows less what is reserved, charged and not yet drawn */
  balance: Wei,
  /** held for requests under way */
  reserved: Wei,
  /** charged, not yet drawn from an escrow (the next epoch draws it) */
  owed: Wei,
  /** charged in all */
  spent: Wei,
  escrows: Type.Array(CreditEscrowView),
});
export type CreditView = Static<typeof CreditView>;
