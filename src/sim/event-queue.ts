// The simulator's clock: a binary min-heap of events keyed by simulated time
// (ms). Events at the same time come out in the order they were scheduled,
// so a run is deterministic.

interface Entry<T> {
  at: number;
  seq: number;
  event: T;
}

export class EventQueue<T> {
  private readonly heap: Entry<T>[] = [];
  private seq = 0;

  get size(): number {
    return this.heap.length;
  }

  /** Schedules `event` at simulated time `at` (ms). */
  push(at: number, event: T): void {
    if (!Number.isFinite(at)) throw new RangeError(`event time must be finite, got ${at}`);
    const h = this.heap;
    h.push({ at, seq: this.seq++, event });
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(h[i], h[p])) break;
      [h[i], h[p]] = [h[p], h[i]];
      i = p;
    }
  }

  /** Time of the next event, or Infinity when none. */
  peekTime(): number {
    return this.heap.length ? this.heap[0].at : Infinity;
  }

  /** The next event (earliest time, then first scheduled), or undefined. */
  pop(): { at: number; event: T } | undefined {
    const h = this.heap;
    if (h.length === 0) return undefined;
    const top = h[0];
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l], h[m])) m = l;
        if (r < h.length && before(h[r], h[m])) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m], h[i]];
        i = m;
      }
    }
    return { at: top.at, event: top.event };
  }
}

function before<T>(a: Entry<T>, b: Entry<T>): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}
