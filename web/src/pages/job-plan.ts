// A job's plan on its page: what the job needs and which of the miners alive
// now would train it (GET /jobs/:id/plan, the planner `nbcli job plan` runs):
// the planner's explanation, every layout it weighed (stages × replicas, how
// fast, how long, what it costs, what bounds it), the one it chooses (what
// meets the deadline soonest and cheapest) and why those miners.
import type { JobPlan } from '../../../src/jobs/plan-schema.ts';
import { h, table } from '../dom.ts';
import { duration, num } from '../format.ts';

export function planView(plan: JobPlan): HTMLElement {
  const unit = plan.unit === 'token' ? 'tokens/s' : 'examples/s';
  const same = (a: { stages: number; replicas: number } | null, b: { stages: number; replicas: number }): boolean => a !== null && a.stages === b.stages && a.replicas === b.replicas;
  return h(
    'div',
    null,
    h('ul', { class: 'plan-words' }, plan.explanation.map((line) => h('li', null, line))),
    table(
      ['layout', 'miners', unit, 'time', 'cost (NIM)', 'bounded by', 'deadline', ''],
      plan.candidates.map((l) => [
        `${l.stages} × ${l.replicas}`,
        String(l.miners),
        l.fitsMemory ? num(l.itemsPerS, 0) : '–',
        duration(l.wallTimeMs),
        l.fitsMemory ? num(l.costNim, 4) : '–',
        l.limitedBy ?? (l.reason ? h('span', { class: 'muted', title: l.reason }, 'does not fit') : '–'),
        l.fitsMemory ? (l.meetsDeadline ? 'met' : 'missed') : '–',
        same(plan.chosen, l) ? h('strong', { data: { chosen: '1' } }, "the plan's choice") : same(plan.default, l) ? 'the default' : '',
      ]),
      { class: 'grid', id: 'plan-layouts' },
    ),
    plan.chosen?.why ? h('p', { class: 'muted' }, `Why these miners: ${plan.chosen.why}`) : null,
  );
}
