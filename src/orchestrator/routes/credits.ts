// Paying for inference (docs/inference.md, "Payment"): a wallet's API keys
// (create: the key is shown once; list; revoke) and its prepaid credit
// (register an escrow it opened on JobEscrow, see the balance, withdraw). All
// signed with the wallet (what a key spends and what credit is added is the
// signer's, never a body's word). Contracts in ../../api/credits.ts.
import { Type } from '@sinclair/typebox';
import { AddCreditRequest, ApiKeyId, ApiKeyList, ApiKeyView, CreateApiKeyRequest, CreatedApiKey, CreditTerms, CreditView } from '../../api/credits.ts';
import { escrowAddress } from '../../chain/escrow.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { CreditService } from '../serving/credits.ts';
import { GAS_LIMITS, SlidingWindow } from '../rewards/gas.ts';
import { MINERS_SHARE_BPS } from '../serving/credits.ts';
import { apiKeyView, INFERENCE_TOKENS_PER_UNIT, type InferenceBilling } from '../serving/billing.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { ChainClient } from '../../chain/client.ts';

const wallet = { signed: 'wallet' } as const;
const KeyParams = Type.Object({ id: ApiKeyId });

/** `credits` and `client` are null on an unpaid network: keys work, credit is refused. */
export function creditRoutes(app: HttpServer, state: OrchestratorState, billing: InferenceBilling, credits: CreditService | null, client: ChainClient | null): void {
  const registered = new SlidingWindow(GAS_LIMITS.creditEscrowsPerOwner);
  const paid = (): CreditService => {
    if (!credits) throw new NimbleError('no_chain', 'this network takes no payment: its models are free, an API key is all a request needs', 409);
    return credits;
  };

  app.post('/api-keys', { config: wallet, schema: { body: CreateApiKeyRequest, response: { 201: CreatedApiKey } } }, async (req, reply) => {
    const created = billing.createKey(signerOf(req), req.body.name);
    void reply.status(201);
    return created;
  });
  app.get('/api-keys', { config: wallet, schema: { response: { 200: ApiKeyList } } }, async (req) => state.apiKeys.list(signerOf(req)).map(apiKeyView));
  app.post('/api-keys/:id/revoke', { config: wallet, schema: { params: KeyParams, response: { 200: ApiKeyView } } }, async (req) => billing.revokeKey(req.params.id, signerOf(req)));

  app.get('/credits/terms', { schema: { response: { 200: CreditTerms } } }, async () => ({
    payment: client && credits ? { chainId: client.chainId, jobEscrow: escrowAddress(client) } : null,
    minersShareBps: Number(MINERS_SHARE_BPS),
    tokensPerUnit: INFERENCE_TOKENS_PER_UNIT,
  }));
  app.post('/credits', { config: wallet, schema: { body: AddCreditRequest, response: { 201: CreditView } } }, async (req, reply) => {
    const owner = signerOf(req);
    // each credit escrow is closed (and paid from) by the orchestrator's transactions: a few new ones an hour per owner (rewards/gas.ts)
    const what = `${owner} added ${registered.count(owner.toLowerCase())} credit escrows in the last hour, each closed by a transaction the orchestrator pays`;
    const view = await registered.spend(owner.toLowerCase(), what, () => paid().register(req.body.escrowId, owner));
    void reply.status(201);
    return view;
  });
  app.get('/credits', { config: wallet, schema: { response: { 200: CreditView } } }, async (req) => paid().view(signerOf(req)));
  app.post('/credits/withdraw', { config: wallet, schema: { response: { 200: CreditView } } }, async (req) => paid().withdraw(signerOf(req)));
}
