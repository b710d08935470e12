// An SVG chart of a simulation: utilization (left axis, 0-100%: of the
// miners holding a stage, and of all miners) and training tokens/s (right
// axis) over simulated time. Plain SVG text, no dependency.
import type { TimeSeries } from './timeline.ts';

const W = 800;
const H = 360;
const PAD = { left: 60, right: 80, top: 40, bottom: 50 };

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function fmt(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}G`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return n.toFixed(n >= 10 ? 0 : 1);
}

/** The chart as SVG text. */
export function chartSvg(series: TimeSeries, title: string): string {
  const n = series.tMs.length;
  const tMax = n > 0 ? series.tMs[n - 1] + (n > 1 ? series.tMs[1] - series.tMs[0] : series.tMs[0]) / 2 : 1;
  const yMax = Math.max(1, ...series.tokensPerS) * 1.1;
  const px = (t: number): number => PAD.left + (t / tMax) * (W - PAD.left - PAD.right);
  const pyU = (u: number): number => H - PAD.bottom - Math.min(1, Math.max(0, u)) * (H - PAD.top - PAD.bottom);
  const pyT = (v: number): number => H - PAD.bottom - (v / yMax) * (H - PAD.top - PAD.bottom);
  const line = (ys: number[], py: (v: number) => number): string => ys.map((v, i) => `${i ? 'L' : 'M'}${px(series.tMs[i]).toFixed(1)},${py(v).toFixed(1)}`).join(' ');
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  parts.push(`<text x="${W / 2}" y="22" text-anchor="middle" font-size="14">${esc(title)}</text>`);
  for (let k = 0; k <= 4; k++) {
    const u = k / 4;
    const y = pyU(u).toFixed(1);
    parts.push(`<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${y}" y2="${y}" stroke="#ddd"/>`);
    parts.push(`<text x="${PAD.left - 6}" y="${y}" text-anchor="end" dominant-baseline="middle" fill="#1f77b4">${Math.round(u * 100)}%</text>`);
    parts.push(`<text x="${W - PAD.right + 6}" y="${y}" dominant-baseline="middle" fill="#d62728">${fmt(u * yMax)}</text>`);
  }
  const hours = tMax / 3_600_000;
  for (let k = 0; k <= 4; k++) {
    const t = (k / 4) * tMax;
    const label = hours >= 1 ? `${((k / 4) * hours).toFixed(hours >= 4 ? 0 : 2)} h` : `${((k / 4) * tMax / 60_000).toFixed(1)} min`;
    parts.push(`<text x="${px(t).toFixed(1)}" y="${H - PAD.bottom + 18}" text-anchor="middle">${label}</text>`);
  }
  parts.push(`<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${H - PAD.bottom}" y2="${H - PAD.bottom}" stroke="#333"/>`);
  parts.push(`<path d="${line(series.utilizationHolders, pyU)}" fill="none" stroke="#1f77b4" stroke-width="2"/>`);
  parts.push(`<path d="${line(series.utilization, pyU)}" fill="none" stroke="#1f77b4" stroke-width="1.5" stroke-dasharray="5 4"/>`);
  parts.push(`<path d="${line(series.tokensPerS, pyT)}" fill="none" stroke="#d62728" stroke-width="2"/>`);
  parts.push(`<text x="${PAD.left}" y="${H - 12}" fill="#1f77b4">utilization (busy / alive time): of miners holding a stage; dashed: of all miners</text>`);
  parts.push(`<text x="${W - PAD.right}" y="${H - 12}" text-anchor="end" fill="#d62728">training tokens/s</text>`);
  parts.push('</svg>');
  return parts.join('\n') + '\n';
}
