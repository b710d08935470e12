// One typed schema for every JSON message between miners, the orchestrator and
// developers' tools. Both sides validate what they receive with `parse`.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { NimbleError } from './errors.ts';
import { PUBLIC_KEY_PATTERN, SIGNATURE_PATTERN } from './session-key.ts';

const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Id = Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const BlobId = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Url = Type.String({ minLength: 8, maxLength: 256, pattern: '^https?://[^\\s/]+(/[^\\s]*)?$' });
const Count = Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 });
const Positive = Type.Integer({ minimum: 1, maximum: 2 ** 31 - 1 });
/** A stage index or count: a model is cut into at most 1024 stages. */
const StageIndex = Type.Integer({ minimum: 0, maximum: 1023 });
/** Microbatches in flight or queued at one miner. */
const SlotCount = Type.Integer({ minimum: 0, maximum: 4096 });
/** A name people read (dashboards, logs): no control characters. */
const Name = Type.String({ minLength: 1, maxLength: 64, pattern: '^[^\\x00-\\x1f\\x7f]+$' });
/** A mean cross-entropy in nats: a byte-level model starts near ln 256 ≈ 5.5. */
const Loss = Type.Number({ minimum: 0, maximum: 100 });
/** An Ed25519 public key or signature, base64url (src/protocol/session-key.ts). */
const PublicKey = Type.String({ pattern: PUBLIC_KEY_PATTERN });
const Signature = Type.String({ pattern: SIGNATURE_PATTERN });
/** A microbatch is issued again after a miner on its path failed; each issue is an attempt. */
const Attempt = Positive;

/** How activations and gradients travel between stages. */
export const ActivationCodec = Type.Union([Type.Literal('f32'), Type.Literal('f16'), Type.Literal('int8-row')]);
export type ActivationCodec = Static<typeof ActivationCodec>;

/** How a partition's replicas are merged. */
export const Aggregator = Type.Union([Type.Literal('mean'), Type.Literal('trimmed-mean'), Type.Literal('median')]);
export type Aggregator = Static<typeof Aggregator>;

/** What a miner measured: far above any machine today, far below what breaks arithmetic (1 PiB, 10 PFLOP/s, 1024 threads). */
export const Hardware = Type.Object({
  gflops: Type.Number({ exclusiveMinimum: 0, maximum: 1e7 }),
  threads: Type.Integer({ minimum: 1, maximum: 1024 }),
  memoryBytes: Type.Integer({ minimum: 1, maximum: 2 ** 50 }),
  /** where its GPT stages run (src/engine/engine.ts Backend); absent from miners before it: wasm */
  backend: Type.Optional(Type.Union([Type.Literal('wasm'), Type.Literal('webgpu')])),
  /** the GPU adapter's name, with webgpu: printable text */
  adapter: Type.Optional(Type.String({ minLength: 1, maxLength: 200, pattern: '^[\\x20-\\x7e]+$' })),
  /** the adapter is a software one (SwiftShader): right answers at CPU speed */
  softwareAdapter: Type.Optional(Type.Boolean()),
});
export type Hardware = Static<typeof Hardware>;

/** The network a miner talks to: the orchestrator's key (which names the signing domain) and its signature of the miner's challenge. */
export const NetworkInfo = Type.Object({ publicKey: PublicKey, signature: Signature });
export type NetworkInfo = Static<typeof NetworkInfo>;

/** What a miner offers to do (`nbcli miner start --serve`): serve deployed models, train, or both. */
export const ServeSetting = Type.Union([Type.Literal('inference'), Type.Literal('training'), Type.Literal('both')]);
export type ServeSetting = Static<typeof ServeSetting>;

/** Joining is signed with the wallet key; it binds `sessionKey`, which signs everything after. */
export const JoinRequest = Type.Object({
  name: Name,
  url: Url,
  hardware: Hardware,
  /** measured upload bandwidth: at most 1 Tbit/s */
  bandwidthMbps: Type.Number({ minimum: 0, maximum: 1e6 }),
  sessionKey: PublicKey,
  /** what the miner offers (absent: both) */
  serve: Type.Optional(ServeSetting),
});
export type JoinRequest = Static<typeof JoinRequest>;

