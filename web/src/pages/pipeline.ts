// A run's pipeline as a picture: its stages as columns (parts, mode, merge
// phase, last loss), the replicas of each as boxes (name, GFLOP/s, alive),
// and between two stages the traffic across that boundary while the run is
// under way: activations forward (→) and gradients back (←), in bytes and in
// bytes per second lately. Computed by the orchestrator
// (src/orchestrator/dashboard/traffic.ts): microbatches done across the
// boundary × the payload of one microbatch's frame at the run's codec.
import type { BoundaryTraffic, RunTraffic } from '../../../src/api/dashboard.ts';
import type { RunView } from '../../../src/api/schemas.ts';
import { h, type Child } from '../dom.ts';
import { bytes, num } from '../format.ts';

export function pipeline(run: RunView & { traffic?: RunTraffic | null }): HTMLElement {
  return h(
    'div',
    { class: 'pipeline', data: { run: run.id } },
    run.stages.length === 0
      ? h('p', { class: 'muted' }, run.message ?? 'not placed yet')
      : run.stages.map((s, i) => [
          i > 0 ? boundary(run.stages[i - 1].stage, run.traffic ?? null) : null,
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

/** The arrow between stage `from` and the next, with the traffic across it when known. */
function boundary(from: number, traffic: RunTraffic | null): HTMLElement {
  const b = traffic?.boundaries.find((x) => x.from === from);
  if (!traffic || !b) return h('div', { class: 'arrow', title: 'activations forward, gradients back' }, '⇄');
  return h(
    'div',
    { class: 'arrow', title: explain(traffic, b), data: { boundary: String(from) } },
    h('div', null, '⇄'),
    h('div', { class: 'traffic', data: { dir: 'forward', bytes: String(b.forwardBytes) } }, `→ ${bytes(b.forwardBytes)}`, rate(b.forwardBytesPerSecond)),
    h('div', { class: 'traffic', data: { dir: 'back', bytes: String(b.backwardBytes) } }, `← ${bytes(b.backwardBytes)}`, rate(b.backwardBytesPerSecond)),
  );
}

function rate(perSecond: number | null): Child {
  return perSecond === null ? null : h('span', { class: 'muted' }, ` ${bytes(perSecond)}/s`);
}

/** The tooltip: what the figures are and how they were computed. */
function explain(t: RunTraffic, b: BoundaryTraffic): string {
  const frame = `${num(t.frameBytes)} B (the ${t.codec} payload of one microbatch's ${num(t.shape[0])} × ${num(t.shape[1])} activation)`;
  return [
    `stage ${b.from} → stage ${b.from + 1}: activations forward, gradients back.`,
    `Computed, not counted: microbatches done across this boundary × the frame size ${frame}.`,
    `→ ${num(b.forwardMicrobatches)} forwards of stage ${b.from} × ${num(t.frameBytes)} B = ${num(b.forwardBytes)} B`,
    `← ${num(b.backwardMicrobatches)} backwards of stage ${b.from + 1} × ${num(t.frameBytes)} B = ${num(b.backwardBytes)} B`,
    'Per second: over about the last minute. Frame headers and attempts that did not complete are not included.',
  ].join('\n');
}
