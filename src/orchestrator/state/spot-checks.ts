// Spot checks asked of miners: which forward (microbatch, attempt, stage) of
// whose, when it was first delivered in a heartbeat reply, and the outcome.
// What the miner committed to for that forward is its hop claim
// (./claims.ts).
//
// A check is asked → passed | failed (answered and verified, or not answered
// within the timeout counted from its delivery), or → skipped (its run ended
// before any heartbeat reply named it). Decided checks are deleted after a
// while; their counts per run, miner and status are kept (spot_check_totals).
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const SPOT_CHECK_MIGRATIONS: Migrations = {
  store: 'spot_checks',
  steps: [
    `CREATE TABLE IF NOT EXISTS forward_commits (
      microbatch INTEGER NOT NULL, stage INTEGER NOT NULL, miner_id TEXT NOT NULL, output_sha TEXT, input_sha TEXT, loss REAL,
      at INTEGER NOT NULL, PRIMARY KEY (microbatch, stage, miner_id)
    );
    CREATE INDEX IF NOT EXISTS forward_commits_by_time ON forward_commits (at);
    CREATE TABLE IF NOT EXISTS spot_checks (
      id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, microbatch INTEGER NOT NULL, stage INTEGER NOT NULL,
      miner_id TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL, decided_at INTEGER,
      cosine REAL, norm_ratio REAL, detail TEXT
    );
    CREATE INDEX IF NOT EXISTS spot_checks_by_miner ON spot_checks (miner_id, status);
    CREATE INDEX IF NOT EXISTS spot_checks_by_status ON spot_checks (status, created_at)`,
    // commitments moved to hop claims; a check names its attempt and counts its timeout from its delivery
    `DROP TABLE IF EXISTS forward_commits;
    ALTER TABLE spot_checks ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE spot_checks ADD COLUMN delivered_at INTEGER`,
    // decided checks are deleted after a while (src/orchestrator/blobs/gc.ts); their counts stay here
    `CREATE TABLE IF NOT EXISTS spot_check_totals (
      run_id TEXT NOT NULL, miner_id TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL,
      PRIMARY KEY (run_id, miner_id, status)
    )`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const NullableNumber = Type.Union([Type.Number(), Type.Null()]);

export const SpotCheckStatus = Type.Union([Type.Literal('asked'), Type.Literal('passed'), Type.Literal('failed'), Type.Literal('skipped')]);
export type SpotCheckStatus = Static<typeof SpotCheckStatus>;

const CheckRow = Type.Object({
  id: Int,
  runId: Type.String(),
  microbatch: Int,
  attempt: Int,
  stage: Int,
  minerId: Type.String(),
  status: SpotCheckStatus,
  createdAt: Int,
  /** when a heartbeat reply first named it (null: not yet) */
  deliveredAt: Type.Union([Int, Type.Null()]),
  decidedAt: Type.Union([Int, Type.Null()]),
  cosine: NullableNumber,
  normRatio: NullableNumber,
  detail: Type.Union([Type.String(), Type.Null()]),
});
export type SpotCheckRecord = Static<typeof CheckRow>;
const CHECK_COLUMNS = 'id, run_id AS runId, microbatch, attempt, stage, miner_id AS minerId, status, created_at AS createdAt, delivered_at AS deliveredAt, decided_at AS decidedAt, cosine, norm_ratio AS normRatio, detail';
const decodeCheck = rowReader(CheckRow, 'spot check');

const TotalRow = Type.Object({ minerId: Type.String(), status: SpotCheckStatus, n: Int });
export type CheckTotal = Static<typeof TotalRow>;
const decodeTotal = rowReader(TotalRow, 'spot check total');
const decodeId = rowReader(Type.Object({ id: Int }), 'spot check id');

/** How a check was decided. */
export interface CheckDecision {
  status: 'passed' | 'failed';
  cosine: number | null;
  normRatio: number | null;
  detail: string;
}

export class SpotCheckStore {
  constructor(private readonly db: StateDb) {}

  /** Asks a check of a reported forward; returns its id. */
  ask(c: { runId: string; microbatch: number; attempt: number; stage: number; minerId: string; createdAt: number }): number {
    return scalar(
      this.db,
      "INSERT INTO spot_checks (run_id, microbatch, attempt, stage, miner_id, status, created_at) VALUES (?, ?, ?, ?, ?, 'asked', ?) RETURNING id",
      c.runId,
      c.microbatch,
      c.attempt,
      c.stage,
      c.minerId,
      c.createdAt,
    );
  }

  /** The open checks of a miner, oldest first. */
  openOf(minerId: string, limit = 4096): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks WHERE miner_id = ? AND status = 'asked' ORDER BY id LIMIT ?`, minerId, limit);
  }

  /** A heartbeat reply named these checks: their timeout starts now, if it has not. */
  markDelivered(ids: readonly number[], now: number): void {
    for (const id of ids) this.db.run('UPDATE spot_checks SET delivered_at = ? WHERE id = ? AND delivered_at IS NULL', now, id);
  }

  /** After a restart: the open checks' timeouts start again (nobody could answer while it was down). */
  restartTimeouts(now: number): void {
    this.db.run("UPDATE spot_checks SET delivered_at = ? WHERE status = 'asked' AND delivered_at IS NOT NULL", now);
  }

  /** The open check of `microbatch` asked of `minerId`. */
  asked(minerId: string, runId: string, microbatch: number): SpotCheckRecord | undefined {
    return one(
      this.db,
      decodeCheck,
      `SELECT ${CHECK_COLUMNS} FROM spot_checks WHERE miner_id = ? AND run_id = ? AND microbatch = ? AND status = 'asked' ORDER BY id DESC LIMIT 1`,
      minerId,
      runId,
      microbatch,
    );
  }

  /** Open checks delivered before `at`. */
  deliveredBefore(at: number): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks WHERE status = 'asked' AND delivered_at < ? ORDER BY id`, at);
  }

  /** asked → passed | failed. */
  decide(id: number, d: CheckDecision, now: number): void {
    this.db.run(
      'UPDATE spot_checks SET status = ?, decided_at = ?, cosine = ?, norm_ratio = ?, detail = ? WHERE id = ?',
      d.status,
      now,
      finiteOrNull(d.cosine),
      finiteOrNull(d.normRatio),
      d.detail.slice(0, 500),
      id,
    );
  }

  /** asked → skipped: the open checks of a run that no heartbeat reply named (its miner never heard of them); returns how many. */
  skipUndelivered(runId: string, detail: string, now: number): number {
    return this.db.run("UPDATE spot_checks SET status = 'skipped', decided_at = ?, detail = ? WHERE run_id = ? AND status = 'asked' AND delivered_at IS NULL", now, detail.slice(0, 500), runId)
      .changes;
  }

  /** Every open check, oldest first. */
  open(): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks WHERE status = 'asked' ORDER BY id`);
  }

  /** Deletes at most `limit` checks decided before `before`, adding them to the kept totals; returns how many went. */
  deleteDecidedBefore(before: number, limit: number): number {
    const ids = JSON.stringify(
      all(this.db, decodeId, "SELECT id FROM spot_checks WHERE status != 'asked' AND decided_at < ? ORDER BY id LIMIT ?", before, limit).map((r) => r.id),
    );
    this.db.run(
      `INSERT INTO spot_check_totals (run_id, miner_id, status, n)
       SELECT run_id, miner_id, status, COUNT(*) FROM spot_checks WHERE id IN (SELECT CAST(value AS INTEGER) FROM json_each(?)) GROUP BY run_id, miner_id, status
       ON CONFLICT (run_id, miner_id, status) DO UPDATE SET n = spot_check_totals.n + excluded.n`,
      ids,
    );
    return this.db.run('DELETE FROM spot_checks WHERE id IN (SELECT CAST(value AS INTEGER) FROM json_each(?))', ids).changes;
  }

  list(): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks ORDER BY id`);
  }

  /** Checks per miner and status, of one run or of all (the ones kept and the ones deleted after being decided). */
  totals(runId?: string): CheckTotal[] {
    const where = runId ? 'WHERE run_id = ?' : '';
    return all(
      this.db,
      decodeTotal,
      `SELECT minerId, status, SUM(n) AS n FROM (
         SELECT miner_id AS minerId, status, COUNT(*) AS n FROM spot_checks ${where} GROUP BY miner_id, status
         UNION ALL SELECT miner_id AS minerId, status, n FROM spot_check_totals ${where}
       ) AS checks GROUP BY minerId, status ORDER BY minerId, status`,
      ...(runId ? [runId, runId] : []),
    );
  }
}

/** Stored figures are finite numbers or null (a norm ratio can be infinite when a miner sent zeros). */
function finiteOrNull(x: number | null): number | null {
  return x !== null && Number.isFinite(x) ? x : null;
}
