// The loss curves the dashboard draws (docs/dashboard.md): sampled once a
// second from the runs' and jobs' counters (step, last train loss, tokens/s),
// bounded in points per curve (older points thinned, the shape kept) and in
// curves, with the statuses each run or job was seen in. The points added
// since the last `drain()` are what the event stream sends.
//
// Kept in memory for fast reads and, given the orchestrator's store
// (../state/loss-points.ts), on disk too, so curves and timelines survive a
// restart: the store's curves are known at construction and each is read
// from disk the first time it is used (lazily: a restart with 256 full curves
// does not read 2.56 million rows up front); what changed is written through
// by `flush()`, one transaction per pass of the feed.
import type { LossHistory, LossPoint } from '../../api/dashboard.ts';
import { MAX_STATUSES, type CurveWrite, type LossPointStore, type LossStatus } from '../state/loss-points.ts';

export interface LossHistoryLimits {
  /** points kept per curve: past it every other older point is dropped */
  maxPoints: number;
  /** curves kept: past it the least recently updated is forgotten */
  maxSeries: number;
}

export const DEFAULT_LOSS_LIMITS: LossHistoryLimits = { maxPoints: 10_000, maxSeries: 256 };

interface Series {
  points: LossPoint[];
  statuses: LossStatus[];
  /** points not yet drained */
  fresh: LossPoint[];
  /** false until read from the store */
  loaded: boolean;
  /** its place in the order curves were touched in (larger: more recent) */
  touched: number;
}

/** What changed in a curve since the last flush. */
interface Pending {
  touched: number;
  points: LossPoint[];
  dropped: number[];
  statuses: LossStatus[];
  /** more changed than the lists hold (a burst, or a store that kept failing): the next flush writes the whole curve */
  whole: boolean;
}

export class LossHistories {
  private readonly series = new Map<string, Series>();
  /** per curve, what the next flush writes (empty without a store) */
  private readonly pending = new Map<string, Pending>();
  /** curves forgotten since the last flush */
  private readonly forgotten = new Set<string>();
  private clock = 0;

  constructor(
    private readonly limits: LossHistoryLimits = DEFAULT_LOSS_LIMITS,
    private readonly store: LossPointStore | null = null,
  ) {
    if (!(limits.maxPoints >= 2 && limits.maxSeries >= 1)) throw new Error('loss history limits must keep at least 2 points and 1 curve');
    if (!store) return;
    // the stored curves, least recently touched first; their points are read when first used
    for (const { key, touched } of store.curves()) {
      this.series.set(key, { points: [], statuses: [], fresh: [], loaded: false, touched });
      this.clock = Math.max(this.clock, touched);
    }
    while (this.series.size > limits.maxSeries) this.forget(this.series.keys().next().value!);
  }

  /** Adds a point when the step moved forward (a repeated or older step is ignored); returns whether it was added. */
  record(key: string, step: number, loss: number, tokensPerSecond: number, at: number): boolean {
    if (!Number.isFinite(loss) || !Number.isSafeInteger(step) || step < 0) return false;
    const s = this.touch(key);
    const last = s.points[s.points.length - 1];
    if (last && step <= last[0]) return false;
    const point: LossPoint = [step, loss, Math.max(0, Number.isFinite(tokensPerSecond) ? tokensPerSecond : 0), Math.max(0, Math.round(at))];
    s.points.push(point);
    s.fresh.push(point);
    const p = this.pendingOf(key, s);
    if (p && !p.whole) p.points.push(point);
    if (s.points.length > this.limits.maxPoints) this.thin(key, s);
    if (s.fresh.length > this.limits.maxPoints) s.fresh.splice(0, s.fresh.length - this.limits.maxPoints);
    if (p) this.bound(p);
    return true;
  }

  /** Notes the status a run or job was seen in, when it differs from the last one noted. */
  status(key: string, status: string, at: number): void {
    const s = this.touch(key);
    if (s.statuses[s.statuses.length - 1]?.status === status) return;
    const entry = { at: Math.max(0, Math.round(at)), status };
    s.statuses.push(entry);
    // a status only moves forward a handful of times, but a job moving back and forth stays bounded
    if (s.statuses.length > MAX_STATUSES) s.statuses.splice(1, s.statuses.length - MAX_STATUSES);
    const p = this.pendingOf(key, s);
    if (p && !p.whole) {
      p.statuses.push(entry);
      this.bound(p);
    }
  }

