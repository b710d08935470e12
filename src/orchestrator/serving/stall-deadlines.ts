// When a stage miner is taken as hung (docs/inference.md, "Failover and
// determinism"): a miner that stops answering without closing its
// connection (stopped, swapping, its machine asleep) is not seen by the
// transport until the call's timeout, 30 s by default. A decode call does
// about the same work every step, so its usual time is known: once a miner
// has answered a few, a call is given STALL_FACTOR times its usual decode
// time, scaled up by its rows over the usual decode rows when it carries more
// (a prefill: a row of a prefill costs less than a decode row, so this errs
// long), and at least STALL_FLOOR_MS, before the miner is failed over.

/** A decode call may take this many times the miner's usual decode time. */
export const STALL_FACTOR = 20;
/** ... and never less than this (a loaded machine's scheduling and GC pauses stay well under it). */
export const STALL_FLOOR_MS = 3_000;
/** Decode calls a miner answers before its usual time is trusted. */
export const STALL_WARMUP_CALLS = 8;
/** Miners remembered at most (the oldest are forgotten first). */
const MAX_MINERS = 10_000;

interface Usual {
  /** exponentially weighted means of its decode calls' times (ms) and rows */
  ms: number;
  rows: number;
  calls: number;
}

export class StallDeadlines {
  private readonly usual = new Map<string, Usual>();

  constructor(private readonly timeoutMs: number) {}

  /** How long a call of `rows` rows to `minerId` may take (ms): the whole timeout for a miner not yet measured. */
  deadline(minerId: string, rows: number): number {
    const u = this.usual.get(minerId);
    if (!u || u.calls < STALL_WARMUP_CALLS) return this.timeoutMs;
    return Math.min(this.timeoutMs, Math.max(STALL_FLOOR_MS, STALL_FACTOR * u.ms * Math.max(1, rows / u.rows)));
  }

  /** A call of `rows` rows to `minerId` answered in `ms`; only decode calls (no prefill) count. */
  note(minerId: string, ms: number, rows: number, prefill: boolean): void {
    if (prefill || !(ms >= 0) || !(rows >= 1)) return;
    const u = this.usual.get(minerId);
    if (!u) {
      if (this.usual.size >= MAX_MINERS) this.usual.delete(this.usual.keys().next().value as string);
      this.usual.set(minerId, { ms, rows, calls: 1 });
      return;
    }
    u.ms += (ms - u.ms) * 0.1;
    u.rows += (rows - u.rows) * 0.1;
    u.calls++;
  }
}
