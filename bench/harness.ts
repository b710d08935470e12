// The benchmark registry: each bench module exports a list of benches; main.ts
// runs them and prints a table, or one JSON object per line with --json.

export interface BenchResult {
  bench: string;
  value: number;
  unit: string;
}

export interface BenchOptions {
  /** --convergence: also run the long training benches (minutes). */
  convergence: boolean;
  /** print progress lines to stderr */
  log: (line: string) => void;
}

export interface Bench {
  /** Group name shown in the table and used by --only. */
  group: string;
  /** Only run with --convergence. */
  convergence?: boolean;
  run(options: BenchOptions): Promise<BenchResult[]>;
}

/** Median of a list of numbers. */
export function median(values: readonly number[]): number {
  if (values.length === 0) throw new Error('median of nothing');
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}
