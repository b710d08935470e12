// One typed schema for every JSON message between miners, the orchestrator and
// developers' tools. Both sides validate what they receive with `parse`.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { NimbleError } from './errors.ts';

const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Id = Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const BlobId = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Url = Type.String({ minLength: 8, maxLength: 256, pattern: '^https?://[^\\s/]+(/[^\\s]*)?$' });
const Count = Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 });
const Positive = Type.Integer({ minimum: 1, maximum: 2 ** 31 - 1 });
const Finite = Type.Number({ minimum: -1e30, maximum: 1e30 });

/** How activations and gradients travel between stages. */
export const ActivationCodec = Type.Union([Type.Literal('f32'), Type.Literal('f16'), Type.Literal('int8-row')]);
export type ActivationCodec = Static<typeof ActivationCodec>;

/** How a partition's replicas are merged. */
export const Aggregator = Type.Union([Type.Literal('mean'), Type.Literal('trimmed-mean'), Type.Literal('median')]);
export type Aggregator = Static<typeof Aggregator>;

export const Hardware = Type.Object({
  gflops: Type.Number({ exclusiveMinimum: 0, maximum: 1e7 }),
  threads: Type.Integer({ minimum: 1, maximum: 4096 }),
  memoryBytes: Type.Integer({ minimum: 1, maximum: 2 ** 53 - 1 }),
});
export type Hardware = Static<typeof Hardware>;

export const JoinRequest = Type.Object({
  name: Type.String({ minLength: 1, maxLength: 64 }),
  url: Url,
  hardware: Hardware,
  bandwidthMbps: Type.Number({ minimum: 0, maximum: 1e7 }),
});
export type JoinRequest = Static<typeof JoinRequest>;

export const JoinReply = Type.Object({ minerId: Address, heartbeatMs: Positive });
export type JoinReply = Static<typeof JoinReply>;

/** What a miner did since its last heartbeat. */
export const WorkReport = Type.Object({
  runId: Id,
  microbatch: Positive,
  stage: Count,
  phase: Type.Union([Type.Literal('forward'), Type.Literal('backward'), Type.Literal('dropped')]),
  /** the miner the activation went to (forward) */
  next: Type.Optional(Address),
  /** the mean loss (last stage, forward) */
  loss: Type.Optional(Finite),
  bytesSent: Count,
  reason: Type.Optional(Type.String({ maxLength: 256 })),
  /** sha256 of the activation frame this forward sent / received: the miner's commitment for spot checks */
  outputSha: Type.Optional(Sha256),
  inputSha: Type.Optional(Sha256),
});
export type WorkReport = Static<typeof WorkReport>;

export const HeartbeatRequest = Type.Object({
  freeSlots: Count,
  queue: Count,
  /** the run and stage the miner holds, and the merge rounds it has applied */
  runId: Type.Optional(Id),
  stage: Type.Optional(Count),
  round: Type.Optional(Count),
  /** merge round whose pseudo-gradient the miner has uploaded in full */
  uploadedRound: Type.Optional(Count),
  reports: Type.Array(WorkReport, { maxItems: 4096 }),
  /** peer requests this miner refused since its last heartbeat, by verified sender */
  rejected: Type.Optional(Type.Array(Type.Object({ sender: Address, reason: Type.String({ maxLength: 256 }) }), { maxItems: 1024 })),
});
export type HeartbeatRequest = Static<typeof HeartbeatRequest>;

export const StageAssignment = Type.Object({
  runId: Id,
  stage: Count,
  stageCount: Positive,
  from: Count,
  to: Positive,
  model: Type.String({ maxLength: 64 }),
  data: Type.String({ maxLength: 1024 }),
  batchSize: Positive,
  seed: Count,
  /** merge rounds completed for this stage, and the state after the last */
  round: Count,
  stateBlob: Type.Union([BlobId, Type.Null()]),
  codec: ActivationCodec,
  lr: Type.Number({ exclusiveMinimum: 0, maximum: 1 }),
});
export type StageAssignment = Static<typeof StageAssignment>;

export const MicrobatchTask = Type.Object({ id: Positive, shard: Count, step: Count });
export type MicrobatchTask = Static<typeof MicrobatchTask>;

export const Peer = Type.Object({ id: Address, url: Url, weight: Type.Number({ minimum: 0, maximum: 1e9 }) });
export type Peer = Static<typeof Peer>;

export const Partition = Type.Object({ index: Count, start: Count, end: Count });
export type Partition = Static<typeof Partition>;

export const MergeInput = Type.Object({ minerId: Address, blob: BlobId, samples: Count });

export const MergeTask = Type.Object({
  round: Positive,
  partitions: Type.Array(Partition, { maxItems: 65536 }),
  /** upload your pseudo-gradient, one frame per partition */
  upload: Type.Boolean(),
  /** partitions this replica merges: each replica's uploaded slice and its sample count (the weight) */
  merge: Type.Array(Type.Object({ partition: Count, inputs: Type.Array(MergeInput, { maxItems: 4096 }) }), { maxItems: 65536 }),
  /** merged partitions to apply (all of them, once every partition is merged) */
  apply: Type.Union([Type.Array(Type.Object({ partition: Count, blob: BlobId }), { maxItems: 65536 }), Type.Null()]),
  /** upload the stage state after applying (one replica per stage) */
  saveState: Type.Boolean(),
  aggregator: Aggregator,
  outerLr: Type.Number({ exclusiveMinimum: 0, maximum: 10 }),
  outerMomentum: Type.Number({ minimum: 0, maximum: 1 }),
});
export type MergeTask = Static<typeof MergeTask>;

export const HeartbeatReply = Type.Object({
  assignment: Type.Union([StageAssignment, Type.Null()]),
  microbatches: Type.Array(MicrobatchTask, { maxItems: 1024 }),
  /** the miners of the next stage, to send activations to */
  nextStage: Type.Array(Peer, { maxItems: 4096 }),
  merge: Type.Union([MergeTask, Type.Null()]),
  /** microbatches the miner should abandon (re-issued elsewhere) */
  abandon: Type.Array(Positive, { maxItems: 4096 }),
  /** forwards reported in this heartbeat that the miner must prove (spot checks); the others it may forget */
  checks: Type.Array(Positive, { maxItems: 4096 }),
});
export type HeartbeatReply = Static<typeof HeartbeatReply>;

/** Metadata of a tensor frame sent between miners. */
export const ForwardMeta = Type.Object({
  runId: Id,
  microbatch: Positive,
  shard: Count,
  step: Count,
  /** the receiver's stage */
  stage: Count,
  /** the hops so far, stage 0 first, to send the gradient back along */
  route: Type.Array(Type.Object({ id: Address, url: Url }), { maxItems: 1024 }),
});
export type ForwardMeta = Static<typeof ForwardMeta>;

export const BackwardMeta = Type.Object({ runId: Id, microbatch: Positive, stage: Count });
export type BackwardMeta = Static<typeof BackwardMeta>;

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
