// The simulation's state: miners, stages, microbatches, the event queue and
// the counters the report is made of. The rules that change it are in
// flow.ts (microbatches) and control.ts (churn, replanning, merges).
import type { Plan } from '../planner/types.ts';
import { EventQueue } from './event-queue.ts';
import { WorkLedger } from './earnings.ts';
import { drawMiner } from './hardware.ts';
import { HostCores } from './host.ts';
import { Rng } from './rng.ts';
import { Timeline } from './timeline.ts';
import type { SimEvent, SimMicrobatch, SimMiner, SimOptions } from './types.ts';

export class World {
  readonly rng: Rng;
  /** draws of a shared host's job jitter */
  private readonly jitterRng: Rng;
  /** draws of merge rounds' clocks (the replicas' heartbeat phases, the opening tick) */
  readonly mergeRng: Rng;
  readonly events = new EventQueue<SimEvent>();
  readonly miners: SimMiner[] = [];
  readonly byId = new Map<string, number>();
  readonly microbatches: SimMicrobatch[] = [];
  /** microbatches waiting to be issued again, oldest first */
  readonly pending: number[] = [];
  /** microbatches issued and not done */
  readonly issued = new Set<number>();
  /** microbatches in flight per stage-0 replica */
  readonly issuedTo = new Map<number, number>();
  /** replicas per stage, by miner index */
  members: Set<number>[] = [];
  /** the same replicas as arrays, and the largest GFLOP/s among them: bounds of the next-hop draw (flow.ts drawNextHop) */
  memberLists: { list: number[]; maxGflops: number }[] = [];
  plan: Plan | null = null;
  readonly timeline: Timeline;
  readonly ledger: WorkLedger;
  /** the cores a local network's processes share (SimOptions.host), or null */
  readonly host: HostCores | null;
  now = 0;
  readonly horizonMs: number;
  /** tokens of one microbatch: batchSize × context */
  readonly tokensPerMicrobatch: number;
  /** FLOPs per token of each stage, forward and backward */
  flops: { forward: number; backward: number }[] = [];
  /** bytes of one activation (or gradient) frame */
  activationBytes = 0;
  aliveCount = 0;
  private aliveSince = 0;
  /** merges: a merge is due (stop issuing) / running */
  draining = false;
  merging = false;
  innerSteps = 0;
  replanScheduled = false;
  stalled: string | null = null;
  readonly counters = {
    done: 0,
    reissued: 0,
    droppedUnits: 0,
    byDeadline: 0,
    byChurn: 0,
    noPeer: 0,
    wastedComputeMs: 0,
    activationBytes: 0,
    mergeBytes: 0,
    mergeRounds: 0,
    mergeMs: [] as number[],
    mergeBytesPerReplica: [] as number[],
    left: 0,
    joined: 0,
    replans: 0,
    moves: 0,
    fullReplans: 0,
    events: 0,
  };

  constructor(readonly options: SimOptions) {
    this.rng = new Rng(options.seed);
    this.horizonMs = options.hours * 3_600_000;
    this.timeline = new Timeline(this.horizonMs, options.samples);
    this.ledger = new WorkLedger(options.epochMs);
    this.host = options.host ? new HostCores(options.host.cores, options.host.crowdedRate) : null;
    // its own stream, so that jitter leaves every other draw as it was
    this.jitterRng = new Rng((options.seed ^ 0x5bd1e995) >>> 0);
    this.mergeRng = new Rng((options.seed ^ 0x27d4eb2f) >>> 0);
    this.tokensPerMicrobatch = options.batchSize * options.config.contextLength;
  }

  schedule(at: number, event: SimEvent): void {
    this.events.push(at, event);
  }

  /** Draws a new miner from the table; it is alive from now. */
  addMiner(): SimMiner {
    const index = this.miners.length;
    const m: SimMiner = {
      ...drawMiner(this.options.hardware, this.rng, index),
      index,
      alive: true,
      gone: false,
      stage: -1,
      readyAt: Infinity,
      queue: [],
      lastWasBackward: false,
      busyUntil: -1,
      busyFrom: 0,
      workUntil: 0,
      job: null,
      unreported: [],
      beatDue: false,
      beatCpuMs: 0,
      beatSentAt: 0,
      replyDue: false,
      askedSlots: 0,
      inbox: [],
      accepts: [],
      receiptsDue: [],
      held: new Set(),
      upFree: 0,
      downFree: 0,
      issueScheduled: false,
      joinedAt: this.now,
      leftAt: null,
      busyMs: 0,
    };
    this.miners.push(m);
    this.byId.set(m.id, index);
    this.setAlive(this.aliveCount + 1);
    return m;
  }

