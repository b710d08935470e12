// Microbatches: a shard of a run's data on its way through the pipeline.
//
// pending → issued (to a stage-0 replica, with a deadline) → done (every
// hop's forward and backward reported). An issued microbatch goes back to
// pending when a miner on its path vanishes, drops it, or its deadline
// passes. `path` is the miner that took it at each stage, as far as it got;
// `progress` has one bit per forward hop (bit s) and per backward hop
// (bit S + s).
import { Type, type Static } from '@sinclair/typebox';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const MICROBATCH_MIGRATIONS: Migrations = {
  store: 'microbatches',
  steps: [
    `CREATE TABLE IF NOT EXISTS microbatches (
      id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, shard INTEGER NOT NULL, step INTEGER NOT NULL,
      status TEXT NOT NULL, miner_id TEXT, path TEXT, progress INTEGER NOT NULL DEFAULT 0,
      issued_at INTEGER, deadline INTEGER, attempts INTEGER NOT NULL DEFAULT 0, loss REAL
    );
    CREATE INDEX IF NOT EXISTS microbatches_by_status ON microbatches (run_id, status)`,
  ],
};

export const MicrobatchStatus = Type.Union([Type.Literal('pending'), Type.Literal('issued'), Type.Literal('done'), Type.Literal('dropped')]);
export type MicrobatchStatus = Static<typeof MicrobatchStatus>;

/** The miner at each stage, as far as the microbatch got (null: not known yet). */
const Path = Type.Array(Type.Union([Type.String(), Type.Null()]), { maxItems: 4096 });

const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);
const MicrobatchRow = Type.Object({
  id: Int,
  runId: Type.String(),
  shard: Int,
  step: Int,
  status: MicrobatchStatus,
  minerId: Type.Union([Type.String(), Type.Null()]),
  path: Type.Union([Type.String(), Type.Null()]),
  progress: Int,
  issuedAt: NullableInt,
  deadline: NullableInt,
  attempts: Int,
  loss: Type.Union([Type.Number(), Type.Null()]),
});

export interface MicrobatchRecord extends Omit<Static<typeof MicrobatchRow>, 'path'> {
  path: (string | null)[];
}

const decodeRunId = rowReader(Type.Object({ runId: Type.String() }), 'run id');
const COLUMNS = 'id, run_id AS runId, shard, step, status, miner_id AS minerId, path, progress, issued_at AS issuedAt, deadline, attempts, loss';
const readRow = rowReader(MicrobatchRow, 'microbatch');
function decode(row: unknown): MicrobatchRecord {
  const r = readRow(row);
  return { ...r, path: r.path === null ? [] : jsonColumn(Path, r.path, `path of microbatch ${r.id}`) };
}

export class MicrobatchStore {
  constructor(private readonly db: StateDb) {}

  /** A new pending microbatch; returns its id. */
  insert(runId: string, shard: number, step: number): number {
    return scalar(this.db, "INSERT INTO microbatches (run_id, shard, step, status) VALUES (?, ?, ?, 'pending') RETURNING id", runId, shard, step);
  }

  get(id: number): MicrobatchRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM microbatches WHERE id = ?`, id);
  }

  byStatus(runId: string, status: MicrobatchStatus, limit = 1_000_000): MicrobatchRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM microbatches WHERE run_id = ? AND status = ? ORDER BY id LIMIT ?`, runId, status, limit);
  }

  count(runId: string, status: MicrobatchStatus): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM microbatches WHERE run_id = ? AND status = ?', runId, status);
  }

  /** Microbatches issued to a stage-0 miner and not done. */
  issuedTo(minerId: string): MicrobatchRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM microbatches WHERE miner_id = ? AND status = 'issued' ORDER BY id`, minerId);
  }

  /** pending → issued to a stage-0 miner, which is the start of its path. */
  /** Issued microbatches get at least until `deadline` (the orchestrator was down: its downtime is nobody's delay). */
  extendDeadlines(deadline: number): void {
    this.db.run("UPDATE microbatches SET deadline = MAX(deadline, ?) WHERE status = 'issued'", deadline);
  }

  issue(id: number, minerId: string, now: number, deadline: number): void {
    this.db.run(
      "UPDATE microbatches SET status = 'issued', miner_id = ?, path = ?, progress = 0, issued_at = ?, deadline = ?, attempts = attempts + 1 WHERE id = ?",
      minerId,
      JSON.stringify([minerId]),
      now,
      deadline,
      id,
    );
  }

  /** issued → pending: to be issued again. */
  requeue(id: number): void {
    this.db.run("UPDATE microbatches SET status = 'pending', miner_id = NULL, deadline = NULL WHERE id = ?", id);
  }

  /** A hop reported: new progress bits, the path as now known, the loss (last stage). */
  recordHop(id: number, progress: number, path: readonly (string | null)[], loss: number | null): void {
    this.db.run('UPDATE microbatches SET progress = ?, path = ?, loss = COALESCE(?, loss) WHERE id = ?', progress, JSON.stringify(path), loss, id);
  }

  /** issued → done, with the path it took and its loss. */
  complete(id: number, progress: number, path: readonly string[], loss: number | null): void {
    this.db.run("UPDATE microbatches SET status = 'done', progress = ?, path = ?, loss = ? WHERE id = ?", progress, JSON.stringify(path), loss, id);
  }

  // ---- collection (src/orchestrator/blobs/gc.ts) ------------------------------------

  /** Runs with microbatch rows kept. */
  runIds(): string[] {
    return all(this.db, decodeRunId, 'SELECT DISTINCT run_id AS runId FROM microbatches ORDER BY run_id').map((r) => r.runId);
  }

  /** Deletes at most `limit` done microbatches issued before `before`, except those in `keep`; the run's counters keep counting them. */
  deleteDone(before: number, keep: readonly number[], limit: number): number {
    return this.db.run(
      `DELETE FROM microbatches WHERE id IN (
         SELECT id FROM microbatches WHERE status = 'done' AND issued_at < ? AND id NOT IN (SELECT CAST(value AS INTEGER) FROM json_each(?)) ORDER BY id LIMIT ?
       )`,
      before,
      JSON.stringify(keep),
      limit,
    ).changes;
  }

  /** Deletes at most `limit` microbatches of an ended run (whatever their status), except those in `keep`. */
  deleteOfRun(runId: string, keep: readonly number[], limit: number): number {
    return this.db.run(
      'DELETE FROM microbatches WHERE id IN (SELECT id FROM microbatches WHERE run_id = ? AND id NOT IN (SELECT CAST(value AS INTEGER) FROM json_each(?)) ORDER BY id LIMIT ?)',
      runId,
      JSON.stringify(keep),
      limit,
    ).changes;
  }
}
