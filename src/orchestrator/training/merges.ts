// Merge rounds, DiLoCo-style with a butterfly all-reduce: every H inner steps
// per replica the run drains its in-flight microbatches, then each stage
//   uploading: every replica uploads its pseudo-gradient, one int8 frame per partition;
//   merging:   each partition is merged by two replicas, who upload the result;
//   applying:  every replica downloads the merged partitions and takes the
//              outer step; meanwhile the orchestrator takes the same step and
//              writes the new stage state (a stage of one replica, which has
//              nothing to merge, uploads its trained weights instead);
//   done:      the stage trains again from the new state.
// A replica that vanishes is dropped from the round; a partition whose
// mergers vanished is reassigned before the round closes. All of it is kept
// in the database, so a restarted orchestrator resumes the round. What the
// replicas upload is taken in by ./merge-uploads.ts.
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import { defaultRule, median, normBound } from '../../merge/merge-partition.ts';
import { assignMergers, reassign } from '../../merge/partition.ts';
import { rangeParams } from '../../model/model-ref.ts';
import { DEFAULT_HTTP_TIMEOUTS } from '../../http/server.ts';
import type { MergeTask } from '../../protocol/messages.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import { mergeDue } from './issue-policy.ts';
import { RECOMPUTED, type MergeChecks } from './merge-checks.ts';
import { stateBytesBound } from './merge-uploads.ts';
import type { Offences } from '../rewards/offences.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MergeResult, MergeRoundRecord, RoundKey, RoundPlan, RoundRule } from '../state/merge-rounds.ts';
import type { RunRecord, StageRecord } from '../state/runs.ts';

/** Replicas that have not uploaded by then are left out of the round. */
export const UPLOAD_TIMEOUT_MS = 60_000;
/** Mergers that have not uploaded a partition by then are replaced. */
export const MERGE_TIMEOUT_MS = 30_000;
/** Replicas that have not applied the round (or, a stage's single replica, saved its state: longer for a large state, applyTimeoutMs) by then are left out of it. */
export const APPLY_TIMEOUT_MS = 60_000;
/** Partitions per replica. */
const PARTITIONS_PER_REPLICA = 2;

export class MergeRounds {
  /** per run/stage: the highest round its replicas report having applied, and who did */
  private readonly applied = new Map<string, { round: number; miners: Set<string> }>();

