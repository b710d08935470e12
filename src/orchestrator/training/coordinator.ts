// The orchestrator's logic, independent of HTTP: miners join and heartbeat
// (each heartbeat carries work reports and brings back the miner's
// instructions), and a clock that notices vanished miners and missed
// deadlines, starts waiting runs, drives merge rounds and completes runs.
// Runs are planned by RunPlanner, microbatches flow through MicrobatchFlow,
// merge rounds through MergeRounds, spot checks through SpotChecks; all of
// them keep their state in OrchestratorState, so a restarted orchestrator
// continues where the database stands.
import { FINAL_RUN_STATUSES, type CreateRunRequest } from '../../api/schemas.ts';
import { Engine } from '../../engine/engine.ts';
import { signTicket } from '../../protocol/evidence.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { HeartbeatReply, HeartbeatRequest, JoinReply, JoinRequest, Peer, StageAssignment } from '../../protocol/messages.ts';
import { domainOf } from '../../protocol/network.ts';
import { SessionKey } from '../../protocol/session-key.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import { CheckpointEvaluator } from '../jobs/checkpoint-eval.ts';
import { Deployments, type DeploymentOptions } from '../models/deployments.ts';
import { Collector, type GcOptions } from '../blobs/gc.ts';
import { BlobGuard } from '../blobs/blob-guard.ts';
import { peerWeight } from './issue-policy.ts';
import { MergeChecks } from './merge-checks.ts';
import { MergeRounds } from './merges.ts';
import { MergeUploads } from './merge-uploads.ts';
import { MicrobatchFlow } from './microbatches.ts';
import { Offences, type SlashingOptions } from '../rewards/offences.ts';
import { RunPlanner } from './run-planner.ts';
import { RunData } from './run-data.ts';
import type { OrchestratorIdentity } from '../identity.ts';
import { SpotChecks, type SpotCheckOptions } from './spot-checks.ts';
import { StageStates } from './stage-states.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MinerRecord } from '../state/miners.ts';
import type { RunRecord } from '../state/runs.ts';

export interface CoordinatorOptions {
  heartbeatMs: number;
  /** a miner silent this long is gone */
  minerTimeoutMs: number;
  /** a microbatch not finished this long after issue is re-issued */
  microbatchDeadlineMs: number;
  /** activation slots each miner keeps (microbatches in flight per miner) */
  slots: number;
  /** spot checks of forwards (rate, timeout) */
  spotChecks?: Partial<SpotCheckOptions>;
  /** what an offence costs in stake (enabled on a paid network) */
  slashing?: Partial<SlashingOptions>;
  now?: () => number;
  /** where the clock reports what went wrong (default: stderr) */
  log?: (line: string) => void;
  /** the network's key (default: a new one, for in-process use) */
  identity?: OrchestratorIdentity;
  /** what is collected when (src/orchestrator/blobs/gc.ts) */
  gc?: Partial<GcOptions>;
  /** deployed models' idle limit and sessions per stage (src/orchestrator/models/deployments.ts) */
  deployments?: Partial<DeploymentOptions>;
}

/** Session keys of a miner kept for checking receipts it signed before it restarted. */
const RECENT_SESSION_KEYS = 4;

export const COORDINATOR_DEFAULTS: CoordinatorOptions = {
  heartbeatMs: 250,
  minerTimeoutMs: 4000,
  microbatchDeadlineMs: 15000,
  slots: 3,
};

