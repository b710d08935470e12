// Collecting what nobody needs any more: the policy, in one place. A long
// run leaves rows and blobs behind at every step (microbatches, hop claims,
// merge rounds with their uploads and results, spot checks); the clock runs
// a pass every `everyMs` (src/orchestrator/training/coordinator.ts) that deletes, in
// one transaction and at most `batch` rows per kind:
//   - merge rounds: a round's uploads and results (pseudo-gradient slices,
//     merged partitions) once a later round of its stage is done; a round's
//     row and state blob once no spot check and no later round needs it (the
//     state each open check's forward started from is kept, with the rounds
//     StageStates walks back through to find it, and the stage's latest round,
//     which the next round's checks start from); everything of an ended run
//     but its stages' latest states (its checkpoint);
//   - microbatches: done ones `microbatchRetentionMs` after issue (the run
//     keeps its counters), every one of an ended run; never one an open check names;
//   - hop claims: after `claimRetentionMs`, except those of microbatches in
//     flight and of open checks;
//   - spot checks: of an ended run, the open ones no heartbeat reply named
//     are skipped (their miner never heard of them: not failed); decided
//     ones `checkRetentionMs` after their decision (their counts are kept);
//   - miners gone for `minerRetentionMs`, or beyond the `maxGoneMiners` most
//     recently seen, unless they hold a stage of an active run;
//   - work-log entries: folded into per-miner sums (the ledger's
//     work_totals, which the views still count) once their epoch is settled
//     (or at once when nobody is paid), `workRetentionMs` after they were
//     logged, and for an active run only before its stages' latest rounds
//     opened (the next round's upload checks count the steps since);
//   - blobs the deleted rows named, `blobGraceMs` after, unless a kept row
//     names them (the state layer remembers them until then: ../state/garbage.ts);
//     a stored model (../state/models.ts) is never collected, nor is a
//     dataset while a row names it (../jobs/datasets.ts says when rows go).
// Epochs, rewards and slashes are the ledger: never collected; the work log
// is only folded into sums.
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import { BlobGuard } from './blob-guard.ts';
import type { BlobStore } from './blobs.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { RunRecord } from '../state/runs.ts';
import type { SpotCheckRecord } from '../state/spot-checks.ts';

export interface GcOptions {
  /** how often the clock runs a pass (ms) */
  everyMs: number;
  /** rows of each kind (and blobs) deleted per pass at most */
  batch: number;
  /** hop claims are kept this long (longer while their microbatch is in flight or checked) */
  claimRetentionMs: number;
  /** done microbatches are kept this long after they were issued */
  microbatchRetentionMs: number;
  /** decided spot checks are kept this long after their decision */
  checkRetentionMs: number;
  /** miners gone this long are forgotten */
  minerRetentionMs: number;
  /** gone miners kept at most (the most recently seen) */
  maxGoneMiners: number;
  /** a collected blob is deleted this long after its rows, unless named again */
  blobGraceMs: number;
  /** work-log entries are folded into sums this long after they were logged (once paid) */
  workRetentionMs: number;
  /** fold entries no epoch covers: the orchestrator pays nobody (no chain), so no epoch will */
  foldUnpaidWork: boolean;
}

export const GC_DEFAULTS: GcOptions = {
  everyMs: 30_000,
  batch: 5_000,
  claimRetentionMs: 10 * 60_000,
  microbatchRetentionMs: 10 * 60_000,
  checkRetentionMs: 60 * 60_000,
  minerRetentionMs: 24 * 60 * 60_000,
  maxGoneMiners: 10_000,
  blobGraceMs: 60_000,
  workRetentionMs: 6 * 60 * 60_000,
  foldUnpaidWork: false,
};

/** What one pass collected. */
export interface GcReport {
  /** merge rounds deleted */
  rounds: number;
  /** blobs named by the merge rows deleted */
  roundBlobs: number;
  microbatches: number;
  claims: number;
  /** open checks of ended runs skipped */
  checksSkipped: number;
  /** decided checks deleted */
  checksDeleted: number;
  miners: number;
  /** work-log entries folded into sums */
  workFolded: number;
  /** blobs deleted from the store */
  blobs: number;
}

/** What the coordinator drops from memory when the rows behind it go. */
export interface GcHooks {
  /** a run has ended and its rows are being collected */
  forgetRun(runId: string): void;
  /** a miner's row was deleted */
  forgetMiner(minerId: string): void;
}

