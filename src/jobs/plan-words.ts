// The words of a plan: the lines that explain it (`JobPlan.explanation`),
// why nothing fits, and the human view of a whole plan (`nbcli job plan`).
import { totalFlops } from '../planner/cost.ts';
import { formatBytes } from '../planner/errors.ts';
import { formatDuration } from './duration.ts';
import { costNim } from './plan-constants.ts';
import { count, formatCount, formatFlops, formatNim, formatRate, formatSig, minerLabel, wallTime } from './plan-format.ts';
import type { JobLayout, JobPlan, PoolMiner } from './plan-schema.ts';
import type { Context, Workload } from './plan-workload.ts';

export function explain(plan: JobPlan, ctx: Context, pool: PoolMiner[]): string[] {
  const lines: string[] = [];
  const unit = plan.unit;
  const w = plan.wholeModel;
  const deadline = formatDuration(plan.deadlineMs);
  lines.push(
    `${plan.model.summary}: ${formatCount(plan.params)} parameters, ${formatFlops(totalFlops(plan.flopsPerItem))} per ${unit} (forward + backward); ` +
      `${formatCount(plan.steps)} steps × ${formatCount(plan.itemsPerStep)} ${unit}s = ${formatRate(plan.totalItems)} ${unit}s, ${formatFlops(plan.trainingFlops)} in all.`,
  );
  const acts = plan.slots === null ? `batch ${plan.batchSize}` : `batch ${plan.batchSize}, ${count(plan.slots, 'microbatch', 'microbatches')} in flight`;
  lines.push(
    `${formatBytes(w.total)} per replica with AdamW: weights ${formatBytes(w.weights)}, gradients ${formatBytes(w.gradients)}, ` +
      `optimizer ${formatBytes(w.optimizer)} (m, v, DiLoCo start weights and momentum), activations ${formatBytes(w.activations)} (${acts}).`,
  );
  const needRate = plan.totalItems / (plan.deadlineMs / 1000);
  lines.push(`The ${deadline} deadline needs ~${formatRate(needRate)} ${unit}s/s: ${formatSig((needRate * totalFlops(plan.flopsPerItem)) / 1e9)} GFLOP/s of compute in all.`);
  if (pool.length === 0) {
    const piece = ctx.work.kind === 'gpt' ? `, or ${formatBytes(plan.minPieceMemoryBytes)} per miner cut into ${ctx.work.parts} stages (the smallest pieces)` : '';
    lines.push(`No live miners to plan against: one miner needs ${formatBytes(plan.minMinerMemoryBytes)} to hold it alone${piece}.`);
  } else if (plan.pool.holdWhole > 0) {
    const first = pool.find((m) => m.id === plan.default!.assignment[0].miners[0])!;
    lines.push(`${plan.pool.holdWhole} of ${count(pool.length, 'live miner')} hold it alone; it starts on the smallest, ${minerLabel(first)}.`);
  } else {
    lines.push(`No single miner holds it: it needs ${formatBytes(plan.minMinerMemoryBytes)}, the largest of ${count(pool.length, 'live miner')} has ${formatBytes(plan.pool.largestMemoryBytes)}.`);
  }
  const d = plan.default;
  if (d && d.wallTimeMs !== null) {
    lines.push(`Alone there: ~${formatRate(d.itemsPerS)} ${unit}s/s, done in ${wallTime(d)}${d.meetsDeadline ? `, within the ${deadline} deadline` : `, missing the ${deadline} deadline`}.`);
  }
  const c = plan.chosen;
  if (c) {
    const shape = `${count(c.stages, 'stage')} × ${count(c.replicas, 'replica')}`;
    const speed = `~${formatRate(c.itemsPerS)} ${unit}s/s (${wallTime(c)}), ${formatNim(c.costNim)} NIM`;
    const same = d !== null && c.miners === 1 && d.assignment[0]?.miners[0] === c.assignment[0]?.miners[0];
    if (c.meetsDeadline && same) lines.push(`No upgrade needed: one miner meets the ${deadline} deadline at ${speed}.`);
    else if (c.meetsDeadline) lines.push(`${d ? 'Upgrade: ' : ''}${c.miners === 1 ? 'one larger miner meets' : `${shape} meet`} the ${deadline} deadline at ${speed}.`);
    else lines.push(`Nothing meets the ${deadline} deadline; the fastest layout that fits, ${shape}, takes ${wallTime(c)} at ~${formatRate(c.itemsPerS)} ${unit}s/s, ${formatNim(c.costNim)} NIM.`);
    if (!same) lines.push(`Miners: ${c.why}.`);
  } else if (pool.length > 0) {
    lines.push(`Cannot run on these miners: ${plan.reason}.`);
  }
  const merges = c && c.replicas >= 2 && plan.trainingFlops > 0 ? ` (merges add ${formatSig((plan.mergeFlops / plan.trainingFlops) * 100)}%)` : '';
  lines.push(
    `Cost: ${formatFlops(plan.trainingFlops)} × ${formatNim(plan.pricing.nimPerPetaflop)} NIM per PFLOP = ${formatNim(costNim(plan.trainingFlops, plan.pricing))} NIM${merges}, ` +
      `whatever the layout: an upgrade buys time, not NIM.`,
  );
  if (plan.withinBudget === false) lines.push(`Over budget: ${formatNim(c!.costNim)} NIM > ${formatNim(plan.budgetNim!)} NIM.`);
  return lines;
}