export class Coordinator {
  readonly merges: MergeRounds;
  readonly mergeUploads: MergeUploads;
  readonly checks: SpotChecks;
  /** held-out figures of the whole-model checkpoints jobs keep */
  readonly evaluator: CheckpointEvaluator;
  readonly microbatches: MicrobatchFlow;
  readonly planner: RunPlanner;
  /** where provably false work is charged (penalty units, slashes) */
  readonly offences: Offences;
  /** collects rows and blobs nobody needs any more */
  readonly gc: Collector;
  /** deployed models and the miners serving them */
  readonly deployments: Deployments;
  private readonly options: CoordinatorOptions;
  private readonly now: () => number;
  readonly log: (line: string) => void;
  readonly identity: OrchestratorIdentity;
  /** merged states of stages, for checking what miners send against them */
  readonly stageStates: StageStates;
  /** the engine the orchestrator verifies work (recomputation) and evaluates checkpoints with, never trains with; made on first use */
  private engine: Promise<Engine> | null = null;
  /** when the clock last tried to start the runs that wait */
  private waitingTriedAt = -Infinity;
  /** live queue lengths, from heartbeats (the router weighs replicas with them) */
  private readonly queues = new Map<string, number>();
  /** heartbeats taken since this process started (what the calibration bench divides the orchestrator's CPU by) */
  heartbeatsTaken = 0;
  readonly blobs: BlobGuard; // guarded: a collected blob put again is never lost
  /** the run/stage/round each miner's last heartbeat said it holds (loaded): only replicas at their stage's round are routed to */
  private readonly holding = new Map<string, string>();
  /** each joined miner's session keys, newest first: the current one (also in the miners table) and a few before it, for receipts it signed before restarting */
  private readonly sessionKeys = new Map<string, string[]>();

  constructor(
    readonly state: OrchestratorState,
    store: BlobStore,
    options: Partial<CoordinatorOptions> = {},
  ) {
    this.options = { ...COORDINATOR_DEFAULTS, ...options };
    this.now = this.options.now ?? Date.now;
    // every put passes the guard the collector deletes through (../blobs/blob-guard.ts)
    const blobs = (this.blobs = BlobGuard.of(store, this.now));
    this.log = this.options.log ?? ((line) => console.error(`orchestrator: ${line}`));
    this.identity = this.options.identity ?? ((key) => ({ key, domain: domainOf(key.publicKey) }))(SessionKey.generate());
    const { key, domain } = this.identity;
    const engine = (): Promise<Engine> => this.verifier();
    this.stageStates = new StageStates(state, blobs);
    this.offences = new Offences(state, this.options.slashing, (minerId, reason, until) => this.evict(minerId, reason, until));
    const mergeChecks = new MergeChecks(state, blobs, this.stageStates);
    this.merges = new MergeRounds(state, blobs, mergeChecks, this.offences, this.now, this.log);
    this.mergeUploads = new MergeUploads(state, blobs, mergeChecks, this.log);
    const data = new RunData(blobs);
    this.checks = new SpotChecks(state, this.stageStates, engine, this.offences, this.options.spotChecks, this.now, data);
    this.evaluator = new CheckpointEvaluator(engine, data);
    this.microbatches = new MicrobatchFlow(
      state,
      this.checks,
      { deadlineMs: this.options.microbatchDeadlineMs, slots: this.options.slots },
      { domain, ticket: (t) => signTicket(key, domain, t), receiptKeysOf: (id) => this.sessionKeys.get(id) ?? [] },
      this.now,
    );
    this.deployments = new Deployments(state, this.options.deployments, this.now, this.log);
    // a miner the plan moves lets go of its microbatches: they are issued again, charging nobody
    this.planner = new RunPlanner(state, this.options.slots, this.now, (runId, minerId) => this.microbatches.release(runId, minerId));
    this.gc = new Collector(
      state,
      blobs,
      this.options.gc ?? {},
      {
        forgetRun: (runId) => {
          this.microbatches.forget(runId);
          this.merges.forget(runId);
        },
        forgetMiner: (minerId) => {
          this.sessionKeys.delete(minerId);
          this.queues.delete(minerId);
          this.holding.delete(minerId);
        },
      },
      this.now,
      this.log,
    );
    // after a restart, give the miners that were alive a full timeout to re-attach, and open spot checks a full timeout to be answered
    const now = this.now();
    for (const m of state.miners.list()) {
      if (m.sessionKey) this.sessionKeys.set(m.id, [m.sessionKey]);
      if (!m.alive) continue;
      state.miners.touch(m.id, now);
      // until its first heartbeat says otherwise, it holds its stage at the stage's round (else its neighbours, told of no peer, drop what they hold)
      const a = state.runs.assignmentOf(m.id);
      if (a) this.holding.set(m.id, holds(a.runId, a.stage, state.runs.stage(a.runId, a.stage)?.round ?? 0));
    }
    this.checks.restarted();
    // nor do microbatches or merge phases time out for the downtime
    state.microbatches.extendDeadlines(now + this.options.microbatchDeadlineMs);
    this.merges.restarted();
  }

