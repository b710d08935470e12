// What happens around the microbatches: miners leaving and joining (each
// stays an exponential time with its class's mean session, scaled by
// --churn; a departed miner's place is taken by a new one drawn from the
// table after an exponential delay), the orchestrator noticing the departed
// after minerTimeoutMs and re-issuing what they owed, replanning with the
// real rebalance (falling back to a fresh planPlacement when a stage cannot
// be refilled), replicas downloading their stage's state before they are
// routed to, and merge rounds (all stages at once, once the pipeline has
// drained, as src/orchestrator/training/merges.ts tick does).
import { PlanError } from '../planner/errors.ts';
import { planPlacement } from '../planner/placement.ts';
import { rebalance } from '../planner/rebalance.ts';
import { MEMORY_MODELS } from './memory-models.ts';
import type { MinerCapacity, Plan } from '../planner/types.ts';
import { MERGE_REDUNDANCY, STATE_BYTES_PER_PARAM } from './costs.ts';
import { startBeats } from './host-miner.ts';
import { owes, requeue, tryStart, unaccounted, wakeStageZero } from './flow.ts';
import { orchestratorRoundMs, stageMergeTime } from './merge-time.ts';
import type { SimMiner } from './types.ts';
import type { World } from './world.ts';

/** Replans are batched: changes within this long are planned together. */
export const REPLAN_BATCH_MS = 5000;

/** A miner arrives now: it stays an exponential session, then leaves. */
export function join(w: World): SimMiner {
  const m = w.addMiner();
  if (w.host) startBeats(w, m);
  if (w.options.churn > 0) w.schedule(w.now + w.rng.exponential((m.sessionHours * 3_600_000) / w.options.churn), { type: 'leave', miner: m.index });
  return m;
}

/** The miner leaves without a word; the orchestrator notices after minerTimeoutMs. */
export function leave(w: World, m: SimMiner): void {
  if (!m.alive) return;
  m.alive = false;
  m.leftAt = w.now;
  m.queue.length = 0;
  if (m.busyUntil >= 0) {
    w.counters.wastedComputeMs += w.now - m.busyFrom;
    if (w.host?.has(m.index)) {
      // working on a shared host: its work so far counts, and the rest of it no longer takes a share of the cores
      w.host.stop(m.index, w.now);
      w.scheduleHost();
      m.busyMs += w.now - m.busyFrom;
      w.timeline.addBusy(m.busyFrom, w.now);
    } else m.busyMs -= Math.max(0, m.workUntil - w.now);
  }
  w.counters.left++;
  w.setAlive(w.aliveCount - 1);
  w.schedule(w.now + w.options.minerTimeoutMs, { type: 'noticed', miner: m.index });
  w.schedule(w.now + w.rng.exponential(w.options.rejoinMs), { type: 'join' });
}

/** The orchestrator sees the miner gone: what it owed goes back (charged to it), and the plan is redone. */
export function noticed(w: World, m: SimMiner): void {
  m.gone = true;
  for (const id of [...w.issued]) {
    const mb = w.microbatches[id];
    if (unaccounted(w, mb, m)) requeue(w, mb, m.index, 'churn');
  }
  askReplan(w);
}

export function askReplan(w: World): void {
  if (w.replanScheduled) return;
  w.replanScheduled = true;
  w.schedule(w.now + REPLAN_BATCH_MS, { type: 'replan' });
}

/** The miners the orchestrator knows: alive, or departed but not yet noticed. */
function capacities(w: World): MinerCapacity[] {
  return w.miners.filter((m) => !m.gone).map((m) => ({ id: m.id, gflops: m.gflops, memoryBytes: m.memoryBytes }));
}

/** The first plan, or a fresh one: the real planner over the miners the orchestrator knows. */
export function planFresh(w: World): Plan {
  const { config, batchSize, slots, stages, memoryModel } = w.options;
  return planPlacement({ config, miners: capacities(w), stages, batchSize, slots, memory: MEMORY_MODELS[memoryModel] });
}

