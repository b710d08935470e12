// The orchestrator's public API (what developers, the CLI and dashboards
// read and send), as TypeBox schemas: the server declares them on its routes
// and checks its answers against them; the client (./client.ts) validates
// what it receives with the same ones. Miners' messages are in
// src/protocol/messages.ts.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { DeploymentEntry } from '../chain/deploy.ts';
import { HashString } from '../chain/schemas.ts';
import { ActivationCodec, Aggregator } from '../protocol/messages.ts';
import { SIGNATURE_PATTERN } from '../protocol/session-key.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
/** wei amounts as decimal strings (exact), beside NIM as decimal strings */
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });
const Nim = Type.String({ pattern: '^-?[0-9]+(\\.[0-9]+)?$' });

/** What miners' work is counted in: work done (training, merging, serving), and penalties. */
export const WorkKind = Type.Union([
  Type.Literal('forward'),
  Type.Literal('backward'),
  Type.Literal('merge'),
  /** tokens run through a stage of a deployed model, in units of INFERENCE_TOKENS_PER_UNIT (src/orchestrator/serving/billing.ts) */
  Type.Literal('inference'),
  Type.Literal('dropped'),
  Type.Literal('invalid'),
  Type.Literal('failed_check'),
]);
export type WorkKind = Static<typeof WorkKind>;
export const WORK_KINDS: readonly WorkKind[] = ['forward', 'backward', 'merge', 'inference', 'dropped', 'invalid', 'failed_check'];

export const RunStatus = Type.Union([
  Type.Literal('waiting'),
  Type.Literal('started'),
  Type.Literal('executing'),
  Type.Literal('merging'),
  Type.Literal('completed'),
  Type.Literal('failed'),
  Type.Literal('cancelled'),
]);
export type RunStatus = Static<typeof RunStatus>;
/** Statuses a run does not leave. */
export const FINAL_RUN_STATUSES: readonly RunStatus[] = ['completed', 'failed', 'cancelled'];

export const StageMode = Type.Union([Type.Literal('training'), Type.Literal('merging')]);
export type StageMode = Static<typeof StageMode>;

export const MergePhase = Type.Union([Type.Literal('uploading'), Type.Literal('merging'), Type.Literal('applying'), Type.Literal('done')]);
export type MergePhase = Static<typeof MergePhase>;

// ---- requests ----------------------------------------------------------------

export const CreateRunRequest = Type.Object(
  {
    /** a model reference (src/model/model-ref.ts): `gpt-tiny`, `gpt:v256.t64.c128.l4.h4.r4`, `mlp:4096-64-2` */
    model: Type.String({ minLength: 1, maxLength: 160, pattern: '^[A-Za-z0-9_.:-]+$' }),
    data: Type.String({ minLength: 1, maxLength: 1024, pattern: '^[^\\x00-\\x1f\\x7f]+$' }),
    /** microbatches: 10 M of them is years of a small network's work */
    steps: Type.Integer({ minimum: 1, maximum: 10_000_000 }),
    stages: Type.Optional(Type.Integer({ minimum: 1, maximum: 1024 })),
    batchSize: Type.Optional(Type.Integer({ minimum: 1, maximum: 4096 })),
    mergeEvery: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
    seed: Type.Optional(Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 })),
    /** AdamW's learning rate: below 1e-8 nothing moves in float32 */
    lr: Type.Optional(Type.Number({ minimum: 1e-8, maximum: 1 })),
    codec: Type.Optional(ActivationCodec),
    aggregator: Type.Optional(Aggregator),
    minMiners: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000 })),
    outerLr: Type.Optional(Type.Number({ minimum: 1e-6, maximum: 10 })),
    outerMomentum: Type.Optional(Type.Number({ minimum: 0, maximum: 0.999 })),
  },
  { additionalProperties: false },
);
export type CreateRunRequest = Static<typeof CreateRunRequest>;

// ---- views ---------------------------------------------------------------------

export const MinerView = Type.Object({
  id: Address,
  name: Type.String(),
  url: Type.String(),
  gflops: Type.Number(),
  threads: Count,
  memoryBytes: Count,
  bandwidthMbps: Type.Number(),
  joinedAt: Ms,
  lastSeen: Ms,
  alive: Type.Boolean(),
  /** what it offers: serve deployed models (inference), training, or both */
  serve: Type.Optional(Type.Union([Type.Literal('inference'), Type.Literal('training'), Type.Literal('both')])),
  /** where its GPT stages run: wasm (the CPU; also every miner that joined without saying) or webgpu */
  backend: Type.Union([Type.Literal('wasm'), Type.Literal('webgpu')]),
  /** its GPU adapter's name as it reported it (printable text), or null */
  adapter: Nullable(Type.String({ minLength: 1, maxLength: 200 })),
  /** that adapter is a software one (SwiftShader): right answers at CPU speed */
  softwareAdapter: Type.Boolean(),
});
export type MinerView = Static<typeof MinerView>;

export const StageView = Type.Object({
  stage: Count,
  parts: Type.Tuple([Count, Count]),
  mode: StageMode,
  /** the phase of the merge round in progress, if any */
  mergePhase: Nullable(MergePhase),
  replicas: Type.Array(Type.Object({ id: Address, name: Type.String(), alive: Type.Boolean(), gflops: Type.Number() })),
  /** merge rounds completed */
  round: Count,
  /** microbatches trained since the last merge */
  innerSteps: Count,
  loss: Nullable(Type.Number()),
});
export type StageView = Static<typeof StageView>;

