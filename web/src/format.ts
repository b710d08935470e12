// How the dashboard writes numbers, amounts, sizes and times for people.
import { displayNim } from '../../src/chain/nim-display.ts';

export { displayNim };

export function num(x: number | null | undefined, digits = 0): string {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  return x.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function bytes(n: number): string {
  if (!Number.isFinite(n) || n < 0) return '–';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(n < 10 && i > 0 ? 1 : 0)} ${units[i]}`;
}

export function duration(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms)) return '–';
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** How long ago `at` (unix ms) was, from `now`. */
export function ago(at: number | null, now: number = Date.now()): string {
  return at === null ? '–' : `${duration(now - at)} ago`;
}

export function time(at: number | null): string {
  return at === null ? '–' : new Date(at).toLocaleTimeString('en-GB');
}

/** An address or hash cut for a table (the whole in a tooltip). */
export function short(s: string, keep = 6): string {
  return s.length > keep * 2 + 3 ? `${s.slice(0, keep + 2)}…${s.slice(-keep)}` : s;
}