export const JoinReply = Type.Object({ minerId: Address, heartbeatMs: Positive });
export type JoinReply = Static<typeof JoinReply>;

/**
 * What a miner did since its last heartbeat: its claim of one hop of a
 * microbatch's attempt. Claims are credited once the whole attempt is in and
 * agrees with itself (every hop's frames chain up, every hand-off receipted).
 */
export const WorkReport = Type.Object({
  runId: Id,
  microbatch: Positive,
  attempt: Attempt,
  stage: StageIndex,
  phase: Type.Union([Type.Literal('forward'), Type.Literal('backward'), Type.Literal('dropped')]),
  /** the miner the frame went to: the next stage's (forward) or the previous stage's (backward) */
  next: Type.Optional(Address),
  /** that miner's receipt of the frame sent (src/protocol/evidence.ts) */
  receipt: Type.Optional(Signature),
  /** the mean loss (last stage, forward) */
  loss: Type.Optional(Loss),
  bytesSent: Count,
  reason: Type.Optional(Type.String({ maxLength: 256 })),
  /** sha256 of the frame this hop sent / received (activations forward, gradients backward): its commitment */
  outputSha: Type.Optional(Sha256),
  inputSha: Type.Optional(Sha256),
});
export type WorkReport = Static<typeof WorkReport>;

/**
 * A miner's state of the deployment stage it was assigned (docs/inference.md,
 * "Deploy"): downloading and checking the weights, serving them (checked:
 * `sha256` is the file it loaded, `verifiedBy` what it was checked against),
 * or refused (`detail` says why: a file that does not match, a model the
 * registry does not hold, weights that do not load).
 */
export const DeploymentReport = Type.Object({
  deploymentId: Id,
  stage: StageIndex,
  state: Type.Union([Type.Literal('loading'), Type.Literal('serving'), Type.Literal('failed')]),
  sha256: Type.Optional(Sha256),
  /** 'chain': the file's sha256 is the one the ModelRegistry holds; 'sha256': an unpaid network, the orchestrator's sha256 only */
  verifiedBy: Type.Optional(Type.Union([Type.Literal('chain'), Type.Literal('sha256')])),
  detail: Type.Optional(Type.String({ maxLength: 512 })),
});
export type DeploymentReport = Static<typeof DeploymentReport>;

export const HeartbeatRequest = Type.Object({
  /** the deployment stage the miner was assigned, as it stands on the miner */
  deployment: Type.Optional(DeploymentReport),
  freeSlots: SlotCount,
  queue: Type.Integer({ minimum: 0, maximum: 65_536 }),
  /** the run and stage the miner holds, and the merge rounds it has applied */
  runId: Type.Optional(Id),
  stage: Type.Optional(StageIndex),
  round: Type.Optional(Count),
  /** merge round whose pseudo-gradient the miner has uploaded in full */
  uploadedRound: Type.Optional(Count),
  reports: Type.Array(WorkReport, { maxItems: 4096 }),
  /** the microbatches (and attempts) the miner holds: queued, or between forward and backward */
  held: Type.Optional(Type.Array(Type.Object({ microbatch: Positive, attempt: Attempt }), { maxItems: 4096 })),
});
export type HeartbeatRequest = Static<typeof HeartbeatRequest>;

export const StageAssignment = Type.Object({
  runId: Id,
  stage: StageIndex,
  stageCount: Type.Integer({ minimum: 1, maximum: 1024 }),
  from: Count,
  to: Positive,
  /** a model reference (src/model/model-ref.ts: MAX_MODEL_REF_LENGTH), parsed and validated by the miner */
  model: Type.String({ minLength: 1, maxLength: 160 }),
  data: Type.String({ maxLength: 1024 }),
  batchSize: Type.Integer({ minimum: 1, maximum: 4096 }),
  seed: Count,
  /** merge rounds completed for this stage, and the state after the last */
  round: Count,
  stateBlob: Type.Union([BlobId, Type.Null()]),
  /** before the first merge round: the whole-model checkpoint the stage's weights come from (null: the seeded init) */
  init: Type.Optional(Type.Union([BlobId, Type.Null()])),
  codec: ActivationCodec,
  lr: Type.Number({ minimum: 1e-8, maximum: 1 }),
});
export type StageAssignment = Static<typeof StageAssignment>;