export const MinerChecks = Type.Object({ miner: Address, name: Nullable(Type.String()), passed: Count, failed: Count, open: Count });

export const RunView = Type.Object({
  id: Type.String(),
  /** the developer who created it (the address that signed the request) */
  owner: Type.Union([Address, Type.Null()]),
  model: Type.String(),
  data: Type.String(),
  status: RunStatus,
  steps: Count,
  microbatchesDone: Count,
  tokensDone: Count,
  tokensPerSecond: Type.Number({ minimum: 0 }),
  mergesDone: Count,
  bytesSent: Count,
  loss: Nullable(Type.Number()),
  batchSize: Count,
  mergeEvery: Count,
  stages: Type.Array(StageView),
  /** spot checks of this run's forwards, per miner */
  checks: Type.Array(MinerChecks),
  /** the plan's estimate of the slowest stage's tokens/s */
  bottleneckTokensPerS: Nullable(Type.Number()),
  /** why the run waits or stalls, or why it failed */
  message: Nullable(Type.String()),
  createdAt: Ms,
  startedAt: Nullable(Ms),
  finishedAt: Nullable(Ms),
});
export type RunView = Static<typeof RunView>;

/** The work log summed per miner and kind. */
export const WorkTotal = Type.Object({ miner: Address, kind: WorkKind, units: Type.Number() });
export type WorkTotal = Static<typeof WorkTotal>;

export const EpochStatus = Type.Union([Type.Literal('open'), Type.Literal('settling'), Type.Literal('settled')]);
export type EpochStatus = Static<typeof EpochStatus>;

export const EpochView = Type.Object({
  id: Count,
  status: EpochStatus,
  runId: Nullable(Type.String()),
  /** work_log ids (from, to] */
  workLog: Type.Tuple([Count, Nullable(Count)]),
  openedAt: Ms,
  closedAt: Nullable(Ms),
  /** NIM, decimal strings */
  emission: Nullable(Nim),
  remainder: Nullable(Nim),
  chainId: Nullable(Count),
  chainEpoch: Nullable(Wei),
  txHash: Nullable(Type.String()),
  settledAt: Nullable(Ms),
  error: Nullable(Type.String()),
  /** failed tries of its settlement, and when it is tried next (null: at the next pass): a failing one backs off, 1 s doubling to 5 min */
  attempts: Count,
  retryAt: Nullable(Ms),
  rewards: Type.Array(
    Type.Object({
      miner: Address,
      name: Nullable(Type.String()),
      score: Type.Number(),
      amount: Nim,
      amountWei: Wei,
      units: Type.Record(Type.String(), Type.Number()),
    }),
  ),
  /**
   * what callers' credit escrows pay for the inference charged in this epoch
   * (docs/inference.md, "Payment"), per payee and role: the miners' share and
   * the model owners' rest, credited as stake
   */
  inferencePayments: Type.Array(
    Type.Object({
      payee: Address,
      name: Nullable(Type.String()),
      role: Type.Union([Type.Literal('miner'), Type.Literal('owner')]),
      amount: Nim,
      amountWei: Wei,
      status: Type.Union([Type.Literal('pending'), Type.Literal('paid')]),
    }),
  ),
  /** stakes slashed for failed spot checks in this epoch (one per failed check) */
  slashes: Type.Array(
    Type.Object({
      miner: Address,
      /** the failed spot check (null: a per-epoch slash of an earlier version) */
      check: Nullable(Count),
      failed: Count,
      amount: Nullable(Nim),
      amountWei: Nullable(Wei),
      status: Type.Union([Type.Literal('pending'), Type.Literal('slashed'), Type.Literal('skipped')]),
      txHash: Nullable(Type.String()),
      reason: Type.String(),
      error: Nullable(Type.String()),
      /** failed tries, and when it is tried next (a failing slash backs off, never re-sent at every pass) */
      attempts: Count,
      retryAt: Nullable(Ms),
    }),
  ),
});
export type EpochView = Static<typeof EpochView>;

export const EpochList = Type.Object({
  /** whether this orchestrator pays miners on a chain */
  paid: Type.Boolean(),
  epochs: Type.Array(EpochView),
});
export type EpochList = Static<typeof EpochList>;

export const Health = Type.Object({ ok: Type.Literal(true) });

/**
 * The chain an orchestrator pays on (GET /chain), so that a command or a
 * miner acting for it uses that chain and no other (src/chain/identity.ts):
 * its identity (chain id, genesis hash, the hash of the block its contracts
 * were deployed in), the RPC URL it publishes (its local node's, on
 * 127.0.0.1 and so only reachable on its machine; on another chain only
 * what --public-chain-rpc names, null otherwise) and the contracts, as
 * deployment.json records them.
 */
export const ChainView = Type.Object({
  chainId: Type.Integer({ minimum: 1 }),
  rpcUrl: Nullable(Type.String({ minLength: 1, maxLength: 2048 })),
  /** the local anvil node of its data dir: its faucet mints test NIM, and gas is topped up there */
  local: Type.Boolean(),
  genesisHash: HashString,
  deployBlockHash: HashString,
  contracts: DeploymentEntry,
});
export type ChainView = Static<typeof ChainView>;

/** GET /chain?challenge=HEX: the chain (null: the network is unpaid), signed with the network's key for the challenge (null without one). */
export const ChainAnswer = Type.Object({
  chain: Nullable(ChainView),
  signature: Nullable(Type.String({ pattern: SIGNATURE_PATTERN })),
});
export type ChainAnswer = Static<typeof ChainAnswer>;
