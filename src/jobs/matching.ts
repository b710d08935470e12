// Sharing the miner pool among several jobs: which waiting job starts on
// which free miners, and why the others wait. Pure: the caller brings the
// queue, the live miners and the time, and applies the decisions.
//
// Rules:
// - Running jobs keep their miners: there is no preemption in this version
//   (a running job's miners are not free, and a richer newcomer waits for
//   them). Replacing departed miners of a running job is the run planner's
//   rebalance (src/planner/rebalance.ts), not this.
// - Waiting jobs are served in order of effective priority, highest first
//   (ties: queued earlier, then id). Each gets planJob over the miners still
//   free: a small job lands on the smallest miners that fit it, not the
//   fastest (leaving large miners for large jobs), a large job or a tight
//   deadline gets a group of stages × replicas. A job starts when some layout
//   fits the free miners (it may then miss its deadline: the plan says so).
// - A job offering less than the network's price waits.
// - Aging: priority = offer + networkPrice · waited / AGING_MS. Every job
//   gains the network's price every AGING_MS it waits, whatever it offers,
//   so two waiting jobs keep their gap: a job never falls behind a job queued
//   after it once it is ahead. (A multiplicative rule, offer · (1 + waited /
//   AGING_MS), would let a richer later job overtake an older one that had
//   passed it: its priority grows faster.)
// - Reservation: the highest-priority waiting job that fits the whole pool
//   (free and held miners) but not the free miners reserves the free miners
//   of its plan on the whole pool; jobs behind it may not take them. It then
//   starts as soon as the running jobs holding the rest of its miners end,
//   instead of watching smaller jobs take every miner that frees up. Only one
//   job reserves at a time, so at most one plan's miners sit idle. A job that
//   fits nothing, even the whole pool, reserves nothing: it waits for miners
//   to join, and says so with the numbers.
//
// The bound (no starvation). A job offering p, queued at t, is outranked by a
// job queued later offering q only if q > p + networkPrice · (that job's
// arrival − t) / AGING_MS. So once it has waited
//   W = AGING_MS · (qmax − p) / networkPrice,
// qmax being the highest offer of any later job, no job queued after that can
// ever be ahead of it: only the finitely many jobs queued before are, and
// each of them, as the head of the queue, reserves and starts when the
// running jobs it needs end (every running job ends by its timeout). With
// AGING_MS = 30 min, a job offering the network price waits at most 30 min
// for newcomers offering twice the price, 1 h for three times, and so on,
// plus the running time of the jobs it waits behind.
import { DEFAULT_PRICING, planJob, type JobLayout, type JobPlan, type JobPricing, type PoolMiner } from './plan.ts';
import type { ResolvedJob } from './spec.ts';

/** A waiting job gains the network's price of priority every AGING_MS it waits. */
export const AGING_MS = 30 * 60_000;

/** A job in the queue, waiting or running. */
export interface QueuedJob {
  id: string;
  job: ResolvedJob;
  /** NIM per petaflop the developer offers; at least the network's price */
  offerNimPerPetaflop: number;
  /** when it was queued, ms */
  queuedAt: number;
  /** the miners it holds while it runs; empty or absent while it waits */
  miners?: string[];
}

/** What happens to a job this round. */
export type MatchDecision =
  | {
      id: string;
      action: 'start';
      priority: number;
      /** the miners it starts on, stage by stage in the layout's order */
      miners: string[];
      layout: JobLayout;
      /** the plan on the miners that were free for it, at the price it offers */
      plan: JobPlan;
    }
  | {
      id: string;
      action: 'keep';
      /** the miners it holds that are still live */
      miners: string[];
      /** the miners it held that are no longer live */
      missing: string[];
    }
  | {
      id: string;
      action: 'wait';
      priority: number;
      reason: string;
      /** free miners kept for it (the head of the queue only) */
      reserved: string[];
    };

export interface MatchResult {
  /** running jobs first (keep), then waiting jobs in priority order (start or wait) */
  decisions: MatchDecision[];
  /** free miners reserved for a waiting job */
  reserved: string[];
  /** free miners no job uses or reserves */
  idle: string[];
}

/** A waiting job's effective priority: its offer plus the network's price for every AGING_MS waited. */
export function effectivePriority(offerNimPerPetaflop: number, waitedMs: number, pricing: JobPricing = DEFAULT_PRICING): number {
  return offerNimPerPetaflop + (pricing.nimPerPetaflop * Math.max(0, waitedMs)) / AGING_MS;
}

/**
 * Decides, for every job, whether it keeps its miners (running), starts (on
 * which miners, with which layout) or waits (and why). See the file header
 * for the rules. Throws RangeError on inconsistent input (a job id twice, a
 * miner held by two jobs): those are the caller's bugs.
 */
