// The dashboard's loss curves on disk (docs/dashboard.md, "Live updates"):
// each curve (`run:<id>` or `job:<id>`) with its points [step, train loss,
// tokens/s, unix ms] and the statuses its run or job was seen in, so the
// curves and a run's timeline survive a restart. The memory copy the feed
// samples into (../dashboard/loss-history.ts) writes through here once a
// second, one transaction per pass. Bounded like the memory copy: at most
// `maxPoints` points per curve (past it the older half is thinned, every
// other point dropped, so the shape stays) and `maxSeries` curves (the least
// recently touched dropped). Rows are validated when read back: a point that
// is not finite, or a key that is not a curve's, is skipped, never served.
//
// Tables: loss_curves (id, curve key, touched: the order curves were last
// touched in, points: how many it holds, so a pass need not count them), loss_points (curve id, step, train loss, tokens/s, at),
// loss_statuses (curve id, seq, at, status); points and statuses are keyed
// (and clustered) by curve. No other store's table is read.
import type { LossPoint } from '../../api/dashboard.ts';
import type { Migrations, StateDb } from './db.ts';

export const LOSS_POINT_MIGRATIONS: Migrations = {
  store: 'loss_points',
  steps: [
    `CREATE TABLE IF NOT EXISTS loss_curves (
      id INTEGER PRIMARY KEY, curve TEXT NOT NULL UNIQUE, touched INTEGER NOT NULL, points INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS loss_curves_touched ON loss_curves (touched);
    CREATE TABLE IF NOT EXISTS loss_points (
      curve_id INTEGER NOT NULL, step INTEGER NOT NULL, loss REAL NOT NULL, tokens_per_second REAL NOT NULL, at INTEGER NOT NULL,
      PRIMARY KEY (curve_id, step)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS loss_statuses (
      curve_id INTEGER NOT NULL, seq INTEGER NOT NULL, at INTEGER NOT NULL, status TEXT NOT NULL,
      PRIMARY KEY (curve_id, seq)
    ) WITHOUT ROWID`,
  ],
};

/** A curve's key as the dashboard's API names it (src/api/dashboard.ts SeriesKey). */
const CURVE_KEY = /^(run|job):[A-Za-z0-9_.:-]{1,128}$/;
/** Statuses kept per curve: the first one and the newest (as the memory copy keeps them). */
export const MAX_STATUSES = 64;
const MAX_STATUS_LENGTH = 64;

/** The bounds of the stored curves (the memory copy's, ../dashboard/loss-history.ts). */
export interface LossBounds {
  maxPoints: number;
  maxSeries: number;
}

export interface LossStatus {
  at: number;
  status: string;
}

/** A curve as stored: its points in step order and its statuses in the order seen. */
export interface StoredCurve {
  points: LossPoint[];
  statuses: LossStatus[];
  /** rows read back that were not valid (not served) */
  skipped: number;
}

/** What one pass changed in one curve. */
export interface CurveWrite {
  key: string;
  /** where the curve now stands in the order curves were touched in (larger: more recent) */
  touched: number;
  /** new points (a step already stored is kept as stored) */
  points: readonly LossPoint[];
  /** steps the memory copy thinned away */
  dropped: readonly number[];
  /** new statuses, in order */
  statuses: readonly LossStatus[];
  /** the points and statuses are the whole curve: what was stored is replaced */
  replace?: boolean;
}

/** The curves' keys, least recently touched first, with their place in that order. */
export interface CurveIndexEntry {
  key: string;
  touched: number;
}

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const isFiniteNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/** The steps the thinning rule drops from a curve of these steps (ascending) until at most `maxPoints` are left. */
export function thinnedSteps(steps: readonly number[], maxPoints: number): number[] {
  let kept = steps;
  const dropped: number[] = [];
  while (kept.length > maxPoints) {
    // the older half loses every other point; the newer half stays whole
    const half = kept.length >> 1;
    const next: number[] = [];
    for (let i = 0; i < half; i++) (i % 2 === 0 ? next : dropped).push(kept[i]);
    for (let i = half; i < kept.length; i++) next.push(kept[i]);
    kept = next;
  }
  return dropped;
}

