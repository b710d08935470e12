// The orchestrator's logic, independent of HTTP: miners join and heartbeat,
// runs are planned and their microbatches issued to stage-0 replicas, work
// reports update the work log, deadlines re-issue lost work, and merge rounds
// are driven by MergeRounds. Everything durable goes through OrchestratorDb,
// so a restarted orchestrator continues where the database stands.
import { randomBytes } from 'node:crypto';
import { gptConfig } from '../model/config.ts';
import { partCount } from '../model/gpt.ts';
import { PlanError, planPlacement, rebalance, type MinerCapacity, type Plan } from '../planner/placement.ts';
import type { CreateRunRequest } from '../api/schemas.ts';
import type {
  HeartbeatReply,
  HeartbeatRequest,
  JoinReply,
  JoinRequest,
  MicrobatchTask,
  Peer,
  StageAssignment,
  WorkReport,
} from '../protocol/messages.ts';
import type { BlobStore } from './blobs.ts';
import type { MicrobatchRow, MinerRow, OrchestratorDb, RunRow } from './db.ts';
import { DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM } from '../merge/outer.ts';
import { CoordinatorError } from './errors.ts';
import { MergeRounds } from './merges.ts';
import { SpotChecks, type SpotCheckOptions } from './spot-checks.ts';

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
}

export const COORDINATOR_DEFAULTS: CoordinatorOptions = {
  heartbeatMs: 250,
  minerTimeoutMs: 4000,
  microbatchDeadlineMs: 15000,
  slots: 3,
};

export interface RunOptions {
  lr: number;
  codec: 'f32' | 'f16' | 'int8-row';
  aggregator: 'mean' | 'trimmed-mean' | 'median';
  minMiners: number;
  outerLr: number;
  outerMomentum: number;
  requestedStages: number | null;
  /** microbatches created so far (shard ids 0 … created − 1) */
  created: number;
}

/** H: inner steps per replica between merges (docs/network.md: why 100). */
export const DEFAULT_MERGE_EVERY = 100;
const RATE_WINDOW_MS = 10_000;

export class Coordinator {
  readonly merges: MergeRounds;
  readonly checks: SpotChecks;
  private readonly options: CoordinatorOptions;
  private readonly now: () => number;
  /** microbatches each miner should abandon, sent with its next heartbeat */
  private readonly abandon = new Map<string, Set<number>>();
  /** live queue lengths and free slots, from heartbeats */
  private readonly load = new Map<string, { queue: number; freeSlots: number }>();
  /** miners refused until they join again (too little stake), with the reason */
  private readonly evicted = new Map<string, string>();
  /** recent completions per run, for tokens/s */
  private readonly completions = new Map<string, { at: number; tokens: number }[]>();

  constructor(
    readonly db: OrchestratorDb,
    readonly blobs: BlobStore,
    options: Partial<CoordinatorOptions> = {},
  ) {
    this.options = { ...COORDINATOR_DEFAULTS, ...options };
    this.now = this.options.now ?? Date.now;
    this.merges = new MergeRounds(db, blobs, this.now);
    this.checks = new SpotChecks(db, blobs, this.options.spotChecks, this.now);
    // after a restart, give the miners that were alive a full timeout to re-attach
    const now = this.now();
    for (const m of db.miners(true)) db.touchMiner(m.id, now);
  }

  // ---- miners ----------------------------------------------------------------

  join(minerId: string, req: JoinRequest): JoinReply {
    const now = this.now();
    this.evicted.delete(minerId);
    const known = this.db.miner(minerId);
    this.db.upsertMiner(
      { id: minerId, name: req.name, url: req.url, gflops: req.hardware.gflops, threads: req.hardware.threads, memory_bytes: req.hardware.memoryBytes, bandwidth_mbps: req.bandwidthMbps },
      now,
    );
    if (!known || !known.alive) this.onMinersChanged();
    return { minerId, heartbeatMs: this.options.heartbeatMs };
  }