  /** work under way here: partitions recomputed (a dispute, or a single merger), by run/stage/round/partition, and merged states written, by run/stage/round/state */
  private readonly background = new Map<string, Promise<void>>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
    private readonly checks: MergeChecks,
    /** where a merged partition that is not the merge of its inputs is charged */
    private readonly offences: Offences,
    private readonly now: () => number,
    private readonly log: (line: string) => void = () => {},
  ) {}

  private aliveReplicas(runId: string, stage: number): string[] {
    return this.state.runs
      .assignments(runId)
      .filter((a) => a.stage === stage && this.state.miners.get(a.minerId)?.alive)
      .map((a) => a.minerId)
      .sort();
  }

  /** The open round of a stage, if any. */
  current(run: RunRecord, stage: StageRecord): MergeRoundRecord | undefined {
    const r = this.state.mergeRounds.get({ runId: run.id, stage: stage.stage, round: stage.round + 1 });
    return r && r.status !== 'done' ? r : undefined;
  }

  /** Whether any stage of the run is in a merge round. */
  active(run: RunRecord): boolean {
    return this.state.runs.stages(run.id).some((s) => this.current(run, s) !== undefined);
  }

  /** The orchestrator restarted: every open round's phase starts its timeout again (the downtime is nobody's delay). */
  restarted(): void {
    const now = this.now();
    for (const run of this.state.runs.active()) {
      for (const s of this.state.runs.stages(run.id)) {
        const round = this.current(run, s);
        if (round) this.state.mergeRounds.update({ runId: run.id, stage: s.stage, round: round.round }, { plan: { ...round.plan, phaseAt: now } });
      }
    }
  }

  /** A merge is due (or running): stop issuing microbatches so the pipeline drains. */
  wantsDrain(run: RunRecord): boolean {
    return this.active(run) || this.due(run);
  }

  private due(run: RunRecord): boolean {
    const stages = this.state.runs.stages(run.id);
    if (stages.length === 0) return false;
    const steps = stages[0].innerSteps;
    if (steps === 0) return false;
    if (run.microbatchesDone >= run.steps) return true; // the final merge
    const replicas = Math.max(...stages.map((s) => this.aliveReplicas(run.id, s.stage).length), 1);
    return mergeDue(steps, run.mergeEvery, replicas);
  }

  /** After the last microbatch: every stage merged since and has a saved state. */
  finalMergeDone(run: RunRecord): boolean {
    return this.state.runs.stages(run.id).every((s) => s.innerSteps === 0 && s.stateBlob !== null);
  }

  /** Starts rounds when due and the pipeline is empty; advances rounds in progress. */
  tick(run: RunRecord, issued: number): void {
    if (run.status === 'waiting' || FINAL_RUN_STATUSES.includes(run.status)) return;
    if (!this.active(run) && this.due(run) && issued === 0) {
      this.state.tx(() => {
        for (const s of this.state.runs.stages(run.id)) this.startRound(run, s);
        this.state.runs.setStatus(run.id, 'merging');
      });
    }
    for (const s of this.state.runs.stages(run.id)) {
      const round = this.current(run, s);
      if (round) this.advance(run, s, round);
    }
    const fresh = this.state.runs.get(run.id)!;
    if (fresh.status === 'merging' && !this.active(fresh)) this.state.runs.setStatus(run.id, 'executing');
  }

  private startRound(run: RunRecord, s: StageRecord): void {
    const replicas = this.aliveReplicas(run.id, s.stage);
    const n = this.stageParams(run, s);
    const count = replicas.length >= 2 ? Math.min(Math.ceil(n / 256), PARTITIONS_PER_REPLICA * replicas.length) : 0;
    const plan: RoundPlan = {
      mergers: count ? assignMergers(count, replicas, 2, `${run.id}/${s.stage}/${s.round + 1}`) : [],
      chosen: count ? null : [],
      phaseAt: this.now(),
    };
    this.state.mergeRounds.open(keyOf(run, s.stage, s.round + 1), { status: count ? 'uploading' : 'applying', partitions: count, replicas, plan, startedAt: this.now() });
    this.state.runs.startMerging(run.id, s.stage);
  }

  /**
   * How long a round waits in applying: APPLY_TIMEOUT_MS, and for a stage of
   * one replica that has not saved its state yet, twice the state's transfer
   * at the uplink the replica measured when it joined, up to the server's
   * request timeout (no upload can take longer).
   */
  private applyTimeoutMs(run: RunRecord, s: StageRecord, round: MergeRoundRecord): number {
    if (round.partitions > 0 || round.stateBlob || round.replicas.length === 0) return APPLY_TIMEOUT_MS;
    const mbps = this.state.miners.get(round.replicas[0])?.bandwidthMbps ?? 0;
    const transferMs = mbps > 0 ? (2 * stateBytesBound(this.stageParams(run, s)) * 8) / (mbps * 1e3) : Infinity;
    return APPLY_TIMEOUT_MS + Math.ceil(Math.min(DEFAULT_HTTP_TIMEOUTS.requestMs, transferMs));
  }

  private stageParams(run: RunRecord, s: StageRecord): number {
    return rangeParams(run.model, { from: s.fromPart, to: s.toPart });
  }

  /**
   * How a round merges, fixed when merging starts: the run's aggregator (with
   * three or more replicas a robust one), and per partition the norm bound of
   * the replicas' slices (src/merge/merge-partition.ts).
   */
  private ruleOf(run: RunRecord, round: MergeRoundRecord, replicas: readonly string[]): RoundRule {
    const robust = defaultRule(replicas.length);
    const chosen = run.options.aggregator === 'mean' ? robust : run.options.aggregator === 'median' ? { aggregator: 'median' as const, trim: 0 } : { aggregator: 'trimmed-mean' as const, trim: robust.trim || 0.2 };
    const previous = this.state.mergeRounds.get({ runId: run.id, stage: round.stage, round: round.round - 1 })?.plan.rule;
    const uploads = this.state.mergeRounds.uploads({ runId: run.id, stage: round.stage, round: round.round }).filter((u) => replicas.includes(u.minerId));
    const maxNorms: number[] = [];
    const medians: number[] = [];
    for (let p = 0; p < round.partitions; p++) {
      const norms = uploads.filter((u) => u.partition === p).map((u) => u.norm);
      const reference = previous && previous.medians.length === round.partitions ? previous.medians[p] : null;
      maxNorms.push(normBound(norms, reference));
      medians.push(median(norms));
    }
    return { ...chosen, maxNorms, medians };
  }

  private advance(run: RunRecord, s: StageRecord, round: MergeRoundRecord): void {
    const now = this.now();
    const key = keyOf(run, s.stage, round.round);
    const plan = round.plan;
    const alive = new Set(this.aliveReplicas(run.id, s.stage));
    let replicas = round.replicas.filter((m) => alive.has(m));
    if (round.status === 'uploading') {
      const uploads = this.state.mergeRounds.uploads(key);
      const complete = (m: string): boolean => uploads.filter((u) => u.minerId === m).length === round.partitions;
      if (now - plan.phaseAt > UPLOAD_TIMEOUT_MS) {
        for (const m of replicas) if (!complete(m)) this.state.ledger.logWork({ minerId: m, runId: run.id, kind: 'dropped', stage: s.stage, detail: `no pseudo-gradient for round ${round.round}` }, now);
        replicas = replicas.filter(complete);
      }
      if (replicas.length === 0) {
        // nobody left to merge: the stage keeps its last state
        this.finish(run, s, round.round, s.stateBlob);
      } else if (replicas.every(complete)) {
        // mergers no longer in the round (gone, timed out, or left it by an offence) are replaced
        const vanished = new Set(plan.mergers.flat().filter((m) => !replicas.includes(m)));
        const mergers = vanished.size ? reassign(plan.mergers, vanished, replicas) : plan.mergers;
        this.state.mergeRounds.update(key, { status: 'merging', replicas, plan: { ...plan, mergers, phaseAt: now, rule: this.ruleOf(run, round, replicas) } });
      } else {
        this.state.mergeRounds.update(key, { replicas });
      }
      return;
    }
    if (round.status === 'merging') {
      const results = this.state.mergeRounds.results(key);
      const settled = new Map<number, string>();
      const vanished = new Set<string>();
      for (let p = 0; p < round.partitions; p++) {
        const decision = this.settle(run, s, round, p, results, alive, now - plan.phaseAt > MERGE_TIMEOUT_MS);
        if (decision) settled.set(p, decision);
        else if (!results.some((r) => r.partition === p)) {
          for (const m of plan.mergers[p]) if (!alive.has(m) || !round.replicas.includes(m) || now - plan.phaseAt > MERGE_TIMEOUT_MS) vanished.add(m);
        }
      }
      let next = plan;
      if (vanished.size && replicas.length) {
        // slow mergers are replaced by replicas that are not; when every live replica is slow,
        // only the dead ones go and the live ones get a fresh timeout
        let pool = replicas.filter((m) => !vanished.has(m));
        let gone = vanished;
        if (pool.length === 0) {
          pool = replicas;
          gone = new Set([...vanished].filter((m) => !replicas.includes(m)));
        }
        const reassigned = gone.size ? reassign(plan.mergers, gone, pool) : plan.mergers;
        // keep mergers of partitions with a result as they were
        next = { ...plan, mergers: reassigned.map((ms, p) => (results.some((r) => r.partition === p) ? plan.mergers[p] : ms)), phaseAt: now };
        this.state.mergeRounds.update(key, { plan: next });
      }
      if (settled.size === round.partitions) {
        const chosen = Array.from({ length: round.partitions }, (_, p) => settled.get(p)!);
        this.state.tx(() => {
          this.state.mergeRounds.update(key, { status: 'applying', plan: { ...next, chosen, phaseAt: now } });
          this.writeState(run, s, this.state.mergeRounds.get(key)!);
          // a merger's result is credited once when it is the partition's merge, and is an offence when it is not
          for (const r of results) {
            if (r.minerId === RECOMPUTED || !round.replicas.includes(r.minerId)) continue;
            if (r.blob === chosen[r.partition]) {
              this.state.ledger.logWork({ minerId: r.minerId, runId: run.id, kind: 'merge', stage: s.stage }, now);
              continue;
            }
            const at = `${run.id}/${s.stage}/${round.round}/${r.partition}`;
            const detail = `merged partition ${r.partition} of round ${round.round} is not the merge of its inputs`;
            this.offences.charge({ minerId: r.minerId, runId: run.id, stage: s.stage, kind: 'invalid', detail, key: `merged partition ${at} by ${r.minerId}` }, now);
          }
        });
      }
      return;
    }
    if (round.status === 'applying') {
      const entry = this.applied.get(`${run.id}/${s.stage}`);
      const applied = (m: string): boolean => entry?.round === round.round && entry.miners.has(m);
      const merged = round.partitions > 0;
      // a merged round's state is written here (again after a restart or a failure); the round closes once it is in
      if (merged) this.writeState(run, s, round);
      let next = plan;
      if (now - plan.phaseAt > this.applyTimeoutMs(run, s, round)) {
        // whoever holds the round up leaves it: replicas that did not apply, and a single replica that did not save its state
        const late = replicas.filter((m, i) => !applied(m) || (!merged && i === 0 && !round.stateBlob));
        for (const m of late) this.state.ledger.logWork({ minerId: m, runId: run.id, kind: 'dropped', stage: s.stage, detail: `round ${round.round} not applied in time` }, now);
        replicas = replicas.filter((m) => !late.includes(m));
        next = { ...plan, phaseAt: now };
      }
      if (replicas.length === 0 && !merged) this.finish(run, s, round.round, round.stateBlob ?? s.stateBlob);
      else if (round.stateBlob && replicas.every(applied)) this.finish(run, s, round.round, round.stateBlob);
      else if (next !== plan || replicas.join() !== round.replicas.join()) this.state.mergeRounds.update(key, { replicas, plan: next });
    }
  }

  /**
   * The merged blob partition `p` settles on, if it can now: its mergers that
   * are still there (alive and in the round) all delivered the same frame (two
   * or more of them), or the orchestrator's own recomputation, started when
   * they disagree, when only one merger is left, or when the timeout passed
   * with some result in. A merger that is gone will not deliver: the partition
   * does not wait the merge timeout for it (a partition with a result keeps
   * its mergers, so a dead one is never replaced there).
   */
  private settle(run: RunRecord, s: StageRecord, round: MergeRoundRecord, p: number, results: readonly MergeResult[], alive: ReadonlySet<string>, late: boolean): string | null {
    const mine = results.filter((r) => r.partition === p);
    const own = mine.find((r) => r.minerId === RECOMPUTED);
    if (own) return own.blob;
    const mergers = round.plan.mergers[p];
    const delivered = mine.filter((r) => mergers.includes(r.minerId));
    const present = mergers.filter((m) => alive.has(m) && round.replicas.includes(m));
    const allIn = present.every((m) => delivered.some((r) => r.minerId === m));
    const agree = delivered.length > 0 && delivered.every((r) => r.blob === delivered[0].blob);
    if (allIn && agree && delivered.length >= 2) return delivered[0].blob;
    if ((allIn && delivered.length > 0) || (late && mine.length > 0)) this.recompute(run, s, round, p);
    return null;
  }

  /** Merges partition `p` here, in the background; its result is stored as the orchestrator's. */
  private recompute(run: RunRecord, s: StageRecord, round: MergeRoundRecord, p: number): void {
    const k = keyOf(run, s.stage, round.round);
    this.inBackground(`${run.id}/${s.stage}/${round.round}/${p}`, `recomputing partition ${p} of round ${round.round}, stage ${s.stage} of ${run.id}`, async () => {
      const blob = await this.checks.recompute(run, s, round, p);
      this.state.mergeRounds.putResult(k, { partition: p, minerId: RECOMPUTED, blob });
    });
  }

  /**
   * Writes a merged round's new stage state here, in the background: the
   * outer step of its chosen partitions, which every replica takes too. No
   * replica uploads it, so the round does not wait for one replica's upload
   * of the whole stage (8 bytes a parameter), and no stage is too large to
   * save. It becomes the round's state once written, if the round is still
   * applying.
   */
  private writeState(run: RunRecord, s: StageRecord, round: MergeRoundRecord): void {
    if (round.stateBlob || round.partitions === 0) return;
    const k = keyOf(run, s.stage, round.round);
    this.inBackground(`${run.id}/${s.stage}/${round.round}/state`, `writing the state of round ${round.round}, stage ${s.stage} of ${run.id}`, async () => {
      const blob = await this.checks.writeMergedState(run, s, round);
      const open = this.state.mergeRounds.get(k);
      if (open?.status === 'applying' && !open.stateBlob) this.state.mergeRounds.update(k, { stateBlob: blob });
    });
  }

  /** Runs `work` once per `key` at a time; a failure is logged (the next tick tries again). */
  private inBackground(key: string, what: string, work: () => Promise<void>): void {
    if (this.background.has(key)) return;
    const task = work()
      .catch((err: unknown) => this.log(`${what} failed: ${(err as Error).message}`))
      .finally(() => this.background.delete(key));
    this.background.set(key, task);
  }

  /** Resolves when every recomputation and state write under way has ended. */
  async settled(): Promise<void> {
    await Promise.all([...this.background.values()]);
  }

  private finish(run: RunRecord, s: StageRecord, round: number, stateBlob: string | null): void {
    this.state.tx(() => {
      const key = keyOf(run, s.stage, round);
      const open = this.state.mergeRounds.get(key);
      // a done round's phaseAt is when it closed (the dashboard's merge rounds show how long it took)
      this.state.mergeRounds.update(key, open ? { status: 'done', plan: { ...open.plan, phaseAt: this.now() } } : { status: 'done' });
      this.state.runs.finishRound(run.id, s.stage, round, stateBlob);
      if (s.stage === 0) this.state.runs.addCounters(run.id, { merges: 1 });
    });
  }

  /**
   * A replica of `stage` reports (with every heartbeat) the merge round it has
   * applied. Only the stage's open round counts: a report of any other round
   * (an old run's, a round not open) is ignored.
   */
  noteApplied(run: RunRecord, stage: number, minerId: string, round: number): void {
    const s = this.state.runs.stage(run.id, stage);
    const open = s && this.current(run, s);
    if (!open || open.round !== round) return;
    const key = `${run.id}/${stage}`;
    let entry = this.applied.get(key);
    if (!entry || entry.round !== round) this.applied.set(key, (entry = { round, miners: new Set() }));
    entry.miners.add(minerId);
  }

  /** The run has ended: what memory holds of its rounds is let go (src/orchestrator/blobs/gc.ts). */
  forget(runId: string): void {
    for (const key of this.applied.keys()) if (key.startsWith(`${runId}/`)) this.applied.delete(key);
  }

  /** Stages whose applied reports are kept in memory. */
  get stagesTracked(): number {
    return this.applied.size;
  }

  /** What a replica should do for its stage's round, if one is running. */
  taskFor(run: RunRecord, stage: number, minerId: string): MergeTask | null {
    const s = this.state.runs.stage(run.id, stage);
    const round = s && this.current(run, s);
    if (!s || !round) return null;
    const key = keyOf(run, stage, round.round);
    const rule = round.plan.rule ?? null;
    const task: MergeTask = {
      round: round.round,
      partitions: this.checks.partitions(run, s, round.partitions).map((p) => ({ index: p.index, start: p.start, end: p.end })),
      upload: false,
      merge: [],
      apply: null,
      saveState: false,
      aggregator: rule?.aggregator ?? run.options.aggregator,
      trim: rule?.trim ?? 0,
      outerLr: run.options.outerLr,
      outerMomentum: run.options.outerMomentum,
    };
    if (!round.replicas.includes(minerId)) return task; // a replica that joined mid-round waits for the new state
    if (round.status === 'uploading') {
      const mine = this.state.mergeRounds.uploads(key).filter((u) => u.minerId === minerId).length;
      task.upload = mine < round.partitions;
    } else if (round.status === 'merging') {
      const uploads = this.state.mergeRounds.uploads(key).filter((u) => round.replicas.includes(u.minerId));
      const results = this.state.mergeRounds.results(key);
      for (let p = 0; p < round.partitions; p++) {
        if (!round.plan.mergers[p].includes(minerId)) continue;
        if (results.some((r) => r.partition === p && r.minerId === minerId)) continue;
        task.merge.push({
          partition: p,
          inputs: uploads.filter((u) => u.partition === p).map((u) => ({ minerId: u.minerId, blob: u.blob, samples: u.samples })),
          maxNorm: rule?.maxNorms[p] ?? null,
        });
      }
    } else if (round.status === 'applying') {
      task.apply = (round.plan.chosen ?? []).map((blob, partition) => ({ partition, blob }));
      task.saveState = round.partitions === 0 && round.replicas[0] === minerId && !round.stateBlob;
    }
    return task;
  }
}

function keyOf(run: RunRecord, stage: number, round: number): RoundKey {
  return { runId: run.id, stage, round };
}