  /** The curve recorded so far (empty when nothing was). */
  get(key: string): LossHistory {
    const s = this.series.get(key);
    if (s) this.load(key, s);
    return { key, points: s ? [...s.points] : [], statuses: s ? [...s.statuses] : [] };
  }

  /** Points recorded since the last drain, per curve. */
  drain(): { key: string; points: LossPoint[] }[] {
    const out: { key: string; points: LossPoint[] }[] = [];
    for (const [key, s] of this.series) {
      if (s.fresh.length === 0) continue;
      out.push({ key, points: s.fresh });
      s.fresh = [];
    }
    return out;
  }

  /** Writes what changed since the last flush to the store, in one transaction (nothing without a store). On failure it is kept for the next flush, and the error thrown. */
  flush(): void {
    if (!this.store || (this.pending.size === 0 && this.forgotten.size === 0)) return;
    const writes: CurveWrite[] = [];
    for (const [key, p] of this.pending) {
      const s = this.series.get(key);
      if (p.whole && s) writes.push({ key, touched: p.touched, points: s.points, dropped: [], statuses: s.statuses, replace: true });
      else if (!p.whole) writes.push({ key, touched: p.touched, points: p.points, dropped: p.dropped, statuses: p.statuses, replace: false });
    }
    this.store.write(writes, [...this.forgotten], this.limits);
    this.pending.clear();
    this.forgotten.clear();
  }

  get size(): number {
    return this.series.size;
  }

  private touch(key: string): Series {
    let s = this.series.get(key);
    if (s) {
      this.load(key, s);
      // most recently updated last: the first one is the one to forget
      this.series.delete(key);
    } else {
      s = { points: [], statuses: [], fresh: [], loaded: true, touched: 0 };
      if (this.series.size >= this.limits.maxSeries) this.forget(this.series.keys().next().value!);
    }
    s.touched = ++this.clock;
    this.series.set(key, s);
    const p = this.pendingOf(key, s);
    if (p) p.touched = s.touched;
    return s;
  }

  /** Reads a stored curve the first time it is used. */
  private load(key: string, s: Series): void {
    if (s.loaded || !this.store) return;
    const stored = this.store.curve(key);
    s.points = stored.points;
    s.statuses = stored.statuses.length > MAX_STATUSES ? [stored.statuses[0], ...stored.statuses.slice(1 - MAX_STATUSES)] : stored.statuses;
    s.loaded = true;
    // stored under larger limits: thinned now, and on disk at the next flush
    while (s.points.length > this.limits.maxPoints) this.thin(key, s);
  }

  /** Thins the older half of a curve (every other point dropped): it keeps its shape and its newest points at full resolution. */
  private thin(key: string, s: Series): void {
    const half = s.points.length >> 1;
    const kept: LossPoint[] = [];
    const dropped: number[] = [];
    for (let i = 0; i < half; i++) {
      if (i % 2 === 0) kept.push(s.points[i]);
      else dropped.push(s.points[i][0]);
    }
    for (let i = half; i < s.points.length; i++) kept.push(s.points[i]);
    s.points = kept;
    const p = this.pendingOf(key, s);
    if (p && !p.whole) {
      p.dropped.push(...dropped);
      this.bound(p);
    }
  }

  /** What waits for the store stays bounded: past the bounds of a curve, the whole curve is written instead. */
  private bound(p: Pending): void {
    if (p.points.length <= this.limits.maxPoints && p.dropped.length <= this.limits.maxPoints && p.statuses.length <= MAX_STATUSES) return;
    p.whole = true;
    p.points = [];
    p.dropped = [];
    p.statuses = [];
  }

  private forget(key: string): void {
    this.series.delete(key);
    this.pending.delete(key);
    if (this.store) this.forgotten.add(key);
  }

  /** What the next flush writes for this curve, or null without a store. */
  private pendingOf(key: string, s: Series): Pending | null {
    if (!this.store) return null;
    let p = this.pending.get(key);
    if (!p) this.pending.set(key, (p = { touched: s.touched, points: [], dropped: [], statuses: [], whole: false }));
    return p;
  }
}
