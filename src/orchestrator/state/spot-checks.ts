// Spot checks: what miners committed to when they reported a forward
// (forward_commits, kept for a few minutes), and the checks asked of them.
//
// A check is asked → passed | failed (answered and verified, or not answered
// in time).
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, type Migrations, type StateDb } from './db.ts';

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
  ],
};

const Int = Type.Integer({ minimum: 0 });
const Sha = Type.Union([Type.String({ pattern: '^[0-9a-f]{64}$' }), Type.Null()]);
const NullableNumber = Type.Union([Type.Number(), Type.Null()]);

const CommitRow = Type.Object({
  microbatch: Int,
  stage: Int,
  minerId: Type.String(),
  /** sha256 of the activation frame sent / received */
  outputSha: Sha,
  inputSha: Sha,
  /** the loss reported (last stage) */
  loss: NullableNumber,
  at: Int,
});
/** What a miner committed to when it reported a forward. */
export type ForwardCommit = Static<typeof CommitRow>;
const decodeCommit = rowReader(CommitRow, 'forward commitment');

export const SpotCheckStatus = Type.Union([Type.Literal('asked'), Type.Literal('passed'), Type.Literal('failed'), Type.Literal('skipped')]);
export type SpotCheckStatus = Static<typeof SpotCheckStatus>;

const CheckRow = Type.Object({
  id: Int,
  runId: Type.String(),
  microbatch: Int,
  stage: Int,
  minerId: Type.String(),
  status: SpotCheckStatus,
  createdAt: Int,
  decidedAt: Type.Union([Int, Type.Null()]),
  cosine: NullableNumber,
  normRatio: NullableNumber,
  detail: Type.Union([Type.String(), Type.Null()]),
});
export type SpotCheckRecord = Static<typeof CheckRow>;
const CHECK_COLUMNS = 'id, run_id AS runId, microbatch, stage, miner_id AS minerId, status, created_at AS createdAt, decided_at AS decidedAt, cosine, norm_ratio AS normRatio, detail';
const decodeCheck = rowReader(CheckRow, 'spot check');

const TotalRow = Type.Object({ minerId: Type.String(), status: SpotCheckStatus, n: Int });
export type CheckTotal = Static<typeof TotalRow>;
const decodeTotal = rowReader(TotalRow, 'spot check total');

/** How a check was decided. */
export interface CheckDecision {
  status: 'passed' | 'failed';
  cosine: number | null;
  normRatio: number | null;
  detail: string;
}

export class SpotCheckStore {
  constructor(private readonly db: StateDb) {}

  putCommit(c: ForwardCommit): void {
    this.db.run(
      'INSERT OR REPLACE INTO forward_commits (microbatch, stage, miner_id, output_sha, input_sha, loss, at) VALUES (?, ?, ?, ?, ?, ?, ?)',
      c.microbatch,
      c.stage,
      c.minerId,
      c.outputSha,
      c.inputSha,
      c.loss,
      c.at,
    );
  }

  /** The commitments reported for a microbatch at a stage (several when it was re-issued), newest first. */
  commits(microbatch: number, stage: number): ForwardCommit[] {
    return all(
      this.db,
      decodeCommit,
      'SELECT microbatch, stage, miner_id AS minerId, output_sha AS outputSha, input_sha AS inputSha, loss, at FROM forward_commits WHERE microbatch = ? AND stage = ? ORDER BY at DESC',
      microbatch,
      stage,
    );
  }

  deleteCommitsBefore(at: number): void {
    this.db.run('DELETE FROM forward_commits WHERE at < ?', at);
  }

  /** Asks a check of a reported forward; returns its id. */
  ask(c: { runId: string; microbatch: number; stage: number; minerId: string; createdAt: number }): number {
    return Number(
      this.db.run(
        "INSERT INTO spot_checks (run_id, microbatch, stage, miner_id, status, created_at) VALUES (?, ?, ?, ?, 'asked', ?)",
        c.runId,
        c.microbatch,
        c.stage,
        c.minerId,
        c.createdAt,
      ).lastInsertRowid,
    );
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

  askedBefore(at: number): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks WHERE status = 'asked' AND created_at < ? ORDER BY id`, at);
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

  list(): SpotCheckRecord[] {
    return all(this.db, decodeCheck, `SELECT ${CHECK_COLUMNS} FROM spot_checks ORDER BY id`);
  }

  /** Checks per miner and status, of one run or of all. */
  totals(runId?: string): CheckTotal[] {
    return all(
      this.db,
      decodeTotal,
      `SELECT miner_id AS minerId, status, COUNT(*) AS n FROM spot_checks ${runId ? 'WHERE run_id = ?' : ''} GROUP BY miner_id, status ORDER BY miner_id, status`,
      ...(runId ? [runId] : []),
    );
  }
}

/** Stored figures are finite numbers or null (a norm ratio can be infinite when a miner sent zeros). */
function finiteOrNull(x: number | null): number | null {
  return x !== null && Number.isFinite(x) ? x : null;
}
