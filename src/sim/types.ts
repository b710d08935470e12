// The simulator's shapes: its options, the miners and microbatches it keeps,
// its events, and the report it returns.
import type { GptConfig } from '../model/config.ts';
import type { ActivationCodec } from '../protocol/messages.ts';
import type { DrawnMiner, HardwareTable } from './hardware.ts';
import type { SharedHost } from './host.ts';
import type { MemoryModelName } from './memory-models.ts';
import type { MergeWork } from './merge-time.ts';
import type { TimeSeries } from './timeline.ts';

/** The next-hop rules the simulator knows (SimOptions.route). */
export const ROUTE_RULES = ['weighted', 'two-choices'] as const;
export type RouteRule = (typeof ROUTE_RULES)[number];

export interface SimOptions {
  /** the model's name (for the report) and config */
  modelName: string;
  config: GptConfig;
  miners: number;
  hardware: HardwareTable;
  /** simulated hours */
  hours: number;
  /** multiplier of the table's leave rates (0: nobody leaves) */
  churn: number;
  seed: number;
  /** sequences per microbatch (the orchestrator's default is 12) */
  batchSize: number;
  /** activation slots per miner (COORDINATOR_DEFAULTS.slots) */
  slots: number;
  /** inner steps per replica between merges (DEFAULT_MERGE_EVERY) */
  mergeEvery: number;
  /** a microbatch not done this long after issue is issued again (COORDINATOR_DEFAULTS.microbatchDeadlineMs) */
  deadlineMs: number;
  /** miners' heartbeat period: stage-0 replicas get microbatches on heartbeats */
  heartbeatMs: number;
  /** the orchestrator's clock: merge rounds open and move on at its ticks (src/orchestrator/server.ts, 200 ms) */
  tickMs: number;
  /**
   * Measured job times (src/sim/calibrate.ts measureEngine) instead of
   * FLOPs ÷ GFLOP/s: per stage, a forward and a backward job's wall ms on a
   * core that measured `referenceGflops` the way a miner does at join; a
   * miner reporting g GFLOP/s takes ms × referenceGflops ÷ g (the last stage:
   * forward + backward as one job). Ignored unless there is one entry per stage.
   */
  jobTimes?: JobTimes;
  /**
   * A local network on one machine (./host.ts): every miner's jobs and the
   * orchestrator's work share the host's cores (processor sharing), each job
   * costs the stage's hop overhead on top, and measured job times are the
   * host's core speed for every miner (its reported GFLOP/s then steer only
   * the planner and routing). Undefined: each miner is a machine of its own.
   */
  host?: SharedHost;
  /** a miner silent this long is noticed gone */
  minerTimeoutMs: number;
  /** activation and gradient codec */
  codec: ActivationCodec;
  /** what-if: the codec's payload divided by this much more (1: the real frames) */
  activationRatio: number;
  /** how a sender picks the next hop: 'weighted' (the network's rule, peerWeight), or what-if 'two-choices' (two weighted draws, the one with the shorter queue for its speed) */
  route: RouteRule;
  /** merge frames' bytes per parameter; undefined = the real int8-block frames (≈1.02) */
  mergeBytesPerParam?: number;
  /** a merge round's compute per value, the replicas' and the orchestrator's (./merge-time.ts); undefined = not modelled */
  mergeWork?: MergeWork;
  /** what a miner keeps per parameter and activation (./memory-models.ts; default the engine's) */
  memoryModel: MemoryModelName;
  /** number of stages; undefined = the planner chooses */
  stages?: number;
  /** mean time before a departed miner's place is taken by a new one, ms */
  rejoinMs: number;
  /** an epoch's length, ms (rewards are split per epoch) */
  epochMs: number;
  /** NIM (wei) split per epoch */
  emission: bigint;
  /** points of the time series */
  samples: number;
  /** give up after this many events (a guard against runs that would take hours) */
  maxEvents: number;
}

/** Measured job times of each stage (SimOptions.jobTimes). */
export interface JobTimes {
  referenceGflops: number;
  stages: { forwardMs: number; backwardMs: number }[];
  /** how much a job's time varies from one job to the next: the coefficient of variation around each job's median (absent: not measured) */
  jitter?: number;
}

