// Which layout a job uses. Candidates are S × R for S in the workload's stage
// counts and R in REPLICA_COUNTS, on the live miners. The chosen layout is
// the cheapest that fits memory and meets the deadline (costs within
// COST_TIE count as equal; then the fewest miners, then the fewest stages),
// moved onto the smallest miners that still meet the deadline (miners sorted
// by memory, then speed: the shortest prefix of that order that is enough).
// If none meets the deadline, the fastest layout that fits, flagged
// `meetsDeadline: false`.
import { formatBytes } from '../planner/errors.ts';
import { formatDuration } from './duration.ts';
import { COST_TIE } from './plan-constants.ts';
import { evaluateLayout } from './plan-layouts.ts';
import type { JobLayout, PoolMiner } from './plan-schema.ts';
import type { Context } from './plan-workload.ts';

/**
 * The layout to use: the cheapest that fits and meets the deadline (then the
 * fewest miners, the fewest stages), moved onto the shortest prefix of the
 * miners by size that still meets it; else the fastest that fits.
 */
export function choose(ctx: Context, candidates: JobLayout[], pool: PoolMiner[], bySize: PoolMiner[], def: JobLayout | null): JobLayout | null {
  // a layout whose miners cannot send activations (no bandwidth) trains nothing
  const fitting = candidates.filter((c) => c.fitsMemory && c.itemsPerS > 0);
  if (fitting.length === 0) return null;
  const meeting = fitting.filter((c) => c.meetsDeadline);
  if (meeting.length === 0) {
    const fastest = fitting.reduce((a, c) => (c.itemsPerS > a.itemsPerS * (1 + 1e-9) ? c : a));
    const balanced = evaluateLayout(ctx, fastest.stages, fastest.replicas, pool, true);
    return { ...balanced, why: groupWhy(ctx, balanced, def, 'fastest') };
  }
  const cheapest = Math.min(...meeting.map((c) => c.costNim));
  const pick = meeting
    .filter((c) => c.costNim <= cheapest * (1 + COST_TIE))
    .sort((a, b) => a.miners - b.miners || a.stages - b.stages)[0];
  // the shortest prefix of the miners by size on which it still meets the deadline
  const ok = (k: number): boolean => {
    const l = evaluateLayout(ctx, pick.stages, pick.replicas, bySize.slice(0, k), false);
    return l.fitsMemory && l.meetsDeadline;
  };
  let lo = pick.miners;
  let hi = bySize.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ok(mid)) hi = mid;
    else lo = mid + 1;
  }
  const best = evaluateLayout(ctx, pick.stages, pick.replicas, bySize.slice(0, hi), true);
  return { ...best, why: groupWhy(ctx, best, def, 'smallest') };
}

/** Why the chosen layout uses these miners. */
function groupWhy(ctx: Context, l: JobLayout, def: JobLayout | null, how: 'smallest' | 'fastest'): string {
  const deadline = formatDuration(ctx.job.deadlineMs);
  const miners = l.miners === 1 ? 'the smallest miner' : `the ${l.miners} smallest miners`;
  const pick = how === 'smallest' ? `${miners} (by memory, then speed) that fit and together meet the ${deadline} deadline` : `the fastest miners that fit: nothing meets the ${deadline} deadline`;
  if (l.stages === 1 && l.replicas === 1) return how === 'smallest' ? `the smallest miner that holds the whole model and meets the ${deadline} deadline` : pick;
  const forced =
    def === null
      ? `no single miner holds the model (it needs ${formatBytes(ctx.work.whole.memoryBytes.total)})`
      : def.wallTimeMs !== null && !def.meetsDeadline
        ? `one miner would take ${formatDuration(def.wallTimeMs)}`
        : null;
  return forced ? `${pick}; ${forced}` : pick;
}
