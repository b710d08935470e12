// The orchestrator's logic, independent of HTTP: miners join and heartbeat
// (each heartbeat carries work reports and brings back the miner's
// instructions), and a clock that notices vanished miners and missed
// deadlines, starts waiting runs, drives merge rounds and completes runs.
// Runs are planned by RunPlanner, microbatches flow through MicrobatchFlow,
// merge rounds through MergeRounds, spot checks through SpotChecks; all of
// them keep their state in OrchestratorState, so a restarted orchestrator
// continues where the database stands.
import type { CreateRunRequest } from '../api/schemas.ts';
import { NimbleError } from '../protocol/errors.ts';
import type { HeartbeatReply, HeartbeatRequest, JoinReply, JoinRequest, Peer, StageAssignment } from '../protocol/messages.ts';
import type { BlobStore } from './blobs.ts';
import { MergeRounds } from './merges.ts';
import { MicrobatchFlow } from './microbatches.ts';
import { RunPlanner } from './run-planner.ts';
import { SpotChecks, type SpotCheckOptions } from './spot-checks.ts';
import type { OrchestratorState } from './state/index.ts';
import type { RunRecord } from './state/runs.ts';

export interface CoordinatorOptions {
  heartbeatMs: number;
  /** a miner silent this long is gone */
  minerTimeoutMs: number;
  /** a microbatch not finished this long after issue is re-issued */
  microbatchDeadlineMs: number;
  /** activation slots each miner keeps (microbatches in flight per miner) */
  slots: number;
  /** spot checks of forwards (rate, timeout, slashing threshold) */
  spotChecks?: Partial<SpotCheckOptions>;
  now?: () => number;
  /** where the clock reports what went wrong (default: stderr) */
  log?: (line: string) => void;
}

export const COORDINATOR_DEFAULTS: CoordinatorOptions = {
  heartbeatMs: 250,
  minerTimeoutMs: 4000,
  microbatchDeadlineMs: 15000,
  slots: 3,
};

export class Coordinator {
  readonly merges: MergeRounds;
  readonly checks: SpotChecks;
  readonly microbatches: MicrobatchFlow;
  readonly planner: RunPlanner;
  private readonly options: CoordinatorOptions;
  private readonly now: () => number;
  private readonly log: (line: string) => void;
  /** live queue lengths, from heartbeats (the router weighs replicas with them) */
  private readonly queues = new Map<string, number>();

  constructor(
    readonly state: OrchestratorState,
    readonly blobs: BlobStore,
    options: Partial<CoordinatorOptions> = {},
  ) {
    this.options = { ...COORDINATOR_DEFAULTS, ...options };
    this.now = this.options.now ?? Date.now;
    this.log = this.options.log ?? ((line) => console.error(`orchestrator: ${line}`));
    this.merges = new MergeRounds(state, blobs, this.now);
    this.checks = new SpotChecks(state, blobs, this.options.spotChecks, this.now);
    this.microbatches = new MicrobatchFlow(state, this.checks, { deadlineMs: this.options.microbatchDeadlineMs, slots: this.options.slots }, this.now);
    this.planner = new RunPlanner(state, this.options.slots, this.now);
    // after a restart, give the miners that were alive a full timeout to re-attach
    const now = this.now();
    for (const m of state.miners.list(true)) state.miners.touch(m.id, now);
  }

  // ---- miners ----------------------------------------------------------------

  join(minerId: string, req: JoinRequest): JoinReply {
    const known = this.state.miners.get(minerId);
    this.state.miners.upsert(
      { id: minerId, name: req.name, url: req.url, gflops: req.hardware.gflops, threads: req.hardware.threads, memoryBytes: req.hardware.memoryBytes, bandwidthMbps: req.bandwidthMbps },
      this.now(),
    );
    if (!known || !known.alive) this.planner.replanAll();
    return { minerId, heartbeatMs: this.options.heartbeatMs };
  }

