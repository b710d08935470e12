// Merge rounds, DiLoCo-style with a butterfly all-reduce: every H inner steps
// per replica the run drains its in-flight microbatches, then each stage
//   uploading: every replica uploads its pseudo-gradient, one int8 frame per partition;
//   merging:   each partition is merged by two replicas, who upload the result;
//   applying:  every replica downloads the merged partitions and takes the
//              outer step; one replica uploads the new stage state;
//   done:      the stage trains again from the new state.
// A replica that vanishes is dropped from the round; a partition whose
// mergers vanished is reassigned before the round closes. All of it is kept
// in the database, so a restarted orchestrator resumes the round.
import { assignMergers, partitionVector, reassign, type Partition } from '../merge/partition.ts';
import { decodePartitionFrame } from '../merge/pseudo-gradient.ts';
import { gptConfig } from '../model/config.ts';
import { rangeParamCount } from '../model/gpt.ts';
import { decodeSafetensors } from '../model/safetensors.ts';
import { checkpointInfo } from '../model/checkpoint.ts';
import { DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM } from '../merge/outer.ts';
import type { MergeTask } from '../protocol/messages.ts';
import type { BlobStore } from './blobs.ts';
import type { MergeRoundRow, OrchestratorDb, RunRow, StageRow } from './db.ts';
import type { RunOptions } from './coordinator.ts';
import { CoordinatorError } from './errors.ts';

/** Replicas that have not uploaded by then are left out of the round. */
const UPLOAD_TIMEOUT_MS = 60_000;
/** Mergers that have not uploaded a partition by then are replaced. */
const MERGE_TIMEOUT_MS = 30_000;
/** Partitions per replica. */
const PARTITIONS_PER_REPLICA = 2;

interface RoundPlan {
  /** for each partition, the replicas that merge it */
  mergers: string[][];
  /** for each partition, the merged blob every replica applies (fixed when applying starts) */
  chosen: string[] | null;
  /** when the current phase began */
  phaseAt: number;
}

export class MergeRounds {
  /** replicas that reported having applied a round: key run/stage/round */
  private readonly applied = new Map<string, Set<string>>();

  constructor(
    private readonly db: OrchestratorDb,
    private readonly blobs: BlobStore,
    private readonly now: () => number,
  ) {}

  private aliveReplicas(runId: string, stage: number): string[] {
    return this.db
      .assignments(runId)
      .filter((a) => a.stage === stage && this.db.miner(a.miner_id)?.alive)
      .map((a) => a.miner_id)
      .sort();
  }

  private current(run: RunRow, stage: StageRow): MergeRoundRow | undefined {
    const r = this.db.mergeRound(run.id, stage.stage, stage.round + 1);
    return r && r.status !== 'done' ? r : undefined;
  }

  /** Whether any stage of the run is in a merge round. */
  active(run: RunRow): boolean {
    return this.db.stages(run.id).some((s) => this.current(run, s) !== undefined);
  }

  /** A merge is due (or running): stop issuing microbatches so the pipeline drains. */
  wantsDrain(run: RunRow): boolean {
    if (this.active(run)) return true;
    return this.due(run);
  }

  private due(run: RunRow): boolean {
    const stages = this.db.stages(run.id);
    if (stages.length === 0) return false;
    const steps = stages[0].inner_steps;
    if (steps === 0) return false;
    if (run.microbatches_done >= run.steps) return true; // the final merge
    const replicas = Math.max(...stages.map((s) => this.aliveReplicas(run.id, s.stage).length), 1);
    return steps >= run.merge_every * replicas;
  }

  /** After the last microbatch: every stage merged since and has a saved state. */
  finalMergeDone(run: RunRow): boolean {
    return this.db.stages(run.id).every((s) => s.inner_steps === 0 && s.state_blob !== null);
  }