export class LossPointStore {
  constructor(private readonly db: StateDb) {}

  /** Every stored curve's key, least recently touched first (a row whose key is not a curve's is left out). */
  curves(): CurveIndexEntry[] {
    const rows = this.db.statement('SELECT curve, touched FROM loss_curves ORDER BY touched, id').raw(true).all() as unknown[][];
    const out: CurveIndexEntry[] = [];
    for (const [key, touched] of rows) if (typeof key === 'string' && CURVE_KEY.test(key) && isCount(touched)) out.push({ key, touched });
    return out;
  }

  /** A curve's points (by step) and statuses (in order); empty when it is not stored. Invalid rows are skipped. */
  curve(key: string): StoredCurve {
    const id = this.idOf(key);
    if (id === null) return { points: [], statuses: [], skipped: 0 };
    const rows = this.db.statement('SELECT step, loss, tokens_per_second, at FROM loss_points WHERE curve_id = ? ORDER BY step').raw(true).all(id) as unknown[][];
    const points: LossPoint[] = [];
    let skipped = 0;
    for (const r of rows) {
      const [step, loss, rate, at] = r;
      if (isCount(step) && isFiniteNumber(loss) && isFiniteNumber(rate) && rate >= 0 && isCount(at)) points.push([step, loss, rate, at]);
      else skipped++;
    }
    const statusRows = this.db.statement('SELECT at, status FROM loss_statuses WHERE curve_id = ? ORDER BY seq').raw(true).all(id) as unknown[][];
    const statuses: LossStatus[] = [];
    for (const [at, status] of statusRows) {
      if (isCount(at) && typeof status === 'string' && status.length > 0 && status.length <= MAX_STATUS_LENGTH) statuses.push({ at, status });
      else skipped++;
    }
    return { points, statuses, skipped };
  }

  /**
   * One pass of the memory copy, in one transaction: drops the curves it
   * forgot, adds each touched curve's new points and statuses, removes the
   * steps it thinned, then holds the bounds (points per curve, statuses per
   * curve, curves).
   */
  write(writes: readonly CurveWrite[], forgotten: readonly string[], bounds: LossBounds): void {
    if (writes.length === 0 && forgotten.length === 0) return;
    this.db.tx(() => {
      for (const key of forgotten) this.drop(key);
      for (const w of writes) {
        if (!CURVE_KEY.test(w.key)) continue;
        const id = this.ensure(w.key, w.touched);
        if (w.replace) this.clear(id);
        const insert = this.db.statement('INSERT OR IGNORE INTO loss_points (curve_id, step, loss, tokens_per_second, at) VALUES (?, ?, ?, ?, ?)');
        let change = 0;
        for (const [step, loss, rate, at] of w.points) if (isCount(step) && isFiniteNumber(loss) && isFiniteNumber(rate) && isCount(at)) change += insert.run(id, step, loss, Math.max(0, rate), at).changes;
        const remove = this.db.statement('DELETE FROM loss_points WHERE curve_id = ? AND step = ?');
        for (const step of w.dropped) change -= remove.run(id, step).changes;
        if (change !== 0) this.db.run('UPDATE loss_curves SET points = points + ? WHERE id = ?', change, id);
        if (w.statuses.length) this.addStatuses(id, w.statuses);
        this.thinId(id, bounds.maxPoints);
      }
      this.trim(bounds.maxSeries);
    });
  }

  /** Thins a curve to at most `maxPoints` points by the memory copy's rule; returns the steps dropped. */
  thin(key: string, maxPoints: number): number[] {
    const id = this.idOf(key);
    return id === null ? [] : this.db.tx(() => this.thinId(id, maxPoints, true));
  }