  heartbeat(minerId: string, req: HeartbeatRequest): HeartbeatReply {
    const miner = this.db.miner(minerId);
    if (!miner) throw new CoordinatorError(404, `miner ${minerId} has not joined; call /miners/join first`);
    const evicted = this.evicted.get(minerId);
    if (evicted) throw new CoordinatorError(403, evicted);
    const now = this.now();
    const wasGone = !miner.alive;
    this.db.touchMiner(minerId, now);
    this.load.set(minerId, { queue: req.queue, freeSlots: req.freeSlots });
    if (wasGone) this.onMinersChanged();
    const checks: number[] = [];
    for (const report of req.reports) if (this.applyReport(minerId, report)) checks.push(report.microbatch);
    for (const r of req.rejected ?? []) {
      if (this.db.miner(r.sender)) this.db.logWork(r.sender, null, 'invalid', 1, now, null, `refused by ${minerId}: ${r.reason}`);
    }

    const reply: HeartbeatReply = { assignment: null, microbatches: [], nextStage: [], merge: null, abandon: [], checks };
    const dropped = this.abandon.get(minerId);
    if (dropped) {
      reply.abandon = [...dropped].slice(0, 4096);
      this.abandon.delete(minerId);
    }
    const a = this.db.assignmentOf(minerId);
    if (!a) return reply;
    const run = this.db.run(a.run_id)!;
    const stage = this.db.stages(run.id)[a.stage];
    const opts = JSON.parse(run.options) as RunOptions;
    reply.assignment = {
      runId: run.id,
      stage: a.stage,
      stageCount: run.stage_count,
      from: stage.from_part,
      to: stage.to_part,
      model: run.model,
      data: run.data,
      batchSize: run.batch_size,
      seed: run.seed,
      round: stage.round,
      stateBlob: stage.state_blob,
      codec: opts.codec,
      lr: opts.lr,
    } satisfies StageAssignment;
    if (req.uploadedRound !== undefined || req.round !== undefined) this.merges.noteMinerRound(run, a.stage, minerId, req.round ?? 0);
    reply.merge = this.merges.taskFor(run, a.stage, minerId);
    if (a.stage + 1 < run.stage_count) reply.nextStage = this.peersOf(run.id, a.stage + 1);
    if (a.stage === 0 && reply.merge === null && req.runId === run.id && req.stage === 0 && (req.round ?? 0) === stage.round) {
      reply.microbatches = this.issue(run, minerId, req.freeSlots, now);
    }
    return reply;
  }

  /** The replicas of a stage, weighted by measured speed and current queue. */
  private peersOf(runId: string, stage: number): Peer[] {
    const out: Peer[] = [];
    for (const a of this.db.assignments(runId)) {
      if (a.stage !== stage) continue;
      const m = this.db.miner(a.miner_id);
      if (!m || !m.alive) continue;
      const queue = this.load.get(m.id)?.queue ?? 0;
      out.push({ id: m.id, url: m.url, weight: m.gflops / (1 + queue) });
    }
    return out;
  }

  // ---- runs ------------------------------------------------------------------

  createRun(req: CreateRunRequest): RunRow {
    let config;
    try {
      config = gptConfig(req.model);
    } catch (err) {
      throw new CoordinatorError(400, (err as Error).message);
    }
    if (req.data !== 'moby-dick') throw new CoordinatorError(400, `data set '${req.data}' is not available to miners (use 'moby-dick')`);
    if (req.stages !== undefined && req.stages > partCount(config)) {
      throw new CoordinatorError(400, `${req.model} has ${partCount(config)} parts; it cannot be cut into ${req.stages} stages`);
    }
    const id = `run-${randomBytes(4).toString('hex')}`;
    const options: RunOptions = {
      lr: req.lr ?? 1e-3,
      codec: req.codec ?? 'f16',
      aggregator: req.aggregator ?? 'mean',
      minMiners: req.minMiners ?? req.stages ?? 1,
      outerLr: req.outerLr ?? DEFAULT_OUTER_LR,
      outerMomentum: req.outerMomentum ?? DEFAULT_OUTER_MOMENTUM,
      requestedStages: req.stages ?? null,
      created: 0,
    };
    this.db.insertRun(
      {
        id,
        model: req.model,
        data: req.data,
        steps: req.steps,
        batch_size: req.batchSize ?? 12,
        merge_every: req.mergeEvery ?? DEFAULT_MERGE_EVERY,
        seed: req.seed ?? 1337,
        stage_count: 0,
        plan: 'null',
        options: JSON.stringify(options),
      },
      this.now(),
    );
    this.tryStart(this.db.run(id)!);
    return this.db.run(id)!;
  }

