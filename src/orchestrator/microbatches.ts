// Microbatches through the pipeline: issued to stage-0 replicas, advanced by
// the miners' work reports, re-issued when a miner vanishes, drops one or
// lets its deadline pass (the miner on whose hop it stalled is charged), and
// counted when done (tokens/s over a sliding window).
import { gptConfig } from '../model/config.ts';
import type { MicrobatchTask, WorkReport } from '../protocol/messages.ts';
import type { SpotChecks } from './spot-checks.ts';
import type { OrchestratorState } from './state/index.ts';
import type { MicrobatchRecord } from './state/microbatches.ts';
import type { RunRecord } from './state/runs.ts';

/** Completions older than this no longer count toward tokens/s. */
const RATE_WINDOW_MS = 10_000;
/** Microbatches to abandon told to a miner in one heartbeat reply, at most. */
const ABANDON_PER_REPLY = 4096;

export interface MicrobatchOptions {
  /** a microbatch not finished this long after issue is re-issued */
  deadlineMs: number;
  /** activation slots each miner keeps */
  slots: number;
}

export class MicrobatchFlow {
  /** microbatches each miner should abandon, sent with its next heartbeat */
  private readonly abandon = new Map<string, Set<number>>();
  /** recent completions per run, for tokens/s */
  private readonly completions = new Map<string, { at: number; tokens: number }[]>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly checks: SpotChecks,
    private readonly options: MicrobatchOptions,
    private readonly now: () => number,
  ) {}

  /** Gives a stage-0 replica up to `freeSlots` microbatches: re-issues first, then new shards. */
  issue(run: RunRecord, minerId: string, freeSlots: number): MicrobatchTask[] {
    if (run.status !== 'started' && run.status !== 'executing') return [];
    const assigned = new Set(this.state.runs.assignments(run.id).map((a) => a.stage));
    if (assigned.size === 0 || this.state.runs.stages(run.id).some((s) => !assigned.has(s.stage))) return [];
    const now = this.now();
    const inFlight = this.state.microbatches.issuedTo(minerId).length;
    // up to two slots' worth per miner: the ones it runs and the ones queued behind them
    let want = Math.min(freeSlots, 2 * this.options.slots - inFlight);
    const tasks: MicrobatchTask[] = [];
    this.state.tx(() => {
      const remaining = run.steps - run.microbatchesDone - this.state.microbatches.count(run.id, 'issued');
      want = Math.min(want, remaining);
      const issueOne = (mb: { id: number; shard: number; step: number }): void => {
        this.state.microbatches.issue(mb.id, minerId, now, now + this.options.deadlineMs);
        tasks.push({ id: mb.id, shard: mb.shard, step: mb.step });
      };
      for (const mb of this.state.microbatches.byStatus(run.id, 'pending', Math.max(0, want))) issueOne(mb);
      let created = run.microbatchesCreated;
      while (tasks.length < want && created < run.steps) {
        issueOne({ id: this.state.microbatches.insert(run.id, created, created), shard: created, step: created });
        created++;
      }
      if (created !== run.microbatchesCreated) this.state.runs.setCreated(run.id, created);
      if (run.status === 'started' && tasks.length) this.state.runs.setStatus(run.id, 'executing');
    });
    return tasks;
  }

  /**
   * Applies one report of `minerId`, who holds `stage` of `run`: the work is
   * logged; a forward's commitment is recorded (true when it is selected for
   * a spot check); the microbatch advances, and is done when stage 0's
   * backward is in.
   */
  applyReport(minerId: string, run: RunRecord, r: WorkReport): boolean {
    const now = this.now();
    const mb = this.state.microbatches.get(r.microbatch);
    if (!mb || mb.runId !== run.id) {
      this.state.ledger.logWork({ minerId, runId: run.id, kind: 'invalid', stage: r.stage, detail: `report for microbatch ${r.microbatch}, which run ${run.id} does not have` }, now);
      return false;
    }
    const S = run.stageCount;
    let selected = false;
    this.state.tx(() => {
      if (r.bytesSent) this.state.runs.addCounters(run.id, { bytes: r.bytesSent });
      if (r.phase === 'dropped') {
        this.state.ledger.logWork({ minerId, runId: run.id, kind: 'dropped', stage: r.stage, detail: r.reason ?? null }, now);
        if (mb.status === 'issued') this.requeue(mb);
        return;
      }
      this.state.ledger.logWork({ minerId, runId: run.id, kind: r.phase, stage: r.stage }, now);
      if (r.phase === 'forward') selected = this.checks.onForward(run, minerId, r);
      if (mb.status !== 'issued') return; // late report of re-issued work: credited, nothing else
      const progress = mb.progress | (r.phase === 'forward' ? 1 << r.stage : 1 << (S + r.stage));
      if (r.phase === 'backward' && r.stage === 0) {
        this.state.microbatches.complete(mb.id, progress);
        this.completed(run, now);
        return;
      }
      const path = [...mb.path];
      let loss: number | null = null;
      if (r.phase === 'forward') {
        path[r.stage] = minerId;
        if (r.next && r.stage + 1 < S) path[r.stage + 1] = r.next;
        if (r.loss !== undefined && r.stage === S - 1) {
          loss = r.loss;
          this.state.runs.recordLoss(run.id, r.loss);
          this.state.runs.recordStageLoss(run.id, r.stage, r.loss);
        }
      }
      this.state.microbatches.recordHop(mb.id, progress, path, loss);
    });
    return selected;
  }

  /** A microbatch is done: its tokens count, every stage took one more inner step. */
  private completed(run: RunRecord, now: number): void {
    const tokens = run.batchSize * gptConfig(run.model).contextLength;
    this.state.runs.addCounters(run.id, { microbatches: 1, tokens });
    this.state.runs.addInnerStep(run.id);
    let list = this.completions.get(run.id);
    if (!list) this.completions.set(run.id, (list = []));
    list.push({ at: now, tokens });
    while (list.length > 0 && list[0].at < now - RATE_WINDOW_MS) list.shift();
  }

  /** Puts a microbatch back in the queue and tells the miners on its path to let go. */
  private requeue(mb: MicrobatchRecord): void {
    this.state.microbatches.requeue(mb.id);
    for (const m of mb.path) {
      if (!m) continue;
      let set = this.abandon.get(m);
      if (!set) this.abandon.set(m, (set = new Set()));
      set.add(mb.id);
    }
  }

  /** Microbatches `minerId` should let go of (each told once). */
  takeAbandoned(minerId: string): number[] {
    const set = this.abandon.get(minerId);
    if (!set) return [];
    this.abandon.delete(minerId);
    return [...set].slice(0, ABANDON_PER_REPLY);
  }

  /** A miner is gone: every microbatch on its path goes back in the queue, each a dropped unit for it. */
  dropAllOf(minerId: string, why: string): void {
    const now = this.now();
    for (const run of this.state.runs.active()) {
      for (const mb of this.state.microbatches.byStatus(run.id, 'issued')) {
        if (!mb.path.includes(minerId)) continue;
        this.state.ledger.logWork({ minerId, runId: run.id, kind: 'dropped', detail: `${why} holding microbatch ${mb.id}` }, now);
        this.requeue(mb);
      }
    }
  }

  /** Issued microbatches past their deadline go back in the queue; the miner they stalled at is charged. */
  expireDeadlines(run: RunRecord): void {
    const now = this.now();
    for (const mb of this.state.microbatches.byStatus(run.id, 'issued')) {
      if (mb.deadline === null || mb.deadline >= now) continue;
      const culprit = culpritOf(mb, run.stageCount);
      this.state.tx(() => {
        if (culprit) this.state.ledger.logWork({ minerId: culprit, runId: run.id, kind: 'dropped', detail: `microbatch ${mb.id} missed its deadline` }, now);
        this.requeue(mb);
      });
    }
  }

  /** Training tokens per second over the last RATE_WINDOW_MS. */
  tokensPerSecond(runId: string): number {
    const now = this.now();
    const list = (this.completions.get(runId) ?? []).filter((c) => c.at >= now - RATE_WINDOW_MS);
    if (list.length < 2) return 0;
    const tokens = list.slice(1).reduce((a, c) => a + c.tokens, 0);
    return (tokens * 1000) / Math.max(1, list[list.length - 1].at - list[0].at);
  }
}

/** The miner a stalled microbatch was waiting on: the first hop, in pipeline order, that did not report. */
export function culpritOf(mb: Pick<MicrobatchRecord, 'path' | 'progress'>, S: number): string | null {
  for (let s = 0; s < S; s++) if (!(mb.progress & (1 << s))) return mb.path[s] ?? mb.path[s - 1] ?? null;
  for (let s = S - 1; s >= 0; s--) if (!(mb.progress & (1 << (S + s)))) return mb.path[s] ?? null;
  return null;
}