/** Applies a plan: miners whose stage changed let go of their microbatches and download their new stage. */
export function applyPlan(w: World, plan: Plan): void {
  const first = w.plan === null;
  w.plan = plan;
  w.flops = plan.stages.map((s) => s.flopsPerToken);
  w.members = plan.stages.map((s) => new Set(s.miners.map((id) => w.byId.get(id)!)));
  w.memberLists = w.members.map((set) => {
    const list = [...set];
    return { list, maxGflops: list.reduce((max, i) => Math.max(max, w.miners[i].gflops), 0) };
  });
  const stageOf = new Map<number, number>();
  w.members.forEach((set, s) => set.forEach((i) => stageOf.set(i, s)));
  for (const m of w.miners) {
    const to = stageOf.get(m.index) ?? -1;
    if (to === m.stage || m.gone) continue;
    if (m.stage >= 0) {
      for (const id of [...w.issued]) if (owes(w.microbatches[id], m.index)) requeue(w, w.microbatches[id], -1, 'moved');
      m.held.clear();
      m.queue.length = 0;
    }
    if (!first) w.counters.moves++;
    m.stage = to;
    if (to < 0) continue;
    const bytes = plan.stages[to].params * STATE_BYTES_PER_PARAM;
    // the first plan starts from weights every miner makes from the seed; later ones download the stage's state
    m.readyAt = first ? 0 : w.now + (bytes * 8) / (m.downMbps * 1e6) * 1000 + 2 * m.latencyMs;
    w.schedule(m.readyAt, { type: 'ready', miner: m.index });
  }
}

/** Batched replanning: the real rebalance keeps the cuts; a fresh plan when it cannot. */
export function replan(w: World): void {
  w.replanScheduled = false;
  w.counters.replans++;
  const miners = capacities(w);
  try {
    if (!w.plan) throw new PlanError('no plan yet');
    applyPlan(w, rebalance(w.plan, miners).plan);
    w.stalled = null;
  } catch (e) {
    if (!(e instanceof PlanError)) throw e;
    try {
      w.counters.fullReplans++;
      applyPlan(w, planFresh(w));
      w.stalled = null;
    } catch (e2) {
      if (!(e2 instanceof PlanError)) throw e2;
      w.stalled = e2.message;
    }
  }
  wakeStageZero(w);
}

/** A replica finished downloading its stage. */
export function ready(w: World, m: SimMiner): void {
  if (!m.alive || m.stage < 0 || m.readyAt > w.now) return;
  tryStart(w, m);
  wakeStageZero(w);
}

/**
 * Starts the merge round once a merge is due and nothing is in flight: the
 * orchestrator counted the last microbatch's report on a heartbeat (the
 * event that emptied `issued`) and opens the round at its next tick; the
 * round's time (opened → done) is counted from there. Every stage's round
 * runs on the protocol's clocks (./merge-time.ts) from the same opening; the
 * slowest sets when training resumes.
 */
export function maybeMerge(w: World): void {
  if (!w.draining || w.merging || w.issued.size > 0) return;
  w.merging = true;
  const opensIn = w.options.tickMs * w.mergeRng.next();
  const stages = w.members.map((set) => [...set].map((i) => w.miners[i]).filter((m) => m.alive && !m.gone && m.readyAt <= w.now));
  const work = w.options.mergeWork;
  const orchestrator = work ? orchestratorRoundMs(stages.map((replicas, s) => ({ params: w.plan!.stages[s].params, replicas: replicas.length })), work) : undefined;
  let longest = 0;
  stages.forEach((replicas, s) => {
    const merge = stageMergeTime(w.plan!.stages[s].params, replicas, { heartbeatMs: w.options.heartbeatMs, bytesPerParam: w.options.mergeBytesPerParam, tickMs: w.options.tickMs, work, orchestrator, rng: w.mergeRng });
    longest = Math.max(longest, merge.ms);
    w.counters.mergeBytes += merge.bytesTotal;
    if (merge.bytesPerReplica > 0) w.counters.mergeBytesPerReplica.push(merge.bytesPerReplica);
    // each partition is merged by MERGE_REDUNDANCY replicas: one merge unit each, spread evenly
    for (const m of replicas) if (merge.partitions > 0) w.ledger.log(w.now, m.id, 'merge', s, (MERGE_REDUNDANCY * merge.partitions) / replicas.length);
  });
  w.counters.mergeMs.push(longest);
  w.schedule(w.now + opensIn + longest, { type: 'merged' });
}

/** Every stage holds its merged weights: training resumes. */
export function merged(w: World): void {
  w.merging = false;
  w.draining = false;
  w.innerSteps = 0;
  w.counters.mergeRounds++;
  wakeStageZero(w);
}
