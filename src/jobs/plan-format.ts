// How a plan writes its numbers and labels: counts with thousands separators,
// three significant digits, rates (40.3k), FLOPs, NIM, a miner, a wall time.
import { formatBytes } from '../planner/errors.ts';
import { formatDuration } from './duration.ts';
import type { JobLayout, PoolMiner } from './plan-schema.ts';

/** How long a layout takes; "never" when a stage cannot move its activations (no bandwidth). */
export function wallTime(l: JobLayout): string {
  return l.wallTimeMs === null ? (l.fitsMemory ? 'never' : '-') : formatDuration(l.wallTimeMs);
}

export function minerLabel(m: PoolMiner): string {
  return `${m.name ?? m.id}: ${formatBytes(m.memoryBytes)}, ${formatSig(m.gflops)} GFLOP/s`;
}

export function count(n: number, one: string, many = `${one}s`): string {
  return `${formatCount(n)} ${n === 1 ? one : many}`;
}

/** 867,072 */
export function formatCount(n: number): string {
  return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** Three significant digits, no exponent for ordinary magnitudes. */
export function formatSig(x: number): string {
  if (x === 0) return '0';
  if (Math.abs(x) >= 1000) return formatCount(x);
  return String(Number(x.toPrecision(3)));
}

/** 40.3k, 1.2M, 512 */
export function formatRate(x: number): string {
  if (x >= 1e9) return `${formatSig(x / 1e9)}G`;
  if (x >= 1e6) return `${formatSig(x / 1e6)}M`;
  if (x >= 1e3) return `${formatSig(x / 1e3)}k`;
  return formatSig(x);
}

export function formatFlops(x: number): string {
  const units = ['FLOP', 'kFLOP', 'MFLOP', 'GFLOP', 'TFLOP', 'PFLOP', 'EFLOP'];
  let u = 0;
  while (x >= 1000 && u < units.length - 1) {
    x /= 1000;
    u++;
  }
  return `${formatSig(x)} ${units[u]}`;
}

export function formatNim(x: number): string {
  return formatSig(x);
}