  /** The session key a miner bound when it joined (what its requests and receipts are checked against). */
  sessionKeyOf(minerId: string): string | undefined {
    return this.sessionKeys.get(minerId)?.[0];
  }

  // ---- miners ----------------------------------------------------------------

  join(minerId: string, req: JoinRequest): JoinReply {
    const banned = this.state.miners.get(minerId);
    if (banned?.bannedUntil && banned.bannedUntil > this.now()) throw new NimbleError('forbidden', banned.evicted ?? `evicted until ${new Date(banned.bannedUntil).toISOString()}`);
    const known = this.state.miners.get(minerId);
    this.state.miners.upsert(
      {
        id: minerId,
        name: req.name,
        url: req.url,
        gflops: req.hardware.gflops,
        threads: req.hardware.threads,
        memoryBytes: req.hardware.memoryBytes,
        bandwidthMbps: req.bandwidthMbps,
        sessionKey: req.sessionKey,
        serve: req.serve ?? 'both',
        backend: req.hardware.backend ?? 'wasm',
        adapter: req.hardware.adapter ?? null,
        softwareAdapter: req.hardware.softwareAdapter ?? false,
      },
      this.now(),
    );
    const keys = this.sessionKeys.get(minerId) ?? [];
    this.sessionKeys.set(minerId, [req.sessionKey, ...keys.filter((k) => k !== req.sessionKey)].slice(0, RECENT_SESSION_KEYS));
    // a miner that came back, or now offers something else (--serve), is planned again
    if (!known || !known.alive || known.serve !== (req.serve ?? 'both')) this.planner.replanAll();
    return { minerId, heartbeatMs: this.options.heartbeatMs };
  }

  heartbeat(minerId: string, req: HeartbeatRequest): HeartbeatReply {
    const miner = this.state.miners.get(minerId);
    if (!miner) throw new NimbleError('not_found', `miner ${minerId} has not joined; call /miners/join first`);
    if (miner.evicted !== null) throw new NimbleError('forbidden', miner.evicted);
    this.heartbeatsTaken++;
    const now = this.now();
    this.state.miners.touch(minerId, now);
    this.queues.set(minerId, req.queue);
    if (req.runId !== undefined && req.stage !== undefined) this.holding.set(minerId, holds(req.runId, req.stage, req.round ?? 0));
    else this.holding.delete(minerId);
    if (!miner.alive) this.planner.replanAll();

    const assignment = this.state.runs.assignmentOf(minerId);
    const lies: string[] = [];
    for (const report of req.reports) {
      // a claim counts when its evidence chains up, whether or not the miner still holds that stage (the plan may have
      // moved it since it did the work); a false claim is an offence only of the stage it holds
      const run = this.state.runs.get(report.runId);
      if (!run || FINAL_RUN_STATUSES.includes(run.status)) continue;
      const lie = this.microbatches.applyReport(minerId, run, report);
      if (lie && assignment?.runId === report.runId && assignment.stage === report.stage) lies.push(lie);
    }
    if (lies.length && assignment) {
      // one offence per heartbeat, however many false reports it carried
      const offence = { minerId, runId: assignment.runId, stage: assignment.stage, kind: 'invalid', units: lies.length } as const;
      const detail = `${lies.length} false report${lies.length > 1 ? 's' : ''}, the first: ${lies[0]}`;
      this.state.tx(() => this.offences.charge({ ...offence, detail, key: `false reports by ${minerId} at ${now}` }, now));
      const evicted = this.state.miners.get(minerId)?.evicted;
      if (evicted) throw new NimbleError('forbidden', evicted);
    }
    const held = req.held ?? [];
    const reply: HeartbeatReply = {
      assignment: null,
      deployment: this.deployments.heartbeat(minerId, req.deployment),
      microbatches: [],
      nextStage: [],
      previousStage: [],
      merge: null,
      abandon: this.microbatches.abandonedOf(held),
      checks: this.checks.deliver(minerId),
    };
    if (!assignment) return reply;
    const run = this.state.runs.get(assignment.runId)!;
    const stage = this.state.runs.stage(run.id, assignment.stage)!;
    reply.assignment = {
      runId: run.id,
      stage: assignment.stage,
      stageCount: run.stageCount,
      from: stage.fromPart,
      to: stage.toPart,
      model: run.model,
      data: run.data,
      batchSize: run.batchSize,
      seed: run.seed,
      round: stage.round,
      stateBlob: stage.stateBlob,
      ...(run.options.init ? { init: run.options.init } : {}),
      codec: run.options.codec,
      lr: run.options.lr,
    } satisfies StageAssignment;
    const current = req.runId === run.id && req.stage === assignment.stage;
    if (current && req.round !== undefined) this.merges.noteApplied(run, assignment.stage, minerId, req.round);
    reply.merge = this.merges.taskFor(run, assignment.stage, minerId);
    if (assignment.stage + 1 < run.stageCount) reply.nextStage = this.peersOf(run.id, assignment.stage + 1);
    if (assignment.stage > 0) reply.previousStage = this.peersOf(run.id, assignment.stage - 1);
    // microbatches only when every later stage has a replica that holds it (has loaded it) to take them
    const ready = run.stageCount === 1 || (assignment.stage === 0 && reply.nextStage.length > 0 && Array.from({ length: run.stageCount - 2 }, (_, i) => i + 2).every((s) => this.peersOf(run.id, s).length > 0));
    if (assignment.stage === 0 && current && ready && reply.merge === null && (req.round ?? 0) === stage.round) {
      reply.microbatches = this.microbatches.unstartedOf(run, minerId, held);
      if (!this.merges.wantsDrain(run)) reply.microbatches.push(...this.microbatches.issue(run, minerId, Math.max(0, req.freeSlots - reply.microbatches.length)));
    }
    return reply;
  }

