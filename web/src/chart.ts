// A run's or job's curves with uPlot: the train loss by step (a line), the
// held-out loss at each checkpoint (points), and tokens/s on a second axis.
// Points only ever arrive in step order per curve; the arrays uPlot draws are
// rebuilt from them (cheap at 10,000 points) at most once per animation frame.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { LossPoint } from '../../src/api/dashboard.ts';

export class LossChart {
  private readonly train: LossPoint[] = [];
  private heldout: [number, number][] = [];
  private readonly plot: uPlot;
  private pending = false;
  private readonly resize: ResizeObserver;

  constructor(readonly el: HTMLElement) {
    const opts: uPlot.Options = {
      width: Math.max(320, el.clientWidth),
      height: 280,
      scales: { x: { time: false } },
      legend: { live: true },
      series: [
        { label: 'step' },
        { label: 'train loss', scale: 'loss', stroke: '#2563eb', width: 1.5, spanGaps: true, value: (_u, v) => (v === null ? '–' : v.toFixed(4)) },
        { label: 'held-out loss', scale: 'loss', stroke: '#dc2626', width: 0, paths: () => null, points: { show: true, size: 8, fill: '#dc2626' }, value: (_u, v) => (v === null ? '–' : v.toFixed(4)) },
        { label: 'tokens/s', scale: 'tps', stroke: '#9ca3af', width: 1, spanGaps: true, value: (_u, v) => (v === null ? '–' : Math.round(v).toLocaleString('en-US')) },
      ],
      axes: [{ label: 'step' }, { scale: 'loss', label: 'loss (nats)' }, { scale: 'tps', side: 1, label: 'tokens/s', grid: { show: false } }],
    };
    this.plot = new uPlot(opts, [[], [], [], []], el);
    this.resize = new ResizeObserver(() => this.plot.setSize({ width: Math.max(320, el.clientWidth), height: 280 }));
    this.resize.observe(el);
  }

  /** Adds train points (older or repeated steps are ignored). */
  add(points: readonly LossPoint[]): void {
    for (const p of points) {
      const last = this.train[this.train.length - 1];
      if (!last || p[0] > last[0]) this.train.push(p);
    }
    this.redraw();
  }

  /** The held-out losses measured so far, by step. */
  setHeldout(points: [number, number][]): void {
    const next = [...points].sort((a, b) => a[0] - b[0]);
    if (JSON.stringify(next) === JSON.stringify(this.heldout)) return;
    this.heldout = next;
    this.redraw();
  }

  get trainPoints(): number {
    return this.train.length;
  }

  dispose(): void {
    this.resize.disconnect();
    this.plot.destroy();
  }

  private redraw(): void {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.el.dataset.points = String(this.train.length);
      this.el.dataset.heldout = String(this.heldout.length);
      this.plot.setData(align(this.train, this.heldout));
    });
  }
}

/** The curves on one x axis (the union of their steps), gaps as null. */
function align(train: readonly LossPoint[], heldout: readonly [number, number][]): uPlot.AlignedData {
  const xs: number[] = [];
  const loss: (number | null)[] = [];
  const held: (number | null)[] = [];
  const tps: (number | null)[] = [];
  let i = 0;
  let j = 0;
  while (i < train.length || j < heldout.length) {
    const a = train[i];
    const b = heldout[j];
    const heldFirst = b !== undefined && (a === undefined || b[0] <= a[0]);
    const trainToo = a !== undefined && (b === undefined || a[0] <= b[0]);
    xs.push(heldFirst ? b[0] : a[0]);
    loss.push(trainToo ? a[1] : null);
    tps.push(trainToo ? a[2] : null);
    held.push(heldFirst ? b[1] : null);
    if (heldFirst) j++;
    if (trainToo) i++;
  }
  return [xs, loss, held, tps];
}