export class Collector {
  readonly options: GcOptions;
  /** deletes hold the blob's lock against a put of the same bytes (./blob-guard.ts) */
  private readonly blobs: BlobGuard;
  private lastAt = -Infinity;
  private running: Promise<GcReport> | null = null;

  constructor(
    private readonly state: OrchestratorState,
    blobs: BlobStore,
    options: Partial<GcOptions>,
    private readonly hooks: GcHooks,
    private readonly now: () => number,
    private readonly log: (line: string) => void,
  ) {
    this.options = { ...GC_DEFAULTS, ...options };
    this.blobs = BlobGuard.of(blobs, now);
    if (!(this.options.batch >= 1)) throw new RangeError(`gc batch must be at least 1, got ${this.options.batch}`);
  }

  /** From the clock: starts a pass when one is due and none is under way. */
  tick(): void {
    const now = this.now();
    if (this.running || now - this.lastAt < this.options.everyMs) return;
    this.lastAt = now;
    this.collect().catch((err: unknown) => this.log(`collecting failed: ${(err as Error).message}`));
  }

  /** One pass now (or the one under way). */
  collect(): Promise<GcReport> {
    this.running ??= this.pass().finally(() => (this.running = null));
    return this.running;
  }

  /** Resolves when no pass is under way. */
  async settled(): Promise<void> {
    await this.running?.catch(() => undefined);
  }

  private async pass(): Promise<GcReport> {
    const now = this.now();
    const report: GcReport = { rounds: 0, roundBlobs: 0, microbatches: 0, claims: 0, checksSkipped: 0, checksDeleted: 0, miners: 0, workFolded: 0, blobs: 0 };
    this.state.tx(() => {
      const open = this.closeChecksOfEndedRuns(report, now);
      const condemned = this.collectRounds(open, report);
      report.roundBlobs = new Set(condemned).size;
      this.state.garbage.condemn(condemned, now);
      this.collectMicrobatches(open, report, now);
      report.checksDeleted = this.state.spotChecks.deleteDecidedBefore(now - this.options.checkRetentionMs, this.options.batch);
      this.collectMiners(report, now);
      report.workFolded = this.foldWork(now);
    });
    report.blobs = await this.deleteBlobs(now);
    return report;
  }

  /** Open checks of ended runs that no reply named are skipped; returns the checks still open. */
  private closeChecksOfEndedRuns(report: GcReport, now: number): SpotCheckRecord[] {
    const open = this.state.spotChecks.open();
    for (const runId of new Set(open.map((c) => c.runId))) {
      if (!ended(this.state.runs.get(runId))) continue;
      report.checksSkipped += this.state.spotChecks.skipUndelivered(runId, 'not asked: the run ended before any reply named the check', now);
    }
    return report.checksSkipped ? this.state.spotChecks.open() : open;
  }

  /** Rounds and their work no check and no later round needs; returns the blobs they named. */
  private collectRounds(open: readonly SpotCheckRecord[], report: GcReport): string[] {
    const { batch } = this.options;
    // the round each open check's forward ran in: its state must stay until the check is decided
    const needed = new Map<string, Set<number>>();
    for (const c of open) {
      const claim = this.state.claims.ofHop(c.microbatch, c.attempt, c.stage, 'forward').find((x) => x.minerId === c.minerId);
      const key = `${c.runId}/${c.stage}`;
      if (claim) needed.set(key, (needed.get(key) ?? new Set()).add(claim.round));
    }
    const blobs: string[] = [];
    for (const runId of this.state.mergeRounds.runIds()) {
      const run = this.state.runs.get(runId);
      const over = ended(run);
      if (over) this.hooks.forgetRun(runId);
      const stages = run ? this.state.runs.stages(runId) : [];
      for (const stage of this.state.mergeRounds.stagesOf(runId)) {
        const latest = stages.find((s) => s.stage === stage)?.round ?? 0;
        // an active stage keeps its latest round (the next round's uploads and state are checked from it) and its open round
        const rounds = new Set(needed.get(`${runId}/${stage}`));
        if (!over) rounds.add(latest);
        let from = Number.MAX_SAFE_INTEGER;
        for (const r of rounds) from = Math.min(from, this.firstRoundFor(runId, stage, r));
        const deleted = this.state.mergeRounds.deleteRounds(runId, stage, { from, to: over ? latest : null }, batch);
        report.rounds += deleted.rounds;
        blobs.push(...deleted.blobs);
        if (!over) blobs.push(...this.state.mergeRounds.deleteWorkBefore(runId, stage, latest, batch));
      }
    }
    return blobs;
  }

