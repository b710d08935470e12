// The model store's contracts (what `nbcli model` sends and reads): storing a
// whole-model checkpoint to publish it, from a job's checkpoint or an uploaded
// file, with the orchestrator's publish attestation in the answer; the stored
// models and their files. Routes in src/orchestrator/routes/models.ts,
// client in ./model-client.ts.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { GptConfig } from '../model/config.ts';
import { MlpConfig } from '../model/mlp.ts';
import { MAX_MODEL_REF_LENGTH } from '../model/model-ref.ts';
import { DeploymentView } from './deployments.ts';
import { JobId } from './jobs.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

export const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });
/** A uint256 in decimal (base units of NIM, seconds). */
export const Uint256 = Type.String({ pattern: '^(0|[1-9][0-9]{0,77})$' });
/** A model's name on the registry: letters, digits, `_ . -`, up to 64 (as a job's name). */
export const ModelName = Type.String({ minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9][A-Za-z0-9_.-]*$' });
/** Where the model's metadata is: printable ASCII without spaces, up to 512 characters. */
export const MetadataUri = Type.String({ minLength: 1, maxLength: 512, pattern: '^[!-~]+$' });

/** What the attestation will say besides the hash and the owner. */
const terms = {
  name: ModelName,
  /** NIM base units per 1,000 generated tokens (for a classifier: per 1,000 classifications, once inference serves them) */
  pricePer1kTokens: Uint256,
  /** default: this orchestrator's `GET /models/:sha256` */
  metadataURI: Type.Optional(MetadataUri),
};

/** Keeping a stored model paid: days, and the hash of the NIM transfer of the quote (GET /storage/quote) on a paid network. */
const keepTerms = {
  keepDays: Type.Optional(Type.Integer({ minimum: 1, maximum: 3650 })),
  payment: Type.Optional(Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' })),
};

/** `POST /models`: store a checkpoint of one of the signer's jobs (its last one unless `step`). */
export const StoreFromJobRequest = Type.Object({ job: JobId, step: Type.Optional(Count), ...terms, ...keepTerms }, { additionalProperties: false });
export type StoreFromJobRequest = Static<typeof StoreFromJobRequest>;

/**
 * How long `POST /models/uploads/:id/store` may take to answer: the store
 * checks every tensor of the file first (gigabytes, for a 1B model). The
 * client waits this long, and the server keeps that one socket open as long.
 */
export const STORE_ANSWER_MS = 30 * 60_000;

/** `POST /models/file?…`: the query of an upload (the body is the safetensors file); `keepDays` (+ `payment`) stores it paid, past the free allowance. */
export const StoreFileQuery = Type.Object({ ...terms, ...keepTerms }, { additionalProperties: false });
export type StoreFileQuery = Static<typeof StoreFileQuery>;

/** `POST /models/uploads`: open an upload of a large model file (src/orchestrator/models/model-uploads.ts). */
export const CreateUploadRequest = Type.Object({ bytes: Type.Integer({ minimum: 1, maximum: 64 * 2 ** 30 }), sha256: Sha256 }, { additionalProperties: false });
export type CreateUploadRequest = Static<typeof CreateUploadRequest>;

/** An open upload: how far it is. */
export const UploadView = Type.Object({
  id: Type.String({ pattern: '^[0-9a-f]{32}$' }),
  bytes: Count,
  received: Count,
  sha256: Sha256,
  /** the most bytes one chunk (PUT /models/uploads/:id?offset=N) may carry */
  chunkBytes: Count,
});
export type UploadView = Static<typeof UploadView>;

/** `PUT /models/uploads/:id?offset=N`: where the chunk goes (the upload's `received`). */
export const UploadChunkQuery = Type.Object({ offset: Count }, { additionalProperties: false });

/** What a stored model is. */
export const ModelKind = Type.Union([Type.Literal('gpt'), Type.Literal('mlp')]);
export type ModelKind = Static<typeof ModelKind>;

export const StoredModelView = Type.Object({
  /** of the file's bytes: its id in the store and its hash on the registry */
  sha256: Sha256,
  /** who stored it first: the only address the orchestrator attests for */
  owner: Address,
  name: ModelName,
  bytes: Count,
  /**
   * 'gpt' (a byte-level GPT: generates text) or 'mlp' (an MLP classifier:
   * classifies, never generates); what deploys a model for generation
   * refuses an 'mlp'
   */
  kind: ModelKind,
  /** its model reference: `gpt-micro`, `gpt:v256.t32.c32.l2.h4.r4`, `mlp:4096-64-2` (src/model/model-ref.ts) */
  model: Type.String({ minLength: 1, maxLength: MAX_MODEL_REF_LENGTH }),
  /** the config of its kind: a GPT's sizes, or an MLP's {inputs, hidden, classes} */
  config: Type.Union([GptConfig, MlpConfig]),
  /** the job whose checkpoint it is (null: uploaded) */
  jobId: Nullable(JobId),
  /** the training step its checkpoint records */
  step: Count,
  createdAt: Ms,
  /** when the store collects it unless kept longer (nbcli model keep) or published (null: published, kept); absent where not said */
  expiresAt: Type.Optional(Nullable(Ms)),
  /** its newest deployment (docs/inference.md, "Deploy"): stages, miners, status; null: never deployed; absent where not asked */
  deployment: Type.Optional(Nullable(DeploymentView)),
});
export type StoredModelView = Static<typeof StoredModelView>;
export const StoredModelList = Type.Array(StoredModelView);

/** `GET /storage/quote?bytes=&days=`: what keeping that many bytes that long costs, and how full the store is. */
export const StorageQuoteQuery = Type.Object({ bytes: Type.Integer({ minimum: 1, maximum: 2 ** 40 }), days: Type.Integer({ minimum: 1, maximum: 3650 }) }, { additionalProperties: false });
const Bytes = Type.Integer({ minimum: 0 });
export const StorageQuoteView = Type.Object({
  bytes: Bytes,
  days: Type.Integer({ minimum: 1 }),
  gbDays: Type.Number({ minimum: 0 }),
  /** wei of NIM (0 on an unpaid network) */
  price: Uint256,
  nimPerGbDay: Type.Number({ minimum: 0 }),
  /** where a payment goes (null: an unpaid network) */
  payee: Nullable(Address),
  store: Type.Object({ limit: Bytes, used: Bytes }),
  free: Type.Object({ limit: Bytes, used: Bytes }),
  disk: Type.Object({ free: Nullable(Bytes), reserve: Bytes }),
  retentionMs: Bytes,
});
export type StorageQuoteView = Static<typeof StorageQuoteView>;

/** `POST /models/:sha256/keep`: keep a stored model `days` more, paid by the NIM transfer `payment` on a paid network. */
export const KeepModelRequest = Type.Object({ days: Type.Integer({ minimum: 1, maximum: 3650 }), payment: Type.Optional(Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' })) }, { additionalProperties: false });
export type KeepModelRequest = Static<typeof KeepModelRequest>;

/** The orchestrator's EIP-712 publish attestation (ModelRegistry's PublishAttestation) and where it holds. */
export const AttestationView = Type.Object({
  chainId: Count,
  registry: Address,
  /** the ORCHESTRATOR_ROLE account that signed */
  signer: Address,
  checkpointSha256: Type.String({ pattern: '^0x[0-9a-f]{64}$' }),
  owner: Address,
  name: ModelName,
  metadataURI: MetadataUri,
  pricePer1kTokens: Uint256,
  /** unix seconds (chain time), inclusive */
  deadline: Uint256,
  signature: Type.String({ pattern: '^0x[0-9a-fA-F]{130}$' }),
});
export type AttestationView = Static<typeof AttestationView>;

/** What storing answers: the model as stored, and the attestation that lets its owner publish it. */
export const PublishTicket = Type.Object({ model: StoredModelView, attestation: AttestationView });
export type PublishTicket = Static<typeof PublishTicket>;