  /** Miners that are alive and not holding a stage of another active run. */
  private freeMiners(exceptRun?: string): MinerRow[] {
    const busy = new Set<string>();
    for (const r of this.db.activeRuns()) {
      if (r.id === exceptRun) continue;
      for (const a of this.db.assignments(r.id)) busy.add(a.miner_id);
    }
    return this.db.miners(true).filter((m) => !busy.has(m.id));
  }

  private capacities(miners: MinerRow[]): MinerCapacity[] {
    return miners.map((m) => ({ id: m.id, gflops: m.gflops, memoryBytes: m.memory_bytes }));
  }

  /** Plans a waiting run if enough miners are free. */
  private tryStart(run: RunRow): void {
    if (run.status !== 'waiting') return;
    const opts = JSON.parse(run.options) as RunOptions;
    const miners = this.freeMiners(run.id);
    if (miners.length < opts.minMiners) {
      this.db.updateRun(run.id, { error: `waiting for miners: ${miners.length} of ${opts.minMiners} available` });
      return;
    }
    const config = gptConfig(run.model);
    let plan: Plan;
    try {
      plan = planPlacement({
        config,
        miners: this.capacities(miners),
        stages: opts.requestedStages ?? undefined,
        batchSize: run.batch_size,
        slots: this.options.slots,
      });
    } catch (err) {
      if (err instanceof PlanError) {
        this.db.updateRun(run.id, { error: `cannot plan yet: ${err.message}` });
        return;
      }
      throw err;
    }
    const now = this.now();
    this.db.tx(() => {
      if (this.db.stages(run.id).length === 0) {
        plan.stages.forEach((s, i) => this.db.insertStage({ run_id: run.id, stage: i, from_part: s.range.from, to_part: s.range.to }));
      }
      this.writeAssignments(run.id, plan, now);
      this.db.updateRun(run.id, {
        status: 'started',
        stage_count: plan.stages.length,
        plan: JSON.stringify(plan),
        started_at: run.started_at ?? now,
        error: null,
      });
    });
  }

  private writeAssignments(runId: string, plan: Plan, now: number): void {
    const keep = new Set<string>();
    plan.stages.forEach((s, i) => {
      for (const m of s.miners) {
        keep.add(m);
        const current = this.db.assignments(runId).find((a) => a.miner_id === m);
        if (!current || current.stage !== i) this.db.assign(runId, i, m, now);
      }
    });
    for (const a of this.db.assignments(runId)) if (!keep.has(a.miner_id)) this.db.unassign(runId, a.miner_id);
  }

  /** The miner is gone: its microbatches go back in the queue now, counted as dropped by it. */
  private markGone(minerId: string, why: string): void {
    const now = this.now();
    this.db.tx(() => {
      this.db.markMinerGone(minerId);
      for (const run of this.db.activeRuns()) {
        for (const mb of this.db.microbatchesByStatus(run.id, 'issued')) {
          if (!(JSON.parse(mb.path ?? '[]') as (string | null)[]).includes(minerId)) continue;
          this.db.logWork(minerId, run.id, 'dropped', 1, now, null, `${why} holding microbatch ${mb.id}`);
          this.requeue(mb);
        }
      }
    });
    this.load.delete(minerId);
  }

  /**
   * Removes a live miner from the network until it joins again (its stake fell
   * below the minimum): its heartbeats get 403 with `reason`, its work is
   * re-issued, placement is recomputed.
   */
  evict(minerId: string, reason: string): void {
    if (!this.db.miner(minerId)?.alive) return;
    this.evicted.set(minerId, reason);
    this.markGone(minerId, 'miner evicted');
    this.onMinersChanged();
  }

