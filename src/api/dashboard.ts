// The dashboard's contracts (docs/dashboard.md): what `GET /events` streams
// (a server-sent event per section of the network's state that changed, and
// the new points of the loss curves), what `GET /runs/:id/loss` and
// `GET /jobs/:id/loss` answer (a curve recorded so far), whether the caller is
// logged in as the operator, and the operator's actions. Routes in
// src/orchestrator/routes/dashboard.ts; the page in web/.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { DeploymentView } from './deployments.ts';
import { JobView } from './jobs.ts';
import { StoredModelView } from './models.ts';
import { ActivationCodec } from '../protocol/messages.ts';
import { EpochList, MinerView, RunView, WorkKind } from './schemas.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });
const Nim = Type.String({ pattern: '^-?[0-9]+(\\.[0-9]+)?$' });

/** What a miner does now: holds a stage of a run, or of a deployed model. */
export const MinerRole = Type.Object({
  kind: Type.Union([Type.Literal('training'), Type.Literal('serving')]),
  /** the run's id, or the deployment's model name */
  of: Type.String(),
  stage: Count,
  stages: Count,
  /** its place among the stage's replicas (1-based) and how many there are */
  replica: Count,
  replicas: Count,
});
export type MinerRole = Static<typeof MinerRole>;

/** A miner as the Network page shows it: its view, what it does, its work and what it earned. */
export const DashboardMiner = Type.Object({
  ...MinerView.properties,
  roles: Type.Array(MinerRole),
  /** the work log summed per kind (forward, backward, merge, inference, dropped, invalid, failed_check) */
  units: Type.Record(WorkKind, Type.Number()),
  /** work done (forward, backward, merge and inference units) per minute over about the last minute; null until the orchestrator has watched for a while */
  workPerMinute: Nullable(Type.Number({ minimum: 0 })),
  /** what scored epochs gave it, in wei and NIM (exact) */
  earnedWei: Wei,
  earned: Nim,
  /**
   * its stake on the orchestrator's chain, in wei and NIM (exact), as read at
   * most every 30 s while it is alive (src/orchestrator/dashboard/stakes.ts);
   * null on an unpaid network or until it was first read
   */
  stake: Nullable(Type.Object({ stakedWei: Wei, staked: Nim, unstakingWei: Wei, unstaking: Nim })),
});
export type DashboardMiner = Static<typeof DashboardMiner>;

/**
 * What crossed the boundary between stage `from` and stage `from + 1` of a
 * run (src/orchestrator/dashboard/traffic.ts): no byte counter is kept per
 * hop, so it is computed: the microbatches that crossed it, from the work
 * log (forward units of stage `from`: activations sent forward; backward
 * units of stage `from + 1`: gradients sent back; both are credited when a
 * microbatch completes), times the payload bytes of one microbatch's frame
 * at the run's codec. Frame headers, and attempts that did not complete, are
 * not counted.
 */
export const BoundaryTraffic = Type.Object({
  from: Count,
  forwardMicrobatches: Count,
  backwardMicrobatches: Count,
  forwardBytes: Count,
  backwardBytes: Count,
  /** bytes per second each way over about the last minute; null until the orchestrator has watched for a few seconds */
  forwardBytesPerSecond: Nullable(Type.Number({ minimum: 0 })),
  backwardBytesPerSecond: Nullable(Type.Number({ minimum: 0 })),
});
export type BoundaryTraffic = Static<typeof BoundaryTraffic>;

/** The traffic between a run's stages: its codec, the payload of one microbatch's activation (or gradient) frame, and each boundary. */
export const RunTraffic = Type.Object({
  codec: ActivationCodec,
  /** [rows, width] of an activation crossing a boundary (batch × context, d_model for a GPT) */
  shape: Type.Tuple([Count, Count]),
  frameBytes: Count,
  boundaries: Type.Array(BoundaryTraffic),
});
export type RunTraffic = Static<typeof RunTraffic>;

/** A run as the dashboard shows it: its view and, while it is under way, the traffic between its stages (null otherwise, or for a model that is not cut). */
export const DashboardRun = Type.Object({
  ...RunView.properties,
  traffic: Nullable(RunTraffic),
});
export type DashboardRun = Static<typeof DashboardRun>;

/** A stored model's listing on the chain's ModelRegistry, as last read (the Models page). */
export const ModelListing = Type.Union([
  Type.Object({ published: Type.Literal(false) }),
  Type.Object({
    published: Type.Literal(true),
    /** its id on the registry */
    modelId: Type.String({ pattern: '^[0-9]{1,78}$' }),
    /** what a caller pays per 1,000 tokens: wei, and exact NIM */
    priceWei: Type.String({ pattern: '^[0-9]{1,78}$' }),
    price: Type.String(),
    /** the registry's deployed flag */
    deployed: Type.Boolean(),
  }),
]);
export type ModelListing = Static<typeof ModelListing>;