export function matchJobs(jobs: readonly QueuedJob[], miners: readonly PoolMiner[], now: number, pricing: JobPricing = DEFAULT_PRICING): MatchResult {
  const live = new Map<string, PoolMiner>();
  for (const m of miners) if (!live.has(m.id)) live.set(m.id, m);
  const ids = new Set<string>();
  const holder = new Map<string, string>();
  for (const q of jobs) {
    if (ids.has(q.id)) throw new RangeError(`job ${q.id} is listed twice`);
    ids.add(q.id);
    for (const m of q.miners ?? []) {
      const other = holder.get(m);
      if (other !== undefined) throw new RangeError(`miner ${m} is held by both ${other} and ${q.id}`);
      holder.set(m, q.id);
    }
  }

  const decisions: MatchDecision[] = [];
  for (const q of jobs) {
    if (!q.miners || q.miners.length === 0) continue;
    decisions.push({ id: q.id, action: 'keep', miners: q.miners.filter((m) => live.has(m)), missing: q.miners.filter((m) => !live.has(m)) });
  }
  const free = new Set([...live.keys()].filter((m) => !holder.has(m)));
  const reserved = new Set<string>();
  let reservedFor: string | null = null;

  const waiting = jobs
    .filter((q) => !q.miners || q.miners.length === 0)
    .map((q) => ({ q, priority: effectivePriority(q.offerNimPerPetaflop, now - q.queuedAt, pricing) }))
    .sort((a, b) => b.priority - a.priority || a.q.queuedAt - b.q.queuedAt || (a.q.id < b.q.id ? -1 : a.q.id > b.q.id ? 1 : 0));

  for (const { q, priority } of waiting) {
    const wait = (reason: string, kept: string[] = []): void => void decisions.push({ id: q.id, action: 'wait', priority, reason, reserved: kept });
    if (!(q.offerNimPerPetaflop >= pricing.nimPerPetaflop)) {
      wait(`offers ${q.offerNimPerPetaflop} NIM per PFLOP, below the network's ${pricing.nimPerPetaflop}`);
      continue;
    }
    const price: JobPricing = { nimPerPetaflop: q.offerNimPerPetaflop };
    const available = [...free].filter((m) => !reserved.has(m)).map((m) => live.get(m)!);
    const plan = planJob(q.job, available, price);
    if (plan.chosen) {
      const ids = plan.chosen.assignment.flatMap((s) => s.miners);
      for (const m of ids) {
        free.delete(m);
        holder.set(m, q.id);
      }
      decisions.push({ id: q.id, action: 'start', priority, miners: ids, layout: plan.chosen, plan });
      continue;
    }
    const whole = planJob(q.job, [...live.values()], price);
    if (!whole.chosen) {
      wait(`fits nothing in the pool: ${whole.reason}`);
      continue;
    }
    const onFree = plural(available.length, 'free miner');
    if (reservedFor !== null) {
      wait(`does not fit the ${onFree} (${reserved.size} more are reserved for ${reservedFor}, ahead of it); it fits the whole pool and waits its turn`);
      continue;
    }
    const want = whole.chosen.assignment.flatMap((s) => s.miners);
    const kept = want.filter((m) => free.has(m) && !reserved.has(m));
    const busy = [...new Set(want.filter((m) => holder.has(m)).map((m) => holder.get(m)!))].sort();
    for (const m of kept) reserved.add(m);
    reservedFor = q.id;
    const shape = `${whole.chosen.stages} × ${whole.chosen.replicas}`;
    const reserving = kept.length > 0 ? `; ${plural(kept.length, 'free miner')} reserved for it` : '';
    wait(`does not fit the ${onFree}; its plan on the whole pool (${shape} on ${plural(want.length, 'miner')}) waits for miners held by ${busy.join(', ')}${reserving}`, kept);
  }

  return {
    decisions,
    reserved: [...reserved],
    idle: [...free].filter((m) => !reserved.has(m)),
  };
}


function plural(n: number, what: string): string {
  return `${n} ${what}${n === 1 ? '' : 's'}`;
}

/** A job waiting for the one miner of its default assignment (src/orchestrator/jobs/jobs.ts). */
export interface WaitingForOne {
  id: string;
  /** NIM per PFLOP offered (null: the network's price) */
  offer: number | null;
  queuedAt: number;
  /** memory one miner needs to hold the whole model */
  needBytes: number;
}

export interface OnePlacement {
  /** the job placed on its miner, in the order they were served */
  placed: { id: string; miner: string }[];
  /** why the others wait */
  waiting: { id: string; reason: string }[];
}

/**
 * The default assignment for several waiting jobs at once: served in order of
 * effective priority (the offer, aged as above: no job starves), each given
 * the idle miner with the least memory that holds it (the slower of equals),
 * so small jobs leave big miners to big jobs. A job offering less than the
 * network's price waits. `alive`: every live miner, to say why a job waits.
 */
export function placeOnOneMiner(
  jobs: readonly WaitingForOne[],
  idle: readonly PoolMiner[],
  alive: readonly PoolMiner[],
  now: number,
  pricing: JobPricing = DEFAULT_PRICING,
): OnePlacement {
  const free = [...idle].sort((a, b) => a.memoryBytes - b.memoryBytes || a.gflops - b.gflops || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const order = jobs
    .map((j) => ({ j, priority: effectivePriority(j.offer ?? pricing.nimPerPetaflop, now - j.queuedAt, pricing) }))
    .sort((a, b) => b.priority - a.priority || a.j.queuedAt - b.j.queuedAt || (a.j.id < b.j.id ? -1 : a.j.id > b.j.id ? 1 : 0));
  const out: OnePlacement = { placed: [], waiting: [] };
  for (const { j } of order) {
    const offer = j.offer ?? pricing.nimPerPetaflop;
    if (offer < pricing.nimPerPetaflop) {
      out.waiting.push({ id: j.id, reason: `offers ${offer} NIM per PFLOP, below the network's ${pricing.nimPerPetaflop}` });
      continue;
    }
    const i = free.findIndex((m) => m.memoryBytes >= j.needBytes);
    if (i >= 0) {
      out.placed.push({ id: j.id, miner: free[i].id });
      free.splice(i, 1);
      continue;
    }
    const holders = alive.filter((m) => m.memoryBytes >= j.needBytes).length;
    out.waiting.push({
      id: j.id,
      reason: holders === 0 ? 'waiting for an idle miner that holds the whole model (no live miner does)' : `waiting for an idle miner that holds the whole model (${plural(holders, 'live miner')} can, all busy)`,
    });
  }
  return out;
}