  /**
   * The live replicas of a stage that hold it at its current round (their
   * last heartbeat said so: one still loading the stage, or a newer merged
   * state, would compute with other weights than the round's), weighted by
   * measured speed over current queue.
   */
  private peersOf(runId: string, stage: number): Peer[] {
    const out: Peer[] = [];
    const current = holds(runId, stage, this.state.runs.stage(runId, stage)?.round ?? 0);
    for (const a of this.state.runs.assignments(runId)) {
      if (a.stage !== stage || this.holding.get(a.minerId) !== current) continue;
      const m = this.state.miners.get(a.minerId);
      if (!m || !m.alive || !m.sessionKey) continue;
      out.push({ id: m.id, url: m.url, sessionKey: m.sessionKey, weight: peerWeight(m.gflops, this.queues.get(m.id) ?? 0) });
    }
    return out;
  }

  /** The miner is gone: its microbatches go back in the queue now, counted as dropped by it. */
  private markGone(minerId: string, why: string): void {
    this.state.tx(() => {
      this.state.miners.markGone(minerId);
      this.microbatches.dropAllOf(minerId, why);
    });
    this.queues.delete(minerId);
    this.holding.delete(minerId);
  }

  /**
   * Removes a miner from the network until it joins again (its stake fell
   * below the minimum), or not before `bannedUntil` (an offence): its
   * heartbeats get 403 with `reason`, its work is re-issued, placement is
   * recomputed.
   */
  evict(minerId: string, reason: string, bannedUntil: number | null = null): void {
    const m = this.state.miners.get(minerId);
    if (!m || (!m.alive && bannedUntil === null)) return;
    this.state.tx(() => {
      if (m.alive) this.markGone(minerId, 'miner evicted');
      this.state.miners.evict(minerId, reason, bannedUntil);
    });
    this.planner.replanAll();
  }

  /** The engine verification runs on (training's spot checks, inference checks, evaluation), made on first use. */
  verifier(): Promise<Engine> {
    return (this.engine ??= Engine.create({ threads: 1 }));
  }

  /** Activation slots each miner keeps (what a stage's memory is sized with). */
  get slots(): number {
    return this.options.slots;
  }

  // ---- runs ------------------------------------------------------------------

  /** A developer's new run (the address that signed the request owns it). */
  createRun(req: CreateRunRequest, owner: string, pool?: readonly string[], from?: { init: string | null; shardBase: number }): RunRecord {
    return this.planner.create(req, owner, pool, from);
  }