  /** Miners came or went: start waiting runs, rebalance running ones. */
  private onMinersChanged(): void {
    for (const run of this.db.activeRuns()) {
      if (run.status === 'waiting') {
        this.tryStart(run);
        continue;
      }
      const previous = JSON.parse(run.plan) as Plan | null;
      if (!previous) continue;
      const miners = this.freeMiners(run.id);
      let next: Plan;
      try {
        next = rebalance(previous, this.capacities(miners)).plan;
      } catch (err) {
        if (!(err instanceof PlanError)) throw err;
        // a stage has no replica left: keep the cut, wait for miners
        const alive = new Set(miners.map((m) => m.id));
        next = { ...previous, stages: previous.stages.map((s) => ({ ...s, miners: s.miners.filter((m) => alive.has(m)) })) };
        this.db.updateRun(run.id, { error: `stalled: ${err.message}` });
      }
      this.db.tx(() => {
        this.writeAssignments(run.id, next, this.now());
        this.db.updateRun(run.id, { plan: JSON.stringify(next) });
        if (next.stages.every((s) => s.miners.length > 0)) this.db.updateRun(run.id, { error: null });
      });
    }
  }

  // ---- microbatches ----------------------------------------------------------

  /** Gives a stage-0 replica up to `freeSlots` microbatches: re-issues first, then new shards. */
  private issue(run: RunRow, minerId: string, freeSlots: number, now: number): MicrobatchTask[] {
    if (run.status !== 'started' && run.status !== 'executing') return [];
    if (this.merges.wantsDrain(run)) return [];
    const opts = JSON.parse(run.options) as RunOptions;
    const stages = this.db.stages(run.id);
    if (this.db.assignments(run.id).length === 0 || stages.some((s) => !this.db.assignments(run.id).some((a) => a.stage === s.stage))) return [];
    const inFlight = this.db.issuedTo(minerId).length;
    // up to two slots' worth per miner: the ones it runs and the ones queued behind them
    let want = Math.min(freeSlots, 2 * this.options.slots - inFlight);
    const tasks: MicrobatchTask[] = [];
    this.db.tx(() => {
      const remaining = run.steps - run.microbatches_done - this.db.countMicrobatches(run.id, 'issued');
      want = Math.min(want, remaining);
      const issueRow = (mb: MicrobatchRow): void => {
        this.db.updateMicrobatch(mb.id, {
          status: 'issued', miner_id: minerId, path: JSON.stringify([minerId]), progress: 0,
          issued_at: now, deadline: now + this.options.microbatchDeadlineMs, attempts: mb.attempts + 1,
        });
        tasks.push({ id: mb.id, shard: mb.shard, step: mb.step });
      };
      for (const mb of this.db.microbatchesByStatus(run.id, 'pending', Math.max(0, want))) issueRow(mb);
      while (tasks.length < want && opts.created < run.steps) {
        const id = this.db.insertMicrobatch(run.id, opts.created, opts.created);
        opts.created++;
        issueRow(this.db.microbatch(id)!);
      }
      this.db.updateRun(run.id, { options: JSON.stringify(opts), ...(run.status === 'started' && tasks.length ? { status: 'executing' } : {}) });
    });
    return tasks;
  }

  /** Applies one report; true when the forward it reports was selected for a spot check. */
  private applyReport(minerId: string, r: WorkReport): boolean {
    const now = this.now();
    const mb = this.db.microbatch(r.microbatch);
    const a = this.db.assignmentOf(minerId);
    if (!mb || mb.run_id !== r.runId || !a || a.run_id !== r.runId || a.stage !== r.stage) {
      this.db.logWork(minerId, r.runId, 'invalid', 1, now, r.stage, `report for microbatch ${r.microbatch} at stage ${r.stage} does not match the miner's assignment`);
      return false;
    }
    const run = this.db.run(r.runId)!;
    const S = run.stage_count;
    if (r.bytesSent) this.db.addRunCounters(run.id, { bytes: r.bytesSent });
    const path = JSON.parse(mb.path ?? '[]') as (string | null)[];
    let selected = false;
    this.db.tx(() => {
      if (r.phase === 'dropped') {
        this.db.logWork(minerId, run.id, 'dropped', 1, now, r.stage, r.reason ?? null);
        if (mb.status === 'issued') this.requeue(mb);
        return;
      }
      this.db.logWork(minerId, run.id, r.phase, 1, now, r.stage);
      if (r.phase === 'forward') selected = this.checks.onForward(run, minerId, r);
      if (mb.status !== 'issued') return; // late report of re-issued work: credited, nothing else
      const bit = r.phase === 'forward' ? 1 << r.stage : 1 << (S + r.stage);
      const fields: Partial<MicrobatchRow> = { progress: mb.progress | bit };
      if (r.phase === 'forward') {
        path[r.stage] = minerId;
        if (r.next && r.stage + 1 < S) path[r.stage + 1] = r.next;
        fields.path = JSON.stringify(path);
        if (r.loss !== undefined && r.stage === S - 1) {
          fields.loss = r.loss;
          this.db.updateRun(run.id, { last_loss: r.loss });
          this.db.updateStage(run.id, r.stage, { last_loss: r.loss });
        }
      }
      if (r.phase === 'backward' && r.stage === 0) {
        fields.status = 'done';
        const tokens = run.batch_size * gptConfig(run.model).contextLength;
        this.db.addRunCounters(run.id, { microbatches: 1, tokens });
        let list = this.completions.get(run.id);
        if (!list) this.completions.set(run.id, (list = []));
        list.push({ at: now, tokens });
        while (list.length > 0 && list[0].at < now - RATE_WINDOW_MS) list.shift();
        for (let s = 0; s < S; s++) {
          const st = this.db.stages(run.id)[s];
          this.db.updateStage(run.id, s, { inner_steps: st.inner_steps + 1 });
        }
      }
      this.db.updateMicrobatch(mb.id, fields);
    });
    return selected;
  }

