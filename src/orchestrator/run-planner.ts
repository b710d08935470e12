// Runs from request to placement: a run is created 'waiting', planned onto
// free miners when enough have joined ('started'), and re-planned (same
// stages, a few miners moved) whenever miners come or go.
import { randomBytes } from 'node:crypto';
import type { CreateRunRequest } from '../api/schemas.ts';
import { DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM } from '../merge/outer.ts';
import { gptConfig, type GptConfig } from '../model/config.ts';
import { partCount } from '../model/gpt.ts';
import { PlanError } from '../planner/errors.ts';
import { planPlacement } from '../planner/placement.ts';
import { rebalance } from '../planner/rebalance.ts';
import type { MinerCapacity, Plan } from '../planner/types.ts';
import { NimbleError } from '../protocol/errors.ts';
import type { OrchestratorState } from './state/index.ts';
import type { MinerRecord } from './state/miners.ts';
import type { RunOptions, RunRecord } from './state/runs.ts';

/** H: inner steps per replica between merges (docs/network.md: why 100). */
export const DEFAULT_MERGE_EVERY = 100;
/** Data sets every miner can load by name. */
export const RUN_DATA_SETS = ['moby-dick'] as const;
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
    let config: GptConfig;
    try {
      config = gptConfig(req.model);
    } catch (err) {
      throw new NimbleError('invalid', (err as Error).message);
    }
    if (!(RUN_DATA_SETS as readonly string[]).includes(req.data)) {
      throw new NimbleError('invalid', `data set '${req.data}' is not available to miners (use ${RUN_DATA_SETS.map((d) => `'${d}'`).join(', ')})`);
    }
    if (req.stages !== undefined && req.stages > partCount(config)) {
      throw new NimbleError('invalid', `${req.model} has ${partCount(config)} parts; it cannot be cut into ${req.stages} stages`);
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
      plan = planPlacement({
        config: gptConfig(run.model),
        miners: capacities(miners),
        stages: run.options.requestedStages ?? undefined,
        batchSize: run.batchSize,
        slots: this.slots,
      });
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

  /** Miners that are alive, not holding a stage of another active run, and in the run's pool if it has one. */
  private freeMiners(runId: string): MinerRecord[] {
    const busy = new Set<string>();
    for (const r of this.state.runs.active()) {
      if (r.id === runId) continue;
      for (const a of this.state.runs.assignments(r.id)) busy.add(a.minerId);
    }
    const pool = this.state.runs.get(runId)?.options.pool;
    const allowed = pool ? new Set(pool) : null;
    return this.state.miners.list(true).filter((m) => !busy.has(m.id) && (!allowed || allowed.has(m.id)));
  }

  /** Alive miners holding no stage of an active run. */
  idleMiners(): MinerRecord[] {
    const busy = new Set(this.state.runs.active().flatMap((r) => this.state.runs.assignments(r.id).map((a) => a.minerId)));
    return this.state.miners.list(true).filter((m) => !busy.has(m.id));
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