  /** Keeps the `maxSeries` most recently touched curves; returns the keys dropped. */
  trim(maxSeries: number): string[] {
    const rows = this.db.statement('SELECT curve FROM loss_curves ORDER BY touched DESC, id DESC LIMIT -1 OFFSET ?').raw(true).all(Math.max(0, maxSeries)) as unknown[][];
    const keys = rows.map((r) => String(r[0]));
    if (keys.length) this.db.tx(() => keys.forEach((k) => this.drop(k)));
    return keys;
  }

  /** Forgets a curve (its points and statuses); returns whether it was stored. */
  drop(key: string): boolean {
    const id = this.idOf(key);
    if (id === null) return false;
    this.db.tx(() => {
      this.clear(id);
      this.db.run('DELETE FROM loss_curves WHERE id = ?', id);
    });
    return true;
  }

  private clear(id: number): void {
    this.db.run('DELETE FROM loss_points WHERE curve_id = ?', id);
    this.db.run('UPDATE loss_curves SET points = 0 WHERE id = ?', id);
    this.db.run('DELETE FROM loss_statuses WHERE curve_id = ?', id);
  }

  /** Points stored in a curve (0 when it is not stored). */
  count(key: string): number {
    const id = this.idOf(key);
    if (id === null) return 0;
    const row = this.db.statement('SELECT COUNT(*) FROM loss_points WHERE curve_id = ?').raw(true).get(id) as unknown[];
    return Number(row[0]);
  }

  private idOf(key: string): number | null {
    const row = this.db.statement('SELECT id FROM loss_curves WHERE curve = ?').raw(true).get(key) as unknown[] | undefined;
    return row && isCount(row[0]) ? row[0] : null;
  }

  /** The curve's id, created when new; its place in the touched order set. */
  private ensure(key: string, touched: number): number {
    const row = this.db.statement('INSERT INTO loss_curves (curve, touched) VALUES (?, ?) ON CONFLICT(curve) DO UPDATE SET touched = excluded.touched RETURNING id').raw(true).get(key, touched) as unknown[];
    return Number(row[0]);
  }

  private addStatuses(id: number, statuses: readonly LossStatus[]): void {
    const last = this.db.statement('SELECT MAX(seq) FROM loss_statuses WHERE curve_id = ?').raw(true).get(id) as unknown[];
    let seq = isCount(last[0]) ? last[0] + 1 : 0;
    const insert = this.db.statement('INSERT INTO loss_statuses (curve_id, seq, at, status) VALUES (?, ?, ?, ?)');
    for (const s of statuses) if (isCount(s.at) && s.status.length > 0 && s.status.length <= MAX_STATUS_LENGTH) insert.run(id, seq++, s.at, s.status);
    // the first status and the newest ones stay (the rule of the memory copy, applied once or per status alike)
    this.db.run(
      `DELETE FROM loss_statuses WHERE curve_id = ?
         AND seq > (SELECT MIN(seq) FROM loss_statuses WHERE curve_id = ?)
         AND seq < (SELECT seq FROM loss_statuses WHERE curve_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`,
      id,
      id,
      id,
      MAX_STATUSES - 2,
    );
  }

  /** Thins a curve past `maxPoints` (unless `recount`, the count kept in loss_curves tells, without counting its rows). */
  private thinId(id: number, maxPoints: number, recount = false): number[] {
    const n = this.db.statement('SELECT points FROM loss_curves WHERE id = ?').raw(true).get(id) as unknown[] | undefined;
    if (!recount && (!n || Number(n[0]) <= maxPoints)) return [];
    const steps = (this.db.statement('SELECT step FROM loss_points WHERE curve_id = ? ORDER BY step').raw(true).all(id) as unknown[][]).map((r) => Number(r[0]));
    const dropped = thinnedSteps(steps, maxPoints);
    if (recount && dropped.length === 0 && Number(n?.[0]) === steps.length) return [];
    const remove = this.db.statement('DELETE FROM loss_points WHERE curve_id = ? AND step = ?');
    for (const step of dropped) remove.run(id, step);
    this.db.run('UPDATE loss_curves SET points = ? WHERE id = ?', steps.length - dropped.length, id);
    return dropped;
  }
}