  /**
   * The oldest round whose row StageStates reads to find the state after
   * `round`: it walks back from `round` through done rounds that saved no
   * state (every replica left them) to the last one that did.
   */
  private firstRoundFor(runId: string, stage: number, round: number): number {
    for (let r = round; r > 0; r--) {
      const row = this.state.mergeRounds.get({ runId, stage, round: r });
      if (!row || row.stateBlob || row.status !== 'done') return r;
    }
    return 0;
  }

  /** Done microbatches past retention and everything of ended runs, and old hop claims, but nothing an open check or a microbatch in flight needs. */
  private collectMicrobatches(open: readonly SpotCheckRecord[], report: GcReport, now: number): void {
    const { batch } = this.options;
    const checked = [...new Set(open.map((c) => c.microbatch))];
    for (const runId of this.state.microbatches.runIds()) {
      if (!ended(this.state.runs.get(runId))) continue;
      this.hooks.forgetRun(runId);
      report.microbatches += this.state.microbatches.deleteOfRun(runId, checked, batch);
    }
    report.microbatches += this.state.microbatches.deleteDone(now - this.options.microbatchRetentionMs, checked, batch);
    const inFlight = this.state.runs.active().flatMap((r) => this.state.microbatches.byStatus(r.id, 'issued').map((mb) => mb.id));
    report.claims = this.state.claims.deleteBefore(now - this.options.claimRetentionMs, [...checked, ...inFlight], batch);
  }

  /** Miners gone long ago (or too many of them), unless they hold a stage of an active run. */
  private collectMiners(report: GcReport, now: number): void {
    const assigned = this.state.runs.active().flatMap((r) => this.state.runs.assignments(r.id).map((a) => a.minerId));
    const gone = this.state.miners.deleteGone(now - this.options.minerRetentionMs, this.options.maxGoneMiners, assigned, this.options.batch);
    for (const id of gone) this.hooks.forgetMiner(id);
    report.miners = gone.length;
  }

  /**
   * Work-log entries that are paid (their epochs settled), older than the
   * retention and, for an active run, logged before each of its stages'
   * latest round opened: the next round's upload check counts the backward
   * units logged since (src/orchestrator/training/merge-checks.ts creditedSteps).
   */
  private foldWork(now: number): number {
    const mark = this.state.ledger.settledWorkMark() ?? (this.options.foldUnpaidWork ? Number.MAX_SAFE_INTEGER : null);
    if (mark === null) return 0;
    const runCutoffs = new Map<string, number>();
    for (const run of this.state.runs.active()) {
      const opened = this.state.runs.stages(run.id).map((s) => (s.round > 0 ? (this.state.mergeRounds.get({ runId: run.id, stage: s.stage, round: s.round })?.startedAt ?? 0) : 0));
      runCutoffs.set(run.id, opened.length ? Math.min(...opened) : 0);
    }
    return this.state.ledger.foldWork({ upToId: mark, before: now - this.options.workRetentionMs, runCutoffs, limit: this.options.batch });
  }

  /** Whether a kept row names `blob`. */
  private named(blob: string): boolean {
    const s = this.state;
    return s.runs.referencesBlob(blob) || s.mergeRounds.references(blob) || s.jobs.referencesBlob(blob) || s.models.referencesBlob(blob) || s.datasets.referencesBlob(blob);
  }

  /** Condemned blobs past their grace that no kept row names: deleted from the store. */
  private async deleteBlobs(now: number): Promise<number> {
    let deleted = 0;
    for (const blob of this.state.garbage.due(now - this.options.blobGraceMs, this.options.batch)) {
      // named again since (the same bytes uploaded anew, or still a stage's state), or put again lately: kept; the check and the
      // delete hold the blob's lock, so a put of the same bytes cannot fall between them
      if (await this.blobs.deleteUnlessNamed(blob, this.state.garbage.since(blob) ?? now, () => this.named(blob))) deleted++;
      this.state.garbage.release(blob);
    }
    return deleted;
  }
}

/** Whether a run has ended (a missing run has too). */
function ended(run: RunRecord | undefined): boolean {
  return !run || FINAL_RUN_STATUSES.includes(run.status);
}