/** A stored model as the Models page shows it: its deployment, and its registry listing (null: an unpaid network, or not read yet). */
export const DashboardModel = Type.Object({
  ...StoredModelView.properties,
  listing: Nullable(ModelListing),
});
export type DashboardModel = Static<typeof DashboardModel>;

/** One point of a loss curve: [step, train loss, tokens/s, unix ms]. */
export const LossPoint = Type.Tuple([Count, Type.Number(), Type.Number({ minimum: 0 }), Ms]);
export type LossPoint = Static<typeof LossPoint>;

/** A curve's key: `run:<id>` or `job:<id>`. */
export const SeriesKey = Type.String({ pattern: '^(run|job):[A-Za-z0-9_.:-]{1,128}$' });

/** A run's or job's curve as recorded by this orchestrator since it started, and the statuses it was seen in. */
export const LossHistory = Type.Object({
  key: SeriesKey,
  points: Type.Array(LossPoint),
  statuses: Type.Array(Type.Object({ at: Ms, status: Type.String() })),
});
export type LossHistory = Static<typeof LossHistory>;

/** `event: loss`: points recorded since the last one, per curve. */
export const LossEvent = Type.Object({ series: Type.Array(Type.Object({ key: SeriesKey, points: Type.Array(LossPoint) })) });
export type LossEvent = Static<typeof LossEvent>;

/** The sections `GET /events` streams, each sent whole when it changed (at most once a second), and the event each is sent as. */
export const DashboardSections = {
  miners: Type.Array(DashboardMiner),
  /** the runs not ended and the newest ended ones */
  runs: Type.Array(DashboardRun),
  jobs: Type.Array(JobView),
  epochs: EpochList,
  models: Type.Array(DashboardModel),
  deployments: Type.Array(DeploymentView),
};
export type DashboardSectionName = keyof typeof DashboardSections;
export type DashboardSection<K extends DashboardSectionName> = Static<(typeof DashboardSections)[K]>;
export const SECTION_NAMES = Object.keys(DashboardSections) as DashboardSectionName[];

/** `event: hello`: sent first on every stream. */
export const HelloEvent = Type.Object({ at: Ms, operator: Type.Boolean(), paid: Type.Boolean() });
export type HelloEvent = Static<typeof HelloEvent>;

/** `GET /session`: whether the caller's cookie makes it the operator. */
export const SessionView = Type.Object({
  operator: Type.Boolean(),
  paid: Type.Boolean(),
  /** who owns the jobs the operator submits from the page (the zero address on an unpaid network) */
  operatorAddress: Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' }),
});
export type SessionView = Static<typeof SessionView>;

/** What an operator's cancel answers: what was cancelled, and its status after. */
export const CancelAnswer = Type.Object({ kind: Type.Union([Type.Literal('run'), Type.Literal('job')]), id: Type.String(), status: Type.String(), message: Nullable(Type.String()) });
export type CancelAnswer = Static<typeof CancelAnswer>;

/** What the operator's upgrade of a job did: the job's status, the group it moves to, and its message (what happens now). */
export const UpgradeAnswer = Type.Object({ id: Type.String(), status: Type.String(), stages: Type.Integer({ minimum: 1 }), replicas: Type.Integer({ minimum: 1 }), message: Nullable(Type.String()) });
export type UpgradeAnswer = Static<typeof UpgradeAnswer>;

/** A wallet of the data dir as the Wallets page shows it: its balances on the orchestrator's chain (null: unpaid network, or not read). */
export const WalletRow = Type.Object({
  name: Type.String(),
  address: Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' }),
  /** NIM, exact decimal strings */
  balance: Nullable(Type.Object({ free: Type.String(), staked: Type.String(), unstaking: Type.String(), rewardsTotal: Type.String() })),
  /** why the balance could not be read */
  error: Nullable(Type.String()),
});
export type WalletRow = Static<typeof WalletRow>;

/** `GET /wallets`: the wallets of the orchestrator's data dir (read-only: names, addresses, balances; never a key). */
export const WalletsView = Type.Object({
  /** the folder they are read from (null: this orchestrator was given none) */
  dir: Nullable(Type.String()),
  /** the chain the balances are read on (null: the network is unpaid) */
  chainId: Nullable(Type.Integer({ minimum: 0 })),
  wallets: Type.Array(WalletRow),
});
export type WalletsView = Static<typeof WalletsView>;