/** Why no layout fits, with the numbers. */
export function noFitReason(work: Workload, candidates: JobLayout[], pool: PoolMiner[]): string {
  const largest = pool.reduce((a, m) => Math.max(a, m.memoryBytes), 0);
  const miners = count(pool.length, 'miner');
  if (work.kind === 'mlp') return `it needs ${formatBytes(work.whole.memoryBytes.total)} on one miner; the largest of ${miners} has ${formatBytes(largest)}`;
  for (const piece of work.pieces()) {
    if (piece.bytes > largest) return `${piece.label} alone needs ${formatBytes(piece.bytes)}; the largest of ${miners} has ${formatBytes(largest)}`;
  }
  if (candidates.some((c) => c.fitsMemory)) return 'the miners that could hold it report no upload bandwidth, and a layout of several miners must send activations or merges';
  const whole = `one miner needs ${formatBytes(work.whole.memoryBytes.total)} (the largest of ${miners} has ${formatBytes(largest)})`;
  // the fewest stages whose compute-balanced cut has no stage larger than the largest miner
  const S = work.stageCounts.find((n) => Math.max(...work.cut(n).map((r) => work.cost(r).memoryBytes.total)) <= largest);
  if (S === undefined) return `${whole}, and no cut into at most ${count(work.stageCounts[work.stageCounts.length - 1], 'stage')} fits it`;
  const per = Math.max(...work.cut(S).map((r) => work.cost(r).memoryBytes.total));
  if (S > pool.length) return `${whole}; cut into ${S} stages of at most ${formatBytes(per)} it needs ${S} miners, ${pool.length} available`;
  const layout = candidates.find((c) => c.stages === S && c.replicas === 1);
  return `${whole}; cut into ${S} stages: ${layout?.reason ?? `stages of up to ${formatBytes(per)} on ${miners}`}`;
}

/** The human view of a plan (`nbcli job plan`). */
export function formatJobPlan(plan: JobPlan): string {
  const unit = plan.unit === 'token' ? 'tok/s' : 'ex/s';
  const out: string[] = [`job ${plan.job}: ${plan.model.summary}`, ...plan.explanation.map((l) => `  ${l}`), ''];
  if (plan.cuts.length > 1) {
    out.push('memory per replica of the largest stage, by stage count:');
    out.push(`  ${plan.cuts.map((c) => `${c.stages}: ${formatBytes(c.largestStageBytes)}`).join('  ')}`);
    out.push('');
  }
  const fitting = plan.candidates.filter((c) => c.fitsMemory);
  if (fitting.length > 0) {
    const shown = fitting.slice(0, 24);
    const rows = shown.map((c) => [
      `${c.stages}×${c.replicas}`,
      String(c.miners),
      formatRate(c.itemsPerS),
      wallTime(c),
      formatNim(c.costNim),
      c.meetsDeadline ? 'yes' : 'no',
      c.limitedBy ?? '-',
      c.stages === plan.chosen?.stages && c.replicas === plan.chosen?.replicas ? '← chosen' : c.stages === 1 && c.replicas === 1 && plan.default ? '(default: 1 miner)' : '',
    ]);
    const head = ['S×R', 'miners', unit, 'time', 'NIM', `≤ ${formatDuration(plan.deadlineMs)}`, 'limit', ''];
    const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
    out.push('layouts on the live miners (fastest miners for each):');
    for (const r of [head, ...rows]) out.push(`  ${r.map((x, i) => (i === 0 || i >= 5 ? x.padEnd(widths[i]) : x.padStart(widths[i]))).join('  ').trimEnd()}`);
    const hidden = plan.candidates.length - shown.length;
    if (hidden > 0) out.push(`  (${hidden} more: ${fitting.length - shown.length} that fit, ${plan.candidates.length - fitting.length} that do not)`);
    out.push('');
  }
  if (plan.chosen) {
    const c = plan.chosen;
    out.push(`chosen: ${c.stages} × ${c.replicas} on ${count(c.miners, 'miner')}`);
    for (const s of c.assignment) {
      const range = s.range ? `[${s.range.from},${s.range.to}) ` : '';
      out.push(`  ${range}${formatBytes(s.memoryBytes)}: ${s.miners.join(', ')} (~${formatRate(s.itemsPerS)} ${unit}, ${s.limitedBy})`);
    }
  }
  return out.join('\n').trimEnd();
}
