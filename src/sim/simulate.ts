// The simulator's entry: draws the miners, plans with the real planner, runs
// the events over simulated time (no wall-clock sleeps) and reports.
import { isMemoryModelName, MEMORY_MODELS } from './memory-models.ts';
import { COORDINATOR_DEFAULTS } from '../orchestrator/training/coordinator.ts';
import { DEFAULT_EMISSION } from '../orchestrator/rewards/epochs.ts';
import { DEFAULT_MERGE_EVERY } from '../orchestrator/training/run-planner.ts';
import { activationFrameBytes } from './costs.ts';
import { applyPlan, askReplan, join, leave, maybeMerge, merged, noticed, planFresh, ready, replan } from './control.ts';
import { beat, hostEvent, reply } from './host-miner.ts';
import { arrive, computed, issueTo, reported, requeue, wakeStageZero } from './flow.ts';
import { DEFAULT_HARDWARE } from './hardware.ts';
import { ORCHESTRATOR_TICK_MS } from './merge-time.ts';
import { simModel } from './models.ts';
import { buildReport } from './report.ts';
import { ROUTE_RULES, type SimOptions, type SimReport } from './types.ts';
import { World } from './world.ts';

/** Options with the network's defaults filled in. */
export function simOptions(input: Partial<SimOptions> & { modelName: string; miners: number }): SimOptions {
  const o: SimOptions = {
    config: input.config ?? simModel(input.modelName),
    hardware: DEFAULT_HARDWARE,
    hours: 1,
    churn: 1,
    seed: 1,
    batchSize: 12,
    slots: COORDINATOR_DEFAULTS.slots,
    mergeEvery: DEFAULT_MERGE_EVERY,
    deadlineMs: COORDINATOR_DEFAULTS.microbatchDeadlineMs,
    heartbeatMs: COORDINATOR_DEFAULTS.heartbeatMs,
    minerTimeoutMs: COORDINATOR_DEFAULTS.minerTimeoutMs,
    tickMs: ORCHESTRATOR_TICK_MS,
    codec: 'f16',
    activationRatio: 1,
    route: 'weighted',
    memoryModel: 'engine',
    rejoinMs: 10 * 60_000,
    epochMs: 3_600_000,
    emission: DEFAULT_EMISSION,
    samples: 120,
    maxEvents: 200_000_000,
    ...input,
  };
  check(Number.isInteger(o.miners) && o.miners >= 1, `miners must be a positive integer, got ${o.miners}`);
  check(o.hours > 0 && o.hours <= 24 * 365, `hours must be in (0, 8760], got ${o.hours}`);
  check(o.churn >= 0 && Number.isFinite(o.churn), `churn must be a number ≥ 0, got ${o.churn}`);
  check(Number.isInteger(o.batchSize) && o.batchSize >= 1, `batchSize must be a positive integer, got ${o.batchSize}`);
  check(Number.isInteger(o.mergeEvery) && o.mergeEvery >= 1, `mergeEvery must be a positive integer, got ${o.mergeEvery}`);
  check(o.deadlineMs > 0, `deadline must be positive, got ${o.deadlineMs}`);
  check(o.tickMs > 0 && o.heartbeatMs > 0, `tick and heartbeat must be positive, got ${o.tickMs} and ${o.heartbeatMs}`);
  check(Number.isInteger(o.slots) && o.slots >= 1 && o.slots <= 256, `slots must be an integer in [1, 256], got ${o.slots}`);
  check(o.activationRatio >= 1 && Number.isFinite(o.activationRatio), `activation compression ratio must be a finite number ≥ 1, got ${o.activationRatio}`);
  check(ROUTE_RULES.includes(o.route), `route must be one of ${ROUTE_RULES.join(', ')}, got ${o.route}`);
  check(isMemoryModelName(o.memoryModel), `memory model must be one of ${Object.keys(MEMORY_MODELS).join(', ')}, got ${o.memoryModel}`);
  check(!o.host || (Number.isInteger(o.host.cores) && o.host.cores >= 1), `a shared host needs a positive whole number of cores, got ${o.host?.cores}`);
  check(
    !o.host || [o.host.orchestratorMsPerMicrobatch, o.host.orchestratorMsPerHeartbeat ?? 0, o.host.minerMsPerHeartbeat ?? 0, ...o.host.hopOverheadMs].every((x) => x >= 0 && Number.isFinite(x)),
    'a shared host\'s overheads must be finite numbers ≥ 0',
  );
  check(!o.host || o.host.crowdedRate === undefined || (o.host.crowdedRate > 0 && o.host.crowdedRate <= 1), `a shared host's crowded rate must be in (0, 1], got ${o.host?.crowdedRate}`);
  check(!o.host || o.host.jobJitter === undefined || (o.host.jobJitter >= 0 && o.host.jobJitter <= 1), `a shared host's job jitter must be a coefficient of variation in [0, 1], got ${o.host?.jobJitter}`);
  check(!o.mergeWork || Object.values(o.mergeWork).every((x) => x >= 0 && Number.isFinite(x)), 'a merge round\'s compute per value must be finite numbers ≥ 0');
  check(o.mergeBytesPerParam === undefined || o.mergeBytesPerParam > 0, `merge bytes per parameter must be positive, got ${o.mergeBytesPerParam}`);
  return o;
}