/** A miner in the simulation: what it is, where it is, what it does. */
export interface SimMiner extends DrawnMiner {
  /** index in the simulation's miner list */
  index: number;
  alive: boolean;
  /** noticed gone by the orchestrator (it routes nothing to it any more) */
  gone: boolean;
  /** stage held, -1 = none */
  stage: number;
  /** when it has downloaded its stage (routable from then on) */
  readyAt: number;
  /** jobs waiting, in arrival order */
  queue: Job[];
  /** its last job started was a backward (the next is a forward if one can start: 1F1B) */
  lastWasBackward: boolean;
  /** in a job until then, its rest after the work included (-1: idle; Infinity: working on a shared host), since then */
  busyUntil: number;
  busyFrom: number;
  /** on a shared host (./beats.ts): its last hops done since its last heartbeat, and a heartbeat or a reply waiting for its job to end */
  unreported: { mb: number; attempt: number }[];
  beatDue: boolean;
  /** on a shared host: the CPU of its heartbeats since its last job began (SharedHost.minerMsPerHeartbeat), run on its thread before the next job */
  beatCpuMs: number;
  /** when its last heartbeat request went out (host mode: the next is due heartbeatMs after it) */
  beatSentAt: number;
  replyDue: boolean;
  /** on a shared host: the free slots its last heartbeat reported, and what the reply to it gives */
  askedSlots: number;
  inbox: Job[];
  /** on a shared host: gradient frames it took in while its job ran, answered (with receipts) when the job is done */
  accepts: { from: number; mb: number; attempt: number }[];
  /** on a shared host: receipts that came while its job ran (their reports are noted when the job ends, before a heartbeat that came due) */
  receiptsDue: { mb: number; attempt: number }[];
  /** the job it is in (null: idle) */
  job: Job | null;
  /** its current job's work (not its rest) ends then (Infinity: not known yet, on a shared host) */
  workUntil: number;
  /** microbatches holding one of its activation slots */
  held: Set<number>;
  /** its upload and download links are busy until then */
  upFree: number;
  downFree: number;
  /** an issue check is scheduled (stage 0) */
  issueScheduled: boolean;
  /** when it joined */
  joinedAt: number;
  leftAt: number | null;
  /** compute time spent, ms */
  busyMs: number;
}

export type JobKind = 'start' | 'forward' | 'backward';

export interface Job {
  kind: JobKind;
  mb: number;
  attempt: number;
}

/** A microbatch and its current attempt. */
export interface SimMicrobatch {
  id: number;
  attempt: number;
  status: 'pending' | 'issued' | 'done';
  /** the replica per stage it went through (this attempt) */
  path: number[];
  /** the miner that must do its next hop (charged if it stalls there) */
  holder: number;
  /** the lowest stage whose backward is done (stageCount: none yet) */
  backwardFrom: number;
  /** per stage: when its miner's last hop of this attempt ended (its report rides that miner's next heartbeat) */
  hopDoneAt: number[];
  /** on a shared host: stages whose last hop of this attempt the orchestrator has been told of */
  reportedHops: number;
}

export type SimEvent =
  | { type: 'computed'; miner: number; job: Job }
  | { type: 'arrive'; miner: number; job: Job; from: number }
  | { type: 'issue'; miner: number }
  | { type: 'deadline'; mb: number; attempt: number }
  | { type: 'leave'; miner: number }
  | { type: 'noticed'; miner: number }
  | { type: 'join' }
  | { type: 'ready'; miner: number }
  | { type: 'replan' }
  | { type: 'merged' }
  | { type: 'host'; version: number }
  | { type: 'reported'; mb: number; attempt: number }
  | { type: 'beat'; miner: number }
  | { type: 'reply'; miner: number };

/** A stage as the report shows it. */
export interface StageReport {
  range: { from: number; to: number };
  params: number;
  /** bytes a replica needs (weights, gradients, optimizer state, activations) */
  memoryBytes: number;
  /** replicas at the start and at the end */
  replicas: number;
  replicasAtEnd: number;
  plannedTokensPerS: number;
}

export interface ClassReport {
  hardware: string;
  /** miners of this class drawn over the run (joins included) */
  miners: number;
  /** of them, holding a stage at the end */
  assignedAtEnd: number;
  /** busy compute time over alive time */
  utilization: number;
  /** NIM earned by the class over the run */
  earnedNim: number;
  /** per miner per hour alive */
  nimPerMinerHour: number;
}

export interface SimReport {
  model: string;
  params: number;
  miners: number;
  hours: number;
  seed: number;
  batchSize: number;
  /** activation slots per miner */
  slots: number;
  codec: ActivationCodec;
  /** the what-if compression beyond the codec (1: none) */
  activationRatio: number;
  /** the next-hop rule (SimOptions.route) */
  route: RouteRule;
  /** what a miner keeps per parameter and activation (./memory-models.ts) */
  memoryModel: MemoryModelName;
  mergeEvery: number;
  stages: StageReport[];
  /** memory a replica needs, the largest stage */
  memoryPerMinerBytes: number;
  /** the planner's bottleneck (compute only, no network) */
  plannedTokensPerS: number;
  /** trained tokens over simulated time */
  tokensPerS: number;
  microbatchesDone: number;
  /** busy compute time over the alive time of every miner, and of the miners holding a stage */
  utilization: number;
  utilizationAssigned: number;
  /** activation and gradient bytes per trained token; merge bytes per trained token */
  bytesPerToken: { activations: number; merges: number; total: number };
  merges: { rounds: number; meanMs: number; maxMs: number; bytesPerReplicaPerRound: number };
  dropped: { units: number; reissued: number; byDeadline: number; byChurn: number; noPeer: number; wastedComputeMs: number };
  churn: { left: number; joined: number; replans: number; moves: number; fullReplans: number };
  classes: ClassReport[];
  /** per bucket of simulated time (./timeline.ts) */
  series: TimeSeries;
  events: number;
  /** why training stopped early, if it did */
  stalled: string | null;
}