/** A replica of a neighbouring stage: where to reach it, the key its requests and receipts are signed with, how much work to send it. */
export const Peer = Type.Object({ id: Address, url: Url, sessionKey: PublicKey, weight: Type.Number({ minimum: 0, maximum: 1e9 }) });
export type Peer = Static<typeof Peer>;

/**
 * A stage of a deployed model to serve: parts [from, to) of the published
 * model file `sha256` (`bytes` long, in the orchestrator's model store at
 * `GET /models/:sha256/file`), run by StageInference with room for
 * `maxSessions` sessions. The miner checks the file against `registry`, the
 * ModelRegistry entry on its own chain (null: an unpaid network without a
 * chain, checked against `sha256` only) before it serves anything.
 */
export const DeploymentAssignment = Type.Object({
  deploymentId: Id,
  sha256: Sha256,
  /** the file's size: an imported model is gigabytes (64 GiB at most, src/orchestrator/models/model-uploads.ts) */
  bytes: Type.Integer({ minimum: 1, maximum: 64 * 2 ** 30 }),
  /** a GPT's model reference (src/model/model-ref.ts), parsed and checked against the file by the miner */
  model: Type.String({ minLength: 1, maxLength: 160 }),
  stage: StageIndex,
  stageCount: Type.Integer({ minimum: 1, maximum: 1024 }),
  from: Count,
  to: Positive,
  maxSessions: Type.Integer({ minimum: 1, maximum: 4096 }),
  registry: Type.Union([Type.Object({ chainId: Positive, address: Address, modelId: Count }), Type.Null()]),
  /** the serving replicas of the stage before this one (empty on stage 0), as training's previousStage */
  previousStage: Type.Optional(Type.Array(Peer, { maxItems: 4096 })),
  /** the serving replicas of the stage after this one (empty on the last), as training's nextStage */
  nextStage: Type.Optional(Type.Array(Peer, { maxItems: 4096 })),
});
export type DeploymentAssignment = Static<typeof DeploymentAssignment>;

/** A microbatch issued to a stage-0 replica, with the orchestrator's ticket for it (src/protocol/evidence.ts). */
export const MicrobatchTask = Type.Object({ id: Positive, attempt: Attempt, shard: Count, step: Count, ticket: Signature });
export type MicrobatchTask = Static<typeof MicrobatchTask>;

export const Partition = Type.Object({ index: Count, start: Count, end: Count });
export type Partition = Static<typeof Partition>;

export const MergeInput = Type.Object({ minerId: Address, blob: BlobId, samples: Count });

export const MergeTask = Type.Object({
  round: Positive,
  partitions: Type.Array(Partition, { maxItems: 65536 }),
  /** upload your pseudo-gradient, one frame per partition */
  upload: Type.Boolean(),
  /** partitions this replica merges: each replica's uploaded slice and its credited inner steps (the weight), and the norm each slice is clipped to */
  merge: Type.Array(
    Type.Object({ partition: Count, inputs: Type.Array(MergeInput, { maxItems: 4096 }), maxNorm: Type.Union([Type.Number({ minimum: 0, maximum: 1e12 }), Type.Null()]) }),
    { maxItems: 65536 },
  ),
  /** merged partitions to apply (all of them, once every partition is merged) */
  apply: Type.Union([Type.Array(Type.Object({ partition: Count, blob: BlobId }), { maxItems: 65536 }), Type.Null()]),
  /** upload the stage state after applying: only a stage of one replica, which merges nothing (a merged round's state is written by the orchestrator) */
  saveState: Type.Boolean(),
  aggregator: Aggregator,
  /** trimmed-mean: the fraction dropped at each end */
  trim: Type.Number({ minimum: 0, maximum: 0.5 }),
  outerLr: Type.Number({ exclusiveMinimum: 0, maximum: 10 }),
  outerMomentum: Type.Number({ minimum: 0, maximum: 1 }),
});
export type MergeTask = Static<typeof MergeTask>;

