// Durations as people write them: `1500ms`, `90s`, `30m`, `6h`, `3d`.

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Milliseconds in `text`; throws on anything but a number and one unit. */
export function parseDuration(text: string): number {
  const m = /^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)$/.exec(text.trim());
  if (!m) throw new Error(`'${text}' is not a duration (such as 90s, 30m, 6h, 3d)`);
  const ms = Math.round(Number(m[1]) * UNIT_MS[m[2]]);
  if (!Number.isSafeInteger(ms)) throw new Error(`'${text}' is too long`);
  return ms;
}

/** `ms` in the largest unit that keeps it short: 90s, 30m, 6h, 3d, 1.5h. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  for (const [unit, size] of [['d', 86_400_000], ['h', 3_600_000], ['m', 60_000]] as const) {
    if (ms >= size) return `${Number((ms / size).toFixed(1))}${unit}`;
  }
  return `${Number((ms / 1000).toFixed(1))}s`;
}
