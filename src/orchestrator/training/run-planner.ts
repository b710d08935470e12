// Runs from request to placement: a run is created 'waiting', planned onto
// free miners when enough have joined ('started'), and re-planned (same
// stages, a few miners moved) whenever miners come or go.
import { randomBytes } from 'node:crypto';
import type { CreateRunRequest } from '../../api/schemas.ts';
import { isDatasetId } from '../../data/dataset.ts';
import { DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM } from '../../merge/outer.ts';
import { SPAM_CLASSES, SPAM_MAX_FEATURES } from '../../data/spam.ts';
import { mlpCost } from '../../jobs/mlp-cost.ts';
import { modelLabel, modelParts, parseModelRef, type ModelRef } from '../../model/model-ref.ts';
import { PlanError } from '../../planner/errors.ts';
import { planPlacement, planSingleStage } from '../../planner/placement.ts';
import { rebalance } from '../../planner/rebalance.ts';
import type { MinerCapacity, Plan } from '../../planner/types.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { requireDataset } from '../jobs/datasets.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MinerRecord } from '../state/miners.ts';
import type { RunOptions, RunRecord } from '../state/runs.ts';

/** H: inner steps per replica between merges (docs/network.md: why 100). */
export const DEFAULT_MERGE_EVERY = 100;
/** Data sets every miner can load by name: text for a GPT… */
export const RUN_DATA_SETS = ['moby-dick'] as const;
/** …and tables for an MLP classifier. */
export const MLP_DATA_SETS = ['spam-assassin'] as const;

/** Why miners cannot train `model` on `data` (null: they can; an uploaded dataset is checked against its store by requireDataset). */
export function runDataProblem(model: ModelRef, data: string): string | null {
  if (model.kind === 'mlp') {
    if (!(MLP_DATA_SETS as readonly string[]).includes(data)) return `an MLP classifier trains on ${MLP_DATA_SETS.map((d) => `'${d}'`).join(', ')}, not '${data.slice(0, 80)}'`;
    if (model.config.classes !== SPAM_CLASSES.length) return `spam-assassin has ${SPAM_CLASSES.length} classes (ham, spam); the MLP has ${model.config.classes}`;
    if (model.config.inputs > SPAM_MAX_FEATURES) return `spam-assassin's features are hashed into as many buckets as the MLP has inputs, at most ${SPAM_MAX_FEATURES}; the MLP has ${model.config.inputs}`;
    return null;
  }
  if (!isDatasetId(data) && !(RUN_DATA_SETS as readonly string[]).includes(data)) {
    return `data set '${data.slice(0, 80)}' is not available to miners (use ${RUN_DATA_SETS.map((d) => `'${d}'`).join(', ')} or an uploaded dataset)`;
  }
  // the corpora are bytes: a smaller vocabulary would index past the embedding
  if (model.config.vocabSize !== 256) return `the data is bytes: a GPT trained on it has a vocabulary of 256, not ${model.config.vocabSize}`;
  return null;
}

/** The placement of `model` on `miners`: cut into stages (a GPT), or one stage holding it whole (an MLP). Throws PlanError. */
function planRun(model: ModelRef, miners: MinerCapacity[], stages: number | undefined, batchSize: number, slots: number): Plan {
  if (model.kind === 'mlp') return planSingleStage({ cost: mlpCost(model.config, batchSize), miners, label: `the ${modelLabel(model)}` });
  return planPlacement({ config: model.config, miners, stages, batchSize, slots });
}
/** Runs one developer may have that have not ended. */
export const MAX_ACTIVE_RUNS_PER_OWNER = 4;
/** Runs waiting for miners, network-wide: past it new runs are refused until some start or are cancelled. */
export const MAX_WAITING_RUNS = 64;

export class RunPlanner {
  constructor(
    private readonly state: OrchestratorState,
    /** activation slots each miner keeps (the planner sizes activation memory with it) */
    private readonly slots: number,
    private readonly now: () => number,
    /** a miner was moved off a stage of a run (or off the run): the work it held there is released */
    private readonly onMoved: (runId: string, minerId: string) => void = () => {},
  ) {}

  /** Validates a request of `owner` and records the run, then plans it if enough miners are free (of `pool` only, when given). */
  /** `from`: where a job's later run starts (the whole-model checkpoint blob, the shards already trained). */
  create(req: CreateRunRequest, owner: string, pool?: readonly string[], from?: { init: string | null; shardBase: number }): RunRecord {
    if (this.state.runs.activeOf(owner).length >= MAX_ACTIVE_RUNS_PER_OWNER) {
      throw new NimbleError('too_many_runs', `${owner} has ${MAX_ACTIVE_RUNS_PER_OWNER} runs that have not ended; cancel one first`, 429);
    }
    if (this.state.runs.countWaiting() >= MAX_WAITING_RUNS) throw new NimbleError('overloaded', `${MAX_WAITING_RUNS} runs are waiting for miners; try again later`);
    let model: ModelRef;
    try {
      model = parseModelRef(req.model);
    } catch (err) {
      throw new NimbleError('invalid', (err as Error).message);
    }
    const dataProblem = runDataProblem(model, req.data);
    if (dataProblem) throw new NimbleError('invalid', dataProblem);
    // an uploaded dataset (GPT runs): stored by the run's owner, large enough for the context
    if (model.kind === 'gpt' && isDatasetId(req.data)) requireDataset(this.state, req.data, owner, model.config.contextLength);
    if (req.stages !== undefined && req.stages > modelParts(model)) {
      throw new NimbleError(
        'invalid',
        model.kind === 'mlp'
          ? `an MLP classifier trains as one stage (its replicas merge); it cannot be cut into ${req.stages} stages`
          : `${req.model} has ${modelParts(model)} parts; it cannot be cut into ${req.stages} stages`,
      );
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
      ...(pool ? { pool: [...pool] } : {}),
      ...(from?.init ? { init: from.init } : {}),
      ...(from?.shardBase ? { shardBase: from.shardBase } : {}),
    };
    this.state.runs.insert(
      { id, owner, model: req.model, data: req.data, steps: req.steps, batchSize: req.batchSize ?? 12, mergeEvery: req.mergeEvery ?? DEFAULT_MERGE_EVERY, seed: req.seed ?? 1337, options },
      this.now(),
    );
    this.tryStart(this.state.runs.get(id)!);
    return this.state.runs.get(id)!;
  }