  /**
   * The run ends early, with nothing lost: no new microbatches, those issued
   * finish, then the final merge saves every stage's state and the run
   * completes (a job's upgrade moves on from there).
   */
  finishRunEarly(runId: string): RunRecord {
    const run = this.state.runs.get(runId);
    if (!run) throw new NimbleError('not_found', `unknown run ${runId}`);
    if (FINAL_RUN_STATUSES.includes(run.status)) throw new NimbleError('conflict', `run ${runId} has ended (${run.status})`);
    this.state.runs.setSteps(runId, run.microbatchesCreated);
    return this.state.runs.get(runId)!;
  }

  /** Limits a run to the miners of `pool` (null: any free miner), e.g. when a job's miner is gone. */
  setRunPool(runId: string, pool: readonly string[] | null): void {
    this.planner.setPool(runId, pool);
  }

  /** Alive miners that train and hold no stage of an active run or of a deployment. */
  idleMiners(): MinerRecord[] {
    return this.planner.idleMiners();
  }

  /** The owner ends a run: its miners are let go and planned onto the other runs. */
  cancelRun(runId: string, by: string): RunRecord {
    const run = this.state.runs.get(runId);
    if (!run) throw new NimbleError('not_found', `unknown run ${runId}`);
    if (run.owner !== by) throw new NimbleError('forbidden', `run ${runId} is not ${by}'s`);
    if (FINAL_RUN_STATUSES.includes(run.status)) throw new NimbleError('conflict', `run ${runId} has ended (${run.status})`);
    this.state.runs.cancel(runId, this.now());
    this.planner.replanAll();
    return this.state.runs.get(runId)!;
  }

  /** The orchestrator ends a run (a job's limit passed, or its job was cancelled): as a cancel, with the reason. */
  stopRun(runId: string, reason: string): void {
    const run = this.state.runs.get(runId);
    if (!run || FINAL_RUN_STATUSES.includes(run.status)) return;
    this.state.tx(() => {
      this.state.runs.cancel(runId, this.now());
      this.state.runs.setMessage(runId, reason);
    });
    this.planner.replanAll();
  }

  /** Releases what verification and evaluation hold (their models, then the engine). */
  async close(): Promise<void> {
    await this.gc.settled();
    await this.merges.settled();
    this.checks.close();
    this.evaluator.close();
    this.stageStates.clear();
    if (this.engine) await (await this.engine).close();
    this.engine = null;
  }

  // ---- the clock -------------------------------------------------------------

  /** Liveness, deadlines, run starts, merges and completion, and now and then a collection. Called a few times a second. */
  tick(): void {
    const now = this.now();
    this.checks.expire();
    let changed = false;
    for (const m of this.state.miners.list(true)) {
      if (now - m.lastSeen > this.options.minerTimeoutMs) {
        this.markGone(m.id, 'miner vanished');
        changed = true;
      }
    }
    if (changed) this.planner.replanAll();
    for (const run of this.state.runs.active()) {
      try {
        this.tickRun(run, now);
      } catch (err) {
        // one run's failure does not stop the others' clocks
        this.log(`run ${run.id}: tick failed: ${(err as Error).message}`);
      }
    }
    if (now - this.waitingTriedAt >= 1000) this.waitingTriedAt = now;
    try {
      this.deployments.tick();
    } catch (err) {
      this.log(`deployments: tick failed: ${(err as Error).message}`);
    }
    this.gc.tick();
  }

  /** Miners whose session keys are kept in memory (one per miner row). */
  get sessionKeysKept(): number {
    return this.sessionKeys.size;
  }

  private tickRun(run: RunRecord, now: number): void {
    if (run.status === 'waiting') {
      // planning costs: waiting runs are tried when miners come or go, and here at most once a second
      if (now - this.waitingTriedAt >= 1000) this.planner.tryStart(run);
      return;
    }
    this.microbatches.expireDeadlines(run);
    this.merges.tick(this.state.runs.get(run.id)!, this.state.microbatches.count(run.id, 'issued'));
    const fresh = this.state.runs.get(run.id)!;
    if (fresh.microbatchesDone >= fresh.steps && !this.merges.active(fresh) && this.merges.finalMergeDone(fresh)) {
      this.state.runs.complete(run.id, now);
      this.planner.replanAll(); // its miners are free for the runs that wait
    }
  }
}

/** What the `holding` map keeps of a miner: the run, stage and round whose weights it holds. */
function holds(runId: string, stage: number, round: number): string {
  return `${runId}/${stage}/${round}`;
}
