// The loss curves the dashboard draws (docs/dashboard.md): sampled once a
// second from the runs' and jobs' counters (step, last train loss, tokens/s),
// kept in memory since the orchestrator started, bounded in points per curve
// (older points thinned, the shape kept) and in curves, with the statuses
// each run or job was seen in. The points added since the last `drain()` are
// what the event stream sends.
import type { LossHistory, LossPoint } from '../../api/dashboard.ts';

export interface LossHistoryLimits {
  /** points kept per curve: past it every other older point is dropped */
  maxPoints: number;
  /** curves kept: past it the least recently updated is forgotten */
  maxSeries: number;
}

export const DEFAULT_LOSS_LIMITS: LossHistoryLimits = { maxPoints: 10_000, maxSeries: 256 };

interface Series {
  points: LossPoint[];
  statuses: { at: number; status: string }[];
  /** points not yet drained */
  fresh: LossPoint[];
}

export class LossHistories {
  private readonly series = new Map<string, Series>();

  constructor(private readonly limits: LossHistoryLimits = DEFAULT_LOSS_LIMITS) {
    if (!(limits.maxPoints >= 2 && limits.maxSeries >= 1)) throw new Error('loss history limits must keep at least 2 points and 1 curve');
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
    if (s.points.length > this.limits.maxPoints) {
      // thin the older half: the curve keeps its shape and its newest points at full resolution
      const half = s.points.length >> 1;
      s.points = [...s.points.slice(0, half).filter((_, i) => i % 2 === 0), ...s.points.slice(half)];
    }
    if (s.fresh.length > this.limits.maxPoints) s.fresh.splice(0, s.fresh.length - this.limits.maxPoints);
    return true;
  }

  /** Notes the status a run or job was seen in, when it differs from the last one noted. */
  status(key: string, status: string, at: number): void {
    const s = this.touch(key);
    if (s.statuses[s.statuses.length - 1]?.status === status) return;
    s.statuses.push({ at: Math.max(0, Math.round(at)), status });
    // a status only moves forward a handful of times, but a job moving back and forth stays bounded
    if (s.statuses.length > 64) s.statuses.splice(1, s.statuses.length - 64);
  }

  /** The curve recorded so far (empty when nothing was). */
  get(key: string): LossHistory {
    const s = this.series.get(key);
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

  get size(): number {
    return this.series.size;
  }

  private touch(key: string): Series {
    let s = this.series.get(key);
    if (s) {
      // most recently updated last: the first one is the one to forget
      this.series.delete(key);
    } else {
      s = { points: [], statuses: [], fresh: [] };
      if (this.series.size >= this.limits.maxSeries) this.series.delete(this.series.keys().next().value!);
    }
    this.series.set(key, s);
    return s;
  }
}