  /** Starts rounds when due and the pipeline is empty; advances rounds in progress. */
  tick(run: RunRow, issued: number): void {
    if (run.status === 'waiting' || run.status === 'completed' || run.status === 'failed') return;
    const stages = this.db.stages(run.id);
    if (!this.active(run) && this.due(run) && issued === 0) {
      this.db.tx(() => {
        for (const s of stages) this.startRound(run, s);
        this.db.updateRun(run.id, { status: 'merging' });
      });
    }
    for (const s of this.db.stages(run.id)) {
      const round = this.current(run, s);
      if (round) this.advance(run, s, round);
    }
    if (run.status === 'merging' && !this.active(this.db.run(run.id)!)) this.db.updateRun(run.id, { status: 'executing' });
  }

  private startRound(run: RunRow, s: StageRow): void {
    const replicas = this.aliveReplicas(run.id, s.stage);
    const n = rangeParamCount(gptConfig(run.model), { from: s.from_part, to: s.to_part });
    const count = replicas.length >= 2 ? Math.min(Math.ceil(n / 256), PARTITIONS_PER_REPLICA * replicas.length) : 0;
    const plan: RoundPlan = {
      mergers: count ? assignMergers(count, replicas, 2, `${run.id}/${s.stage}/${s.round + 1}`) : [],
      chosen: count ? null : [],
      phaseAt: this.now(),
    };
    this.db.insertMergeRound({
      run_id: run.id,
      stage: s.stage,
      round: s.round + 1,
      status: count ? 'uploading' : 'applying',
      partitions: count,
      replicas: JSON.stringify(replicas),
      assignment: JSON.stringify(plan),
      started_at: this.now(),
    });
    this.db.updateStage(run.id, s.stage, { mode: 'merging' });
  }

  private partitions(run: RunRow, s: StageRow, count: number): Partition[] {
    if (count === 0) return [];
    return partitionVector(rangeParamCount(gptConfig(run.model), { from: s.from_part, to: s.to_part }), count);
  }

  private advance(run: RunRow, s: StageRow, round: MergeRoundRow): void {
    const now = this.now();
    const plan = JSON.parse(round.assignment) as RoundPlan;
    const alive = new Set(this.aliveReplicas(run.id, s.stage));
    let replicas = (JSON.parse(round.replicas) as string[]).filter((m) => alive.has(m));
    if (round.status === 'uploading') {
      const uploads = this.db.mergeUploads(run.id, s.stage, round.round);
      const complete = (m: string): boolean => uploads.filter((u) => u.miner_id === m).length === round.partitions;
      if (now - plan.phaseAt > UPLOAD_TIMEOUT_MS) {
        for (const m of replicas) if (!complete(m)) this.db.logWork(m, run.id, 'dropped', 1, now, s.stage, `no pseudo-gradient for round ${round.round}`);
        replicas = replicas.filter(complete);
      }
      if (replicas.length === 0) {
        // nobody left to merge: the stage keeps its last state
        this.finish(run, s, round.round, s.state_blob);
        return;
      }
      if (replicas.every(complete)) {
        const vanished = new Set((JSON.parse(round.replicas) as string[]).filter((m) => !replicas.includes(m)));
        plan.mergers = vanished.size ? reassign(plan.mergers, vanished, replicas) : plan.mergers;
        plan.phaseAt = now;
        this.db.updateMergeRound(run.id, s.stage, round.round, { status: 'merging', replicas: JSON.stringify(replicas), assignment: JSON.stringify(plan) });
      } else {
        this.db.updateMergeRound(run.id, s.stage, round.round, { replicas: JSON.stringify(replicas) });
      }
      return;
    }
    if (round.status === 'merging') {
      const results = this.db.mergeResults(run.id, s.stage, round.round);
      const done = new Set(results.map((r) => r.partition));
      const vanished = new Set<string>();
      for (let p = 0; p < round.partitions; p++) {
        if (done.has(p)) continue;
        for (const m of plan.mergers[p]) if (!alive.has(m) || now - plan.phaseAt > MERGE_TIMEOUT_MS) vanished.add(m);
      }
      if (vanished.size && alive.size) {
        const stillAlive = [...alive].filter((m) => !vanished.has(m));
        const pool = stillAlive.length ? stillAlive : [...alive];
        const next = reassign(plan.mergers, vanished, pool);
        // keep mergers of partitions already merged as they were
        plan.mergers = next.map((ms, p) => (done.has(p) ? plan.mergers[p] : ms));
        plan.phaseAt = now;
        this.db.updateMergeRound(run.id, s.stage, round.round, { assignment: JSON.stringify(plan) });
      }
      if (done.size === round.partitions) {
        const chosen: string[] = [];
        for (let p = 0; p < round.partitions; p++) chosen.push(results.find((r) => r.partition === p)!.blob);
        plan.chosen = chosen;
        plan.phaseAt = now;
        this.db.updateMergeRound(run.id, s.stage, round.round, { status: 'applying', assignment: JSON.stringify(plan) });
      }
      return;
    }
    if (round.status === 'applying') {
      const applied = this.applied.get(`${run.id}/${s.stage}/${round.round}`) ?? new Set();
      const state = this.stateOf(run, s, round.round);
      if (replicas.length === 0) this.finish(run, s, round.round, s.state_blob);
      else if (state && replicas.every((m) => applied.has(m))) this.finish(run, s, round.round, state);
      else if (replicas.join() !== (JSON.parse(round.replicas) as string[]).join()) {
        this.db.updateMergeRound(run.id, s.stage, round.round, { replicas: JSON.stringify(replicas) });
      }
    }
  }