export const HeartbeatReply = Type.Object({
  assignment: Type.Union([StageAssignment, Type.Null()]),
  /** the deployment stage to serve (null: none; absent from an orchestrator without deployments) */
  deployment: Type.Optional(Type.Union([DeploymentAssignment, Type.Null()])),
  microbatches: Type.Array(MicrobatchTask, { maxItems: 1024 }),
  /** the miners of the next stage, to send activations to and take gradients from */
  nextStage: Type.Array(Peer, { maxItems: 4096 }),
  /** the miners of the previous stage, to take activations from and send gradients to */
  previousStage: Type.Array(Peer, { maxItems: 4096 }),
  merge: Type.Union([MergeTask, Type.Null()]),
  /** microbatches the miner holds that it should let go (re-issued, or done without it) */
  abandon: Type.Array(Positive, { maxItems: 4096 }),
  /** every forward of the miner's that it must still prove (spot checks); reported forwards not here it may forget */
  checks: Type.Array(Positive, { maxItems: 4096 }),
});
export type HeartbeatReply = Static<typeof HeartbeatReply>;

/**
 * Metadata of an activation frame sent between miners. The gradient goes back
 * to whoever signed the request that carried it, at the URL the orchestrator
 * gave for that miner: never to an address the sender names.
 */
export const ForwardMeta = Type.Object({
  runId: Id,
  microbatch: Positive,
  attempt: Attempt,
  shard: Count,
  step: Count,
  /** the receiver's stage */
  stage: StageIndex,
  /** the orchestrator's ticket for (run, microbatch, attempt, shard, step) */
  ticket: Signature,
});
export type ForwardMeta = Static<typeof ForwardMeta>;

export const BackwardMeta = Type.Object({ runId: Id, microbatch: Positive, attempt: Attempt, stage: StageIndex });
export type BackwardMeta = Static<typeof BackwardMeta>;

/** A peer's answer to an activation or gradient it accepted: its receipt of the frame. */
export const PeerAccepted = Type.Object({ queued: Count, receipt: Signature });
export type PeerAccepted = Static<typeof PeerAccepted>;

const compiled = new WeakMap<TSchema, TypeCheck<TSchema>>();

/**
 * Validates `value` against `schema` and returns it typed, or throws a
 * NimbleError naming the first problem: 'invalid' (400) for what a peer sent,
 * `code` 'corrupt' (500) for what this process stored itself.
 */
export function parse<T extends TSchema>(schema: T, value: unknown, what = 'message', code: 'invalid' | 'corrupt' = 'invalid'): Static<T> {
  let check = compiled.get(schema) as TypeCheck<T> | undefined;
  if (!check) {
    check = TypeCompiler.Compile(schema);
    compiled.set(schema, check as unknown as TypeCheck<TSchema>);
  }
  if (check.Check(value)) return value;
  const first = check.Errors(value).First();
  const at = first?.path || '/';
  throw new NimbleError(code, `invalid ${what}: ${at} ${first?.message ?? 'does not match the schema'}`);
}

/** Parses JSON bytes then validates them. */
export function parseJson<T extends TSchema>(schema: T, bytes: Uint8Array | string, what = 'message', code: 'invalid' | 'corrupt' = 'invalid'): Static<T> {
  let value: unknown;
  try {
    value = JSON.parse(typeof bytes === 'string' ? bytes : new TextDecoder().decode(bytes));
  } catch {
    throw new NimbleError(code, `invalid ${what}: not JSON`);
  }
  return parse(schema, value, what, code);
}