function check(ok: boolean, message: string): void {
  if (!ok) throw new RangeError(message);
}

/** Runs one simulation. Throws PlanError when the real planner cannot place the model on the drawn miners. */
export function simulate(options: SimOptions): SimReport {
  return simulateWorld(options).report;
}

/** simulate, also returning the final state (for tests that check invariants). */
export function simulateWorld(options: SimOptions): { world: World; report: SimReport } {
  const w = new World(options);
  for (let i = 0; i < options.miners; i++) join(w);
  const plan = planFresh(w);
  applyPlan(w, plan);
  w.activationBytes = activationFrameBytes(options.config, options.batchSize, options.codec, options.activationRatio);
  wakeStageZero(w);
  const initial = plan;
  for (;;) {
    if (w.events.peekTime() >= w.horizonMs) break;
    const next = w.events.pop();
    if (!next) break;
    if (++w.counters.events > options.maxEvents) {
      throw new RangeError(`more than ${options.maxEvents} events by simulated ${(next.at / 60_000).toFixed(1)} min: simulate fewer hours or miners, or allow more events (--max-events)`);
    }
    w.now = next.at;
    const e = next.event;
    switch (e.type) {
      case 'issue':
        issueTo(w, w.miners[e.miner]);
        break;
      case 'computed':
        computed(w, w.miners[e.miner], e.job);
        break;
      case 'arrive':
        arrive(w, w.miners[e.miner], e.job, e.from);
        break;
      case 'deadline': {
        const mb = w.microbatches[e.mb];
        if (mb.status === 'issued' && mb.attempt === e.attempt) requeue(w, mb, mb.holder, 'deadline');
        break;
      }
      case 'leave':
        leave(w, w.miners[e.miner]);
        break;
      case 'noticed':
        noticed(w, w.miners[e.miner]);
        break;
      case 'join':
        join(w);
        w.counters.joined++;
        askReplan(w);
        break;
      case 'ready':
        ready(w, w.miners[e.miner]);
        break;
      case 'replan':
        replan(w);
        break;
      case 'merged':
        merged(w);
        break;
      case 'host':
        hostEvent(w, e.version);
        break;
      case 'reported':
        reported(w, e.mb, e.attempt);
        break;
      case 'beat':
        beat(w, w.miners[e.miner]);
        break;
      case 'reply':
        reply(w, w.miners[e.miner]);
        break;
    }
    maybeMerge(w);
  }
  w.finish();
  return { world: w, report: buildReport(w, initial) };
}