  /** The state blob uploaded for a round, if any. */
  private stateOf(run: RunRow, s: StageRow, round: number): string | null {
    return this.db.mergeRound(run.id, s.stage, round)?.state_blob ?? null;
  }

  private finish(run: RunRow, s: StageRow, round: number, stateBlob: string | null): void {
    this.db.tx(() => {
      this.db.updateMergeRound(run.id, s.stage, round, { status: 'done' });
      this.db.updateStage(run.id, s.stage, { round, mode: 'training', state_blob: stateBlob, inner_steps: 0 });
      if (s.stage === 0) this.db.addRunCounters(run.id, { merges: 1 });
    });
  }

  /** A replica reports the merge rounds it has applied. */
  noteMinerRound(run: RunRow, stage: number, minerId: string, round: number): void {
    const key = `${run.id}/${stage}/${round}`;
    let set = this.applied.get(key);
    if (!set) this.applied.set(key, (set = new Set()));
    set.add(minerId);
  }

  /** What a replica should do for its stage's round, if one is running. */
  taskFor(run: RunRow, stage: number, minerId: string): MergeTask | null {
    const s = this.db.stages(run.id)[stage];
    const round = this.current(run, s);
    if (!round) return null;
    const replicas = JSON.parse(round.replicas) as string[];
    const plan = JSON.parse(round.assignment) as RoundPlan;
    const opts = JSON.parse(run.options) as RunOptions;
    const partitions = this.partitions(run, s, round.partitions);
    const member = replicas.includes(minerId);
    const task: MergeTask = {
      round: round.round,
      partitions: partitions.map((p) => ({ index: p.index, start: p.start, end: p.end })),
      upload: false,
      merge: [],
      apply: null,
      saveState: false,
      aggregator: opts.aggregator,
      outerLr: opts.outerLr ?? DEFAULT_OUTER_LR,
      outerMomentum: opts.outerMomentum ?? DEFAULT_OUTER_MOMENTUM,
    };
    if (!member) return task; // a replica that joined mid-round waits for the new state
    if (round.status === 'uploading') {
      const mine = this.db.mergeUploads(run.id, stage, round.round).filter((u) => u.miner_id === minerId).length;
      task.upload = mine < round.partitions;
    } else if (round.status === 'merging') {
      const uploads = this.db.mergeUploads(run.id, stage, round.round).filter((u) => replicas.includes(u.miner_id));
      const results = this.db.mergeResults(run.id, stage, round.round);
      for (let p = 0; p < round.partitions; p++) {
        if (!plan.mergers[p].includes(minerId)) continue;
        if (results.some((r) => r.partition === p && r.miner_id === minerId)) continue;
        task.merge.push({
          partition: p,
          inputs: uploads.filter((u) => u.partition === p).map((u) => ({ minerId: u.miner_id, blob: u.blob, samples: u.samples })),
        });
      }
    } else if (round.status === 'applying') {
      task.apply = (plan.chosen ?? []).map((blob, partition) => ({ partition, blob }));
      task.saveState = replicas[0] === minerId && !this.stateOf(run, s, round.round);
    }
    return task;
  }

