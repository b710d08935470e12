// --throttle F: the miner works only a share F of the time, resting
// (1 − F) / F of each piece of work's duration after it.

/** Milliseconds a miner working a share `share` of the time rests after `workMs` of work (the simulator's miners too, src/sim/flow.ts). */
export function restMs(share: number, workMs: number): number {
  return (workMs * (1 - share)) / share;
}

export class Throttle {
  constructor(readonly share: number) {
    if (!(share > 0 && share <= 1)) throw new RangeError(`throttle must be in (0, 1], got ${share}`);
  }

  /** Milliseconds to rest after `workMs` of work. */
  restAfter(workMs: number): number {
    return restMs(this.share, workMs);
  }

  /** Rests after `workMs` of work (resolves at once when the share is 1). */
  async rest(workMs: number): Promise<void> {
    const ms = this.restAfter(workMs);
    if (ms > 0.5) await new Promise((r) => setTimeout(r, ms));
  }
}
