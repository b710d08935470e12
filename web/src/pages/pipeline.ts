// A run's pipeline as a picture: its stages as columns (parts, mode, merge
// phase, last loss), the replicas of each as boxes (name, GFLOP/s, alive).
import type { RunView } from '../../../src/api/schemas.ts';
import { h } from '../dom.ts';
import { num } from '../format.ts';

export function pipeline(run: RunView): HTMLElement {
  return h(
    'div',
    { class: 'pipeline', data: { run: run.id } },
    run.stages.length === 0
      ? h('p', { class: 'muted' }, run.message ?? 'not placed yet')
      : run.stages.map((s, i) => [
          i > 0 ? h('div', { class: 'arrow', title: 'activations forward, gradients back' }, '⇄') : null,
          h(
            'div',
            { class: 'stage' },
            h('div', { class: 'stage-head' }, `stage ${s.stage}`, h('span', { class: 'muted' }, ` parts ${s.parts[0]}–${s.parts[1]}`)),
            h('div', { class: 'muted' }, s.mergePhase ? `merging: ${s.mergePhase}` : s.mode, ` · round ${s.round}`, s.loss !== null ? ` · loss ${s.loss.toFixed(3)}` : ''),
            s.replicas.map((r) => h('div', { class: `replica${r.alive ? '' : ' gone'}`, title: r.id }, h('strong', null, r.name), h('span', { class: 'muted' }, ` ${num(r.gflops, 1)} GFLOP/s`))),
          ),
        ]),
  );
}
