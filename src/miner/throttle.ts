// --throttle F: the miner works only a share F of the time, resting
// (1 − F) / F of each piece of work's duration after it.

export class Throttle {
  constructor(readonly share: number) {
    if (!(share > 0 && share <= 1)) throw new RangeError(`throttle must be in (0, 1], got ${share}`);
  }

  /** Milliseconds to rest after `workMs` of work. */
  restAfter(workMs: number): number {
    return (workMs * (1 - this.share)) / this.share;
  }

  /** Runs fn, then rests; returns fn's result. */
  async run<T>(fn: () => T | Promise<T>): Promise<T> {
    const t0 = performance.now();
    const out = await fn();
    const rest = this.restAfter(performance.now() - t0);
    if (rest > 0.5) await new Promise((r) => setTimeout(r, rest));
    return out;
  }
}