  /** The number of alive miners changes now. */
  setAlive(count: number): void {
    this.timeline.addAlive(this.aliveSince, this.now, this.aliveCount);
    this.aliveSince = this.now;
    this.aliveCount = count;
  }

  /** Closes the alive-time integral at the horizon. */
  finish(): void {
    this.now = this.horizonMs;
    this.setAlive(this.aliveCount);
  }

  get stageCount(): number {
    return this.members.length;
  }

  /** Whether a stage has a replica the orchestrator routes to: on the stage, not noticed gone, done downloading (asked at every stage-0 heartbeat). */
  hasRoutable(stage: number): boolean {
    for (const i of this.members[stage] ?? []) {
      const m = this.miners[i];
      if (!m.gone && m.readyAt <= this.now) return true;
    }
    return false;
  }

  /** The next heartbeat of a miner strictly after now (each miner has its own phase). */
  nextHeartbeat(m: SimMiner): number {
    return this.heartbeatAfter(m, this.now);
  }

  /** A miner's first heartbeat strictly after time t. */
  heartbeatAfter(m: SimMiner, t: number): number {
    const hb = this.options.heartbeatMs;
    const phase = (m.index * 97) % hb;
    return Math.floor((t - phase) / hb + 1) * hb + phase;
  }

  /** A job's compute time on miner m, ms: measured job times when given (SimOptions.jobTimes), else FLOPs ÷ GFLOP/s. */
  jobMs(m: SimMiner, kind: 'forward' | 'backward' | 'both'): number {
    const measured = this.options.jobTimes;
    if (measured && measured.stages.length === this.stageCount) {
      const t = measured.stages[m.stage];
      const ms = kind === 'forward' ? t.forwardMs : kind === 'backward' ? t.backwardMs : t.forwardMs + t.backwardMs;
      // on a shared host every miner works at the host's core speed, which the job times measured
      return this.host ? ms : (ms * measured.referenceGflops) / m.gflops;
    }
    const f = this.flops[m.stage];
    return this.computeMs(m, kind === 'forward' ? f.forward : kind === 'backward' ? f.backward : f.forward + f.backward);
  }

  /**
   * A job's core time on miner m: its compute, plus its share of the stage's
   * hop overhead on a shared host (half to each of a forward and a
   * backward), and the CPU of the heartbeats m sent since its last job began
   * (its one thread runs them first).
   */
  jobCoreMs(m: SimMiner, kind: 'forward' | 'backward' | 'both'): number {
    const ms = this.jobMs(m, kind);
    if (!this.options.host) return ms;
    const hop = this.options.host.hopOverheadMs[m.stage] ?? 0;
    const cv = this.options.host.jobJitter ?? 0;
    // a job's time varies around its mean (the machine's other work, the garbage collector): lognormal with that spread
    const jitter = cv > 0 ? Math.exp(Math.sqrt(Math.log(1 + cv * cv)) * this.jitterRng.normal() - Math.log(1 + cv * cv) / 2) : 1;
    const beats = m.beatCpuMs;
    m.beatCpuMs = 0;
    return (ms + (kind === 'both' ? hop : hop / 2)) * jitter + beats;
  }

  /** Schedules the shared host's next job end (nothing without a host, or with nothing running). */
  scheduleHost(): void {
    if (!this.host) return;
    const at = this.host.nextEnd(this.now);
    if (at !== Infinity) this.schedule(Math.max(at, this.now), { type: 'host', version: this.host.version });
  }

  /** Compute time of `flopsPerToken` for one microbatch on miner m, ms. */
  computeMs(m: SimMiner, flopsPerToken: number): number {
    return (this.tokensPerMicrobatch * flopsPerToken) / (m.gflops * 1e9) * 1000;
  }
}