  /** Plans a waiting run if enough miners are free; otherwise says why it waits. */
  tryStart(run: RunRecord): void {
    if (run.status !== 'waiting') return;
    const miners = this.freeMiners(run.id);
    if (miners.length < run.options.minMiners) {
      this.state.runs.setMessage(run.id, `waiting for miners: ${miners.length} of ${run.options.minMiners} available`);
      return;
    }
    let plan: Plan;
    try {
      plan = planRun(parseModelRef(run.model), capacities(miners), run.options.requestedStages ?? undefined, run.batchSize, this.slots);
    } catch (err) {
      if (!(err instanceof PlanError)) throw err;
      this.state.runs.setMessage(run.id, `cannot plan yet: ${err.message}`);
      return;
    }
    const now = this.now();
    this.state.tx(() => {
      if (this.state.runs.stages(run.id).length === 0) this.state.runs.insertStages(run.id, plan.stages.map((s) => s.range));
      this.writeAssignments(run.id, plan, now);
      this.state.runs.start(run.id, plan, now);
    });
  }

  /** Limits a run to `pool` (null: any free miner) and plans again. */
  setPool(runId: string, pool: readonly string[] | null): void {
    const run = this.state.runs.get(runId);
    if (!run) return;
    const { pool: _old, ...rest } = run.options;
    this.state.runs.setOptions(runId, pool ? { ...rest, pool: [...pool] } : rest);
    this.replanAll();
  }

  /** Miners came or went: start waiting runs, rebalance running ones. */
  replanAll(): void {
    for (const run of this.state.runs.active()) {
      if (run.status === 'waiting') this.tryStart(run);
      else if (run.plan) this.replan(run, run.plan);
    }
  }

  private replan(run: RunRecord, previous: Plan): void {
    const miners = this.freeMiners(run.id);
    let next: Plan;
    let stalled: string | null = null;
    try {
      next = rebalance(previous, capacities(miners)).plan;
    } catch (err) {
      if (!(err instanceof PlanError)) throw err;
      // a stage has no replica left: keep the cut, wait for miners
      const alive = new Set(miners.map((m) => m.id));
      next = { ...previous, stages: previous.stages.map((s) => ({ ...s, miners: s.miners.filter((m) => alive.has(m)) })) };
      stalled = `stalled: ${err.message}`;
    }
    this.state.tx(() => {
      this.writeAssignments(run.id, next, this.now());
      this.state.runs.setPlan(run.id, next);
      if (next.stages.every((s) => s.miners.length > 0)) this.state.runs.setMessage(run.id, null);
      else if (stalled) this.state.runs.setMessage(run.id, stalled);
    });
  }

  /** Miners that train, are alive, not holding a stage of another active run or of a deployment, and in the run's pool if it has one. */
  private freeMiners(runId: string): MinerRecord[] {
    const busy = this.state.deployments.busyMiners();
    for (const r of this.state.runs.active()) {
      if (r.id === runId) continue;
      for (const a of this.state.runs.assignments(r.id)) busy.add(a.minerId);
    }
    const pool = this.state.runs.get(runId)?.options.pool;
    const allowed = pool ? new Set(pool) : null;
    return this.state.miners.list(true).filter((m) => m.serve !== 'inference' && !busy.has(m.id) && (!allowed || allowed.has(m.id)));
  }

  /** Alive miners that train, holding no stage of an active run or of a deployment. */
  idleMiners(): MinerRecord[] {
    const busy = new Set([...this.state.runs.active().flatMap((r) => this.state.runs.assignments(r.id).map((a) => a.minerId)), ...this.state.deployments.busyMiners()]);
    return this.state.miners.list(true).filter((m) => m.serve !== 'inference' && !busy.has(m.id));
  }

  /** Makes the assignments table say what the plan says; a miner moved to another stage or off the run lets go of the work it held. */
  private writeAssignments(runId: string, plan: Plan, now: number): void {
    const current = new Map(this.state.runs.assignments(runId).map((a) => [a.minerId, a.stage]));
    const keep = new Set<string>();
    plan.stages.forEach((s, stage) => {
      for (const m of s.miners) {
        keep.add(m);
        if (current.get(m) === stage) continue;
        this.state.runs.assign(runId, stage, m, now);
        if (current.has(m)) this.onMoved(runId, m);
      }
    });
    for (const m of current.keys()) {
      if (keep.has(m)) continue;
      this.state.runs.unassign(runId, m);
      this.onMoved(runId, m);
    }
  }
}

function capacities(miners: readonly MinerRecord[]): MinerCapacity[] {
  return miners.map((m) => ({ id: m.id, gflops: m.gflops, memoryBytes: m.memoryBytes }));
}