  heartbeat(minerId: string, req: HeartbeatRequest): HeartbeatReply {
    const miner = this.state.miners.get(minerId);
    if (!miner) throw new NimbleError('not_found', `miner ${minerId} has not joined; call /miners/join first`);
    if (miner.evicted !== null) throw new NimbleError('forbidden', miner.evicted);
    const now = this.now();
    this.state.miners.touch(minerId, now);
    this.queues.set(minerId, req.queue);
    if (!miner.alive) this.planner.replanAll();

    const assignment = this.state.runs.assignmentOf(minerId);
    const checks: number[] = [];
    for (const report of req.reports) {
      const held = assignment && assignment.runId === report.runId && assignment.stage === report.stage ? this.state.runs.get(report.runId) : undefined;
      if (!held) {
        this.state.ledger.logWork({ minerId, runId: report.runId, kind: 'invalid', stage: report.stage, detail: `report for microbatch ${report.microbatch} at stage ${report.stage} does not match the miner's assignment` }, now);
      } else if (this.microbatches.applyReport(minerId, held, report)) checks.push(report.microbatch);
    }
    for (const r of req.rejected ?? []) {
      if (this.state.miners.get(r.sender)) this.state.ledger.logWork({ minerId: r.sender, runId: null, kind: 'invalid', detail: `refused by ${minerId}: ${r.reason}` }, now);
    }

    const reply: HeartbeatReply = { assignment: null, microbatches: [], nextStage: [], merge: null, abandon: this.microbatches.takeAbandoned(minerId), checks };
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
      codec: run.options.codec,
      lr: run.options.lr,
    } satisfies StageAssignment;
    if (req.runId === run.id && req.stage === assignment.stage && req.round !== undefined) this.merges.noteApplied(run, assignment.stage, minerId, req.round);
    reply.merge = this.merges.taskFor(run, assignment.stage, minerId);
    if (assignment.stage + 1 < run.stageCount) reply.nextStage = this.peersOf(run.id, assignment.stage + 1);
    const current = assignment.stage === 0 && reply.merge === null && req.runId === run.id && req.stage === 0 && (req.round ?? 0) === stage.round;
    if (current && !this.merges.wantsDrain(run)) reply.microbatches = this.microbatches.issue(run, minerId, req.freeSlots);
    return reply;
  }

  /** The live replicas of a stage, weighted by measured speed over current queue. */
  private peersOf(runId: string, stage: number): Peer[] {
    const out: Peer[] = [];
    for (const a of this.state.runs.assignments(runId)) {
      if (a.stage !== stage) continue;
      const m = this.state.miners.get(a.minerId);
      if (!m || !m.alive) continue;
      out.push({ id: m.id, url: m.url, weight: m.gflops / (1 + (this.queues.get(m.id) ?? 0)) });
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
  }

  /**
   * Removes a live miner from the network until it joins again (its stake fell
   * below the minimum): its heartbeats get 403 with `reason`, its work is
   * re-issued, placement is recomputed.
   */
  evict(minerId: string, reason: string): void {
    if (!this.state.miners.get(minerId)?.alive) return;
    this.state.tx(() => {
      this.markGone(minerId, 'miner evicted');
      this.state.miners.evict(minerId, reason);
    });
    this.planner.replanAll();
  }

  // ---- runs ------------------------------------------------------------------

  createRun(req: CreateRunRequest): RunRecord {
    return this.planner.create(req);
  }

  // ---- the clock -------------------------------------------------------------

  /** Liveness, deadlines, run starts, merges and completion. Called a few times a second. */
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
  }

  private tickRun(run: RunRecord, now: number): void {
    if (run.status === 'waiting') {
      this.planner.tryStart(run);
      return;
    }
    this.microbatches.expireDeadlines(run);
    this.merges.tick(this.state.runs.get(run.id)!, this.state.microbatches.count(run.id, 'issued'));
    const fresh = this.state.runs.get(run.id)!;
    if (fresh.microbatchesDone >= fresh.steps && !this.merges.active(fresh) && this.merges.finalMergeDone(fresh)) this.state.runs.complete(run.id, now);
  }
}