  /** Puts a microbatch back in the queue and tells the miners on its path to let go. */
  private requeue(mb: MicrobatchRow): void {
    this.db.updateMicrobatch(mb.id, { status: 'pending', miner_id: null, deadline: null });
    for (const m of JSON.parse(mb.path ?? '[]') as (string | null)[]) {
      if (!m) continue;
      let set = this.abandon.get(m);
      if (!set) this.abandon.set(m, (set = new Set()));
      set.add(mb.id);
    }
  }

  /** The miner a stalled microbatch was waiting on: the first hop, in pipeline order, that did not report. */
  private culprit(mb: MicrobatchRow, S: number): string | null {
    const path = JSON.parse(mb.path ?? '[]') as (string | null)[];
    for (let s = 0; s < S; s++) if (!(mb.progress & (1 << s))) return path[s] ?? path[s - 1] ?? null;
    for (let s = S - 1; s >= 0; s--) if (!(mb.progress & (1 << (S + s)))) return path[s] ?? null;
    return null;
  }

  /** Training tokens per second over the last RATE_WINDOW_MS. */
  tokensPerSecond(runId: string): number {
    const now = this.now();
    const list = (this.completions.get(runId) ?? []).filter((c) => c.at >= now - RATE_WINDOW_MS);
    if (list.length < 2) return 0;
    const tokens = list.slice(1).reduce((a, c) => a + c.tokens, 0);
    return (tokens * 1000) / Math.max(1, list[list.length - 1].at - list[0].at);
  }

  // ---- the clock -------------------------------------------------------------

  /** Liveness, deadlines, run starts, merges and completion. Called a few times a second. */
  tick(): void {
    const now = this.now();
    this.checks.expire();
    let changed = false;
    for (const m of this.db.miners(true)) {
      if (now - m.last_seen > this.options.minerTimeoutMs) {
        this.markGone(m.id, 'miner vanished');
        changed = true;
      }
    }
    if (changed) this.onMinersChanged();
    for (const run of this.db.activeRuns()) {
      if (run.status === 'waiting') {
        this.tryStart(run);
        continue;
      }
      for (const mb of this.db.microbatchesByStatus(run.id, 'issued')) {
        if (mb.deadline !== null && mb.deadline < now) {
          const culprit = this.culprit(mb, run.stage_count);
          this.db.tx(() => {
            if (culprit) this.db.logWork(culprit, run.id, 'dropped', 1, now, null, `microbatch ${mb.id} missed its deadline`);
            this.requeue(mb);
          });
        }
      }
      this.merges.tick(this.db.run(run.id)!, this.db.countMicrobatches(run.id, 'issued'));
      const fresh = this.db.run(run.id)!;
      if (fresh.microbatches_done >= fresh.steps && !this.merges.active(fresh) && this.merges.finalMergeDone(fresh)) {
        this.db.updateRun(run.id, { status: 'completed', finished_at: now });
      }
    }
  }
}