  // ---- uploads ---------------------------------------------------------------

  private roundFor(runId: string, stage: number, round: number, minerId: string, status: MergeRoundRow['status']): { run: RunRow; s: StageRow; row: MergeRoundRow } {
    const run = this.db.run(runId);
    if (!run) throw new CoordinatorError(404, `unknown run ${runId}`);
    const s = this.db.stages(runId)[stage];
    if (!s) throw new CoordinatorError(404, `run ${runId} has no stage ${stage}`);
    const row = this.db.mergeRound(runId, stage, round);
    if (!row || row.status === 'done') throw new CoordinatorError(409, `round ${round} of stage ${stage} is not open`);
    if (row.status !== status) throw new CoordinatorError(409, `round ${round} of stage ${stage} is ${row.status}, not ${status}`);
    if (!(JSON.parse(row.replicas) as string[]).includes(minerId)) throw new CoordinatorError(403, `miner ${minerId} is not a replica in round ${round} of stage ${stage}`);
    return { run, s, row };
  }

  async putPseudoGradient(minerId: string, runId: string, stage: number, round: number, partition: number, samples: number, bytes: Uint8Array): Promise<string> {
    const { run, s, row } = this.roundFor(runId, stage, round, minerId, 'uploading');
    const p = this.partitions(run, s, row.partitions)[partition];
    if (!p) throw new CoordinatorError(400, `partition ${partition} outside 0..${row.partitions - 1}`);
    decodePartitionFrame(bytes, p); // validates shape, codec, checksum, finite values
    const blob = await this.blobs.put(bytes);
    this.db.putMergeUpload({ run_id: runId, stage, round, miner_id: minerId, partition, blob, samples });
    this.db.addRunCounters(runId, { bytes: bytes.length });
    return blob;
  }

  async putMerged(minerId: string, runId: string, stage: number, round: number, partition: number, bytes: Uint8Array): Promise<string> {
    const { run, s, row } = this.roundFor(runId, stage, round, minerId, 'merging');
    const plan = JSON.parse(row.assignment) as RoundPlan;
    if (!plan.mergers[partition]?.includes(minerId)) throw new CoordinatorError(403, `miner ${minerId} does not merge partition ${partition}`);
    const p = this.partitions(run, s, row.partitions)[partition];
    decodePartitionFrame(bytes, p, { codecs: ['int8-block', 'f16', 'f32'] });
    const blob = await this.blobs.put(bytes);
    this.db.tx(() => {
      this.db.putMergeResult({ run_id: runId, stage, round, partition, miner_id: minerId, blob });
      this.db.logWork(minerId, runId, 'merge', 1, this.now(), stage);
      this.db.addRunCounters(runId, { bytes: bytes.length });
    });
    return blob;
  }

  async putState(minerId: string, runId: string, stage: number, round: number, bytes: Uint8Array): Promise<string> {
    const { run, s } = this.roundFor(runId, stage, round, minerId, 'applying');
    let info;
    try {
      info = checkpointInfo(decodeSafetensors(bytes));
    } catch (err) {
      throw new CoordinatorError(400, `stage state: ${(err as Error).message}`);
    }
    if (info.from !== s.from_part || info.to !== s.to_part || info.step !== round) {
      throw new CoordinatorError(400, `stage state holds parts [${info.from}, ${info.to}) round ${info.step}; expected [${s.from_part}, ${s.to_part}) round ${round}`);
    }
    const blob = await this.blobs.put(bytes);
    this.db.updateMergeRound(run.id, stage, round, { state_blob: blob });
    this.db.addRunCounters(runId, { bytes: bytes.length });
    return blob;
  }
}
