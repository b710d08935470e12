// What miners are paid from: the work log (units of work done and penalties),
// epochs (a range of the work log scored and settled together), each epoch's
// reward split, and the slashes decided when an epoch closed.
//
// Epoch: open → settling (closed: scored, split written) → settled (on chain,
// or nothing to pay). Slash (one per offence, src/orchestrator/rewards/offences.ts): pending (amount fixed
// from the stake right after the offence, before the first send; the
// transaction's hash recorded as soon as the node took it, before its receipt
// is awaited) → slashed | skipped (nothing staked). Its reason is its offence
// id on chain (keccak256), which the Staking contract takes once.
import { Type, type Static } from '@sinclair/typebox';
import { EpochStatus, WorkKind } from '../../api/schemas.ts';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type SqlValue, type StateDb } from './db.ts';

export const LEDGER_MIGRATIONS: Migrations = {
  store: 'ledger',
  steps: [
    `CREATE TABLE IF NOT EXISTS work_log (
      id INTEGER PRIMARY KEY AUTOINCREMENT, miner_id TEXT NOT NULL, run_id TEXT, kind TEXT NOT NULL,
      units REAL NOT NULL, stage INTEGER, at INTEGER NOT NULL, detail TEXT
    );
    CREATE INDEX IF NOT EXISTS work_by_miner ON work_log (miner_id, kind);
    CREATE TABLE IF NOT EXISTS epochs (
      id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, from_log INTEGER NOT NULL, to_log INTEGER,
      opened_at INTEGER NOT NULL, closed_at INTEGER, merges_mark INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL,
      emission TEXT, remainder TEXT, chain_id INTEGER, chain_epoch TEXT, tx_hash TEXT, settled_at INTEGER, error TEXT
    );
    CREATE TABLE IF NOT EXISTS slashes (
      epoch INTEGER NOT NULL, miner TEXT NOT NULL, failed INTEGER NOT NULL, fraction REAL NOT NULL, amount TEXT,
      reason TEXT NOT NULL, status TEXT NOT NULL, tx_hash TEXT, error TEXT,
      PRIMARY KEY (epoch, miner)
    );
    CREATE TABLE IF NOT EXISTS epoch_rewards (
      epoch INTEGER NOT NULL, miner TEXT NOT NULL, score REAL NOT NULL, amount TEXT NOT NULL, units TEXT NOT NULL,
      PRIMARY KEY (epoch, miner)
    )`,
    // one slash per failed spot check (it was one per epoch and miner, past a threshold)
    `CREATE TABLE slashes_by_check (
      id INTEGER PRIMARY KEY AUTOINCREMENT, epoch INTEGER NOT NULL, miner TEXT NOT NULL, check_id INTEGER UNIQUE,
      failed INTEGER NOT NULL, fraction REAL NOT NULL, amount TEXT, reason TEXT NOT NULL UNIQUE, status TEXT NOT NULL, tx_hash TEXT, error TEXT
    );
    INSERT INTO slashes_by_check (epoch, miner, failed, fraction, amount, reason, status, tx_hash, error)
      SELECT epoch, miner, failed, fraction, amount, reason, status, tx_hash, error FROM slashes ORDER BY epoch, miner;
    DROP TABLE slashes;
    ALTER TABLE slashes_by_check RENAME TO slashes;
    CREATE INDEX slashes_by_status ON slashes (status)`,
    // inference work names the deployment it served (its stage shares weigh it, as a run's weigh training)
    `ALTER TABLE work_log ADD COLUMN deployment_id TEXT`,
    // old entries folded into sums (src/orchestrator/blobs/gc.ts): '' for no run or deployment, -1 for no stage
    `CREATE TABLE work_totals (
      miner_id TEXT NOT NULL, run_id TEXT NOT NULL, deployment_id TEXT NOT NULL, kind TEXT NOT NULL, stage INTEGER NOT NULL,
      units REAL NOT NULL, entries INTEGER NOT NULL,
      PRIMARY KEY (miner_id, run_id, deployment_id, kind, stage)
    )`,
    // a failing settlement or slash is tried again after a growing wait (src/orchestrator/rewards/backoff.ts): its tries and the next
    `ALTER TABLE epochs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE epochs ADD COLUMN retry_at INTEGER;
    ALTER TABLE slashes ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE slashes ADD COLUMN retry_at INTEGER`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);
const NullableText = Type.Union([Type.String(), Type.Null()]);
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });

// ---- the work log ------------------------------------------------------------------

/** One entry of the work log. */
export interface WorkEntry {
  minerId: string;
  runId: string | null;
  /** the deployment served (inference work); default null */
  deploymentId?: string | null;
  kind: WorkKind;
  /** default 1 */
  units?: number;
  stage?: number | null;
  detail?: string | null;
}

const WorkRow = Type.Object({ id: Int, minerId: Type.String(), runId: NullableText, deploymentId: NullableText, kind: WorkKind, units: Type.Number(), stage: NullableInt });
export type WorkRecord = Static<typeof WorkRow>;
const decodeWork = rowReader(WorkRow, 'work log entry');

const TotalRow = Type.Object({ minerId: Type.String(), kind: WorkKind, units: Type.Number() });
export type WorkTotalRecord = Static<typeof TotalRow>;
const decodeTotal = rowReader(TotalRow, 'work total');
const decodeAt = rowReader(Type.Object({ at: Int }), 'work log time');
const decodeMinerUnits = rowReader(Type.Object({ minerId: Type.String(), units: Type.Number() }), 'units of a miner');

// ---- epochs -------------------------------------------------------------------------

const EpochRow = Type.Object({
  id: Int,
  /** the run whose merge rounds (or end) closed the epoch */
  runId: NullableText,
  /** work_log ids in (fromLog, toLog] */
  fromLog: Int,
  toLog: NullableInt,
  openedAt: Int,
  closedAt: NullableInt,
  /** merge rounds of runId done when it closed */
  mergesMark: Int,
  status: EpochStatus,
  /** wei */
  emission: Type.Union([Wei, Type.Null()]),
  remainder: Type.Union([Wei, Type.Null()]),
  chainId: NullableInt,
  /** the epoch id used on chain */
  chainEpoch: Type.Union([Wei, Type.Null()]),
  txHash: NullableText,
  settledAt: NullableInt,
  error: NullableText,
  /** failed tries of its settlement, and when it is tried next (null: at the next pass) */
  attempts: Int,
  retryAt: NullableInt,
});
export type EpochRecord = Static<typeof EpochRow>;
const EPOCH_COLUMNS = `id, run_id AS runId, from_log AS fromLog, to_log AS toLog, opened_at AS openedAt, closed_at AS closedAt,
  merges_mark AS mergesMark, status, emission, remainder, chain_id AS chainId, chain_epoch AS chainEpoch, tx_hash AS txHash,
  settled_at AS settledAt, error, attempts, retry_at AS retryAt`;
const decodeEpoch = rowReader(EpochRow, 'epoch');

/** What closing an epoch records. */
export interface EpochClose {
  runId: string | null;
  mergesMark: number;
  toLog: number;
  closedAt: number;
  emission: bigint;
  remainder: bigint;
  /** nothing to pay: settled at once */
  settled: boolean;
}

const Units = Type.Record(Type.String(), Type.Number());
const RewardRow = Type.Object({ epoch: Int, miner: Type.String(), score: Type.Number(), amount: Wei, units: Type.String() });
export interface EpochRewardRecord extends Omit<Static<typeof RewardRow>, 'units'> {
  /** units of work per kind */
  units: Record<string, number>;
}
const readReward = rowReader(RewardRow, 'epoch reward');
const decodeReward = (row: unknown): EpochRewardRecord => {
  const r = readReward(row);
  return { ...r, units: jsonColumn(Units, r.units, `units of ${r.miner} in epoch ${r.epoch}`) };
};

// ---- slashes ------------------------------------------------------------------------

export const SlashStatus = Type.Union([Type.Literal('pending'), Type.Literal('slashed'), Type.Literal('skipped')]);
export type SlashStatus = Static<typeof SlashStatus>;
const SlashRow = Type.Object({
  id: Int,
  /** the epoch the offence fell in */
  epoch: Int,
  miner: Type.String(),
  /** the failed spot check it punishes (null: a slash of an earlier version, per epoch) */
  checkId: Type.Union([Int, Type.Null()]),
  /** failed checks it punishes */
  failed: Int,
  /** share of the stake to slash */
  fraction: Type.Number({ minimum: 0, maximum: 1 }),
  /** wei, fixed before the first send */
  amount: Type.Union([Wei, Type.Null()]),
  /** the on-chain reason, unique: its keccak256 is the offence id the Staking contract takes once */
  reason: Type.String(),
  status: SlashStatus,
  /** the transaction (pending: sent, its receipt not seen yet) */
  txHash: NullableText,
  error: NullableText,
  /** failed tries, and when it is tried next (null: at the next pass) */
  attempts: Int,
  retryAt: NullableInt,
});
export type SlashRecord = Static<typeof SlashRow>;
const SLASH_COLUMNS = 'id, epoch, miner, check_id AS checkId, failed, fraction, amount, reason, status, tx_hash AS txHash, error, attempts, retry_at AS retryAt';
const decodeSlash = rowReader(SlashRow, 'slash');

export class Ledger {
  constructor(private readonly db: StateDb) {}

  // ---- the work log ----------------------------------------------------------------

  logWork(w: WorkEntry, now: number): void {
    this.db.run(
      'INSERT INTO work_log (miner_id, run_id, deployment_id, kind, units, stage, at, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      w.minerId,
      w.runId,
      w.deploymentId ?? null,
      w.kind,
      w.units ?? 1,
      w.stage ?? null,
      now,
      w.detail?.slice(0, 500) ?? null,
    );
  }

  /** Units per miner and kind (of one run, or of all): the entries and the sums old ones were folded into. */
  workTotals(runId?: string): WorkTotalRecord[] {
    const where = runId ? 'WHERE run_id = ?' : '';
    return all(
      this.db,
      decodeTotal,
      `SELECT minerId, kind, SUM(units) AS units FROM (
        SELECT miner_id AS minerId, kind, units FROM work_log ${where}
        UNION ALL SELECT miner_id AS minerId, kind, units FROM work_totals ${where}
      ) AS entries GROUP BY minerId, kind ORDER BY minerId, kind`,
      ...(runId ? [runId, runId] : []),
    );
  }

  /**
   * Folds entries nothing reads one by one any more into work_totals (summed
   * per miner, run, deployment, kind and stage; workTotals still counts them)
   * and deletes them: ids up to `upToId` (paid: their epochs are settled),
   * logged before `before`, and for each run in `runCutoffs` (the active
   * ones) logged before its cutoff too. The newest entry always stays, so
   * lastWorkId never goes back. At most `limit`; returns how many.
   */
  foldWork(q: { upToId: number; before: number; runCutoffs: ReadonlyMap<string, number>; limit: number }): number {
    const common = 'id <= ? AND id < (SELECT MAX(id) FROM work_log) AND at < ?';
    const active = JSON.stringify([...q.runCutoffs.keys()]);
    let folded = this.fold(`${common} AND (run_id IS NULL OR run_id NOT IN (SELECT value FROM json_each(?)))`, [q.upToId, q.before, active], q.limit);
    for (const [runId, cutoff] of q.runCutoffs) {
      if (folded >= q.limit) break;
      folded += this.fold(`${common} AND run_id = ?`, [q.upToId, Math.min(q.before, cutoff), runId], q.limit - folded);
    }
    return folded;
  }

  private fold(where: string, params: SqlValue[], limit: number): number {
    const pick = `SELECT id FROM work_log WHERE ${where} ORDER BY id LIMIT ?`;
    this.db.run(
      `INSERT INTO work_totals (miner_id, run_id, deployment_id, kind, stage, units, entries)
        SELECT miner_id, COALESCE(run_id, ''), COALESCE(deployment_id, ''), kind, COALESCE(stage, -1), SUM(units), COUNT(*)
        FROM work_log WHERE id IN (${pick}) GROUP BY 1, 2, 3, 4, 5
        ON CONFLICT (miner_id, run_id, deployment_id, kind, stage) DO UPDATE SET units = work_totals.units + excluded.units, entries = work_totals.entries + excluded.entries`,
      ...params,
      limit,
    );
    return this.db.run(`DELETE FROM work_log WHERE id IN (${pick})`, ...params, limit).changes;
  }

  /** Entries in the log (folded ones are not). */
  workEntries(): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM work_log');
  }

  /**
   * The last entry every epoch that covers it has settled (null: no epoch
   * was ever opened, the orchestrator does not pay): entries up to it are
   * paid and can be folded.
   */
  settledWorkMark(): number | null {
    if (scalar(this.db, 'SELECT COUNT(*) AS n FROM epochs') === 0) return null;
    const unsettled = scalar(this.db, "SELECT COALESCE(MIN(from_log), -1) AS n FROM epochs WHERE status != 'settled'");
    return unsettled >= 0 ? unsettled : scalar(this.db, 'SELECT COALESCE(MAX(to_log), 0) AS n FROM epochs');
  }

  /** Units of `kinds` per miner logged after entry `afterId` (a range of the primary key: cheap on a long log). */
  unitsSince(afterId: number, kinds: readonly WorkKind[]): { minerId: string; units: number }[] {
    return all(
      this.db,
      decodeMinerUnits,
      `SELECT miner_id AS minerId, SUM(units) AS units FROM work_log WHERE id > ? AND kind IN (${kinds.map(() => '?').join(', ')}) GROUP BY miner_id`,
      afterId,
      ...kinds,
    );
  }

  /** When the first entry after id `afterId` was logged (null: none): the oldest work an open epoch owes. */
  firstWorkAtAfter(afterId: number): number | null {
    const row = one(this.db, decodeAt, 'SELECT at FROM work_log WHERE id > ? ORDER BY id LIMIT 1', afterId);
    return row ? row.at : null;
  }

  lastWorkId(): number {
    return scalar(this.db, 'SELECT COALESCE(MAX(id), 0) AS n FROM work_log');
  }

  /** Entries with ids in (fromExclusive, toInclusive]. */
  workBetween(fromExclusive: number, toInclusive: number): WorkRecord[] {
    return all(
      this.db,
      decodeWork,
      'SELECT id, miner_id AS minerId, run_id AS runId, deployment_id AS deploymentId, kind, units, stage FROM work_log WHERE id > ? AND id <= ? ORDER BY id',
      fromExclusive,
      toInclusive,
    );
  }

  /** Units of `kind` a miner was credited at a stage of a run, logged in (after, until]. */
  unitsBetween(q: { minerId: string; runId: string; stage: number; kind: WorkKind; after: number; until: number }): number {
    return scalar(
      this.db,
      'SELECT COALESCE(SUM(units), 0) AS n FROM work_log WHERE miner_id = ? AND run_id = ? AND stage = ? AND kind = ? AND at > ? AND at <= ?',
      q.minerId,
      q.runId,
      q.stage,
      q.kind,
      q.after,
      q.until,
    );
  }

  /** Entries of `runId` logged after id `after`. */
  countWorkAfter(after: number, runId: string): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM work_log WHERE id > ? AND run_id = ?', after, runId);
  }

  // ---- epochs -------------------------------------------------------------------

  epoch(id: number): EpochRecord | undefined {
    return one(this.db, decodeEpoch, `SELECT ${EPOCH_COLUMNS} FROM epochs WHERE id = ?`, id);
  }

  epochs(status?: EpochStatus): EpochRecord[] {
    return all(this.db, decodeEpoch, `SELECT ${EPOCH_COLUMNS} FROM epochs ${status ? 'WHERE status = ?' : ''} ORDER BY id`, ...(status ? [status] : []));
  }

  /** The open epoch (created on first use, starting after the last closed one). */
  openEpoch(now: number): EpochRecord {
    const open = one(this.db, decodeEpoch, `SELECT ${EPOCH_COLUMNS} FROM epochs WHERE status = 'open' ORDER BY id DESC LIMIT 1`);
    if (open) return open;
    const from = scalar(this.db, 'SELECT COALESCE(MAX(to_log), 0) AS n FROM epochs');
    const id = scalar(this.db, "INSERT INTO epochs (from_log, opened_at, status) VALUES (?, ?, 'open') RETURNING id", from, now);
    return this.epoch(id)!;
  }

  /** The last merges mark recorded for a run (0 when no epoch was closed by it). */
  runMergesMark(runId: string): number {
    return scalar(this.db, 'SELECT COALESCE(MAX(merges_mark), 0) AS n FROM epochs WHERE run_id = ?', runId);
  }

  /** open → settling (or settled when there is nothing to pay). */
  closeEpoch(id: number, c: EpochClose): void {
    this.db.run(
      'UPDATE epochs SET run_id = ?, merges_mark = ?, to_log = ?, closed_at = ?, status = ?, emission = ?, remainder = ?, settled_at = ? WHERE id = ?',
      c.runId,
      c.mergesMark,
      c.toLog,
      c.closedAt,
      c.settled ? 'settled' : 'settling',
      c.emission.toString(),
      c.remainder.toString(),
      c.settled ? c.closedAt : null,
      id,
    );
  }

  /** The on-chain epoch id chosen for a settling epoch (written before anything is sent). */
  setChainEpoch(id: number, chainEpoch: bigint, chainId: number): void {
    this.db.run('UPDATE epochs SET chain_epoch = ?, chain_id = ? WHERE id = ?', chainEpoch.toString(), chainId, id);
  }

  /** settling → settled. */
  markSettled(id: number, txHash: string | null, now: number): void {
    this.db.run("UPDATE epochs SET status = 'settled', tx_hash = COALESCE(?, tx_hash), settled_at = ?, error = NULL, retry_at = NULL WHERE id = ?", txHash, now, id);
  }

  /** A failed try of its settlement: the error, the tries so far, the next (src/orchestrator/rewards/backoff.ts). */
  setEpochError(id: number, error: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE epochs SET error = ?, attempts = ?, retry_at = ? WHERE id = ?', error.slice(0, 500), attempts, retryAt, id);
  }

  /** The highest on-chain epoch id used so far (0n when none). */
  maxChainEpoch(): bigint {
    return this.epochs().reduce((m, e) => (e.chainEpoch !== null && BigInt(e.chainEpoch) > m ? BigInt(e.chainEpoch) : m), 0n);
  }

  putReward(r: { epoch: number; miner: string; score: number; amount: bigint; units: Record<string, number> }): void {
    this.db.run(
      `INSERT INTO epoch_rewards (epoch, miner, score, amount, units) VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (epoch, miner) DO UPDATE SET score = excluded.score, amount = excluded.amount, units = excluded.units`,
      r.epoch,
      r.miner,
      r.score,
      r.amount.toString(),
      JSON.stringify(r.units),
    );
  }

  rewards(epoch: number): EpochRewardRecord[] {
    return all(this.db, decodeReward, 'SELECT epoch, miner, score, amount, units FROM epoch_rewards WHERE epoch = ? ORDER BY miner', epoch);
  }

  // ---- slashes ----------------------------------------------------------------

  /** A pending slash for an offence (src/orchestrator/rewards/offences.ts), once per reason (and per spot check). */
  putSlash(s: { epoch: number; miner: string; checkId: number | null; fraction: number; reason: string }): void {
    this.db.run(
      "INSERT OR IGNORE INTO slashes (epoch, miner, check_id, failed, fraction, reason, status) VALUES (?, ?, ?, 1, ?, ?, 'pending')",
      s.epoch,
      s.miner,
      s.checkId,
      s.fraction,
      s.reason,
    );
  }

  slashes(filter: { status?: SlashStatus; epoch?: number } = {}): SlashRecord[] {
    const where = ([['status', filter.status], ['epoch', filter.epoch]] as const).filter((w) => w[1] !== undefined);
    const clause = where.length ? `WHERE ${where.map(([col]) => `${col} = ?`).join(' AND ')}` : '';
    return all(this.db, decodeSlash, `SELECT ${SLASH_COLUMNS} FROM slashes ${clause} ORDER BY id`, ...where.map(([, v]) => v!));
  }

  /** Fixes (or, with null, un-fixes) the amount of a pending slash. */
  setSlashAmount(id: number, amount: bigint | null, error: string | null = null): void {
    this.db.run('UPDATE slashes SET amount = ?, error = COALESCE(?, error) WHERE id = ?', amount === null ? null : amount.toString(), error, id);
  }

  /** A pending slash's transaction, recorded once the node took it and before its receipt is awaited: a retry looks for it instead of sending another. */
  setSlashSent(id: number, txHash: string): void {
    this.db.run("UPDATE slashes SET tx_hash = ? WHERE id = ? AND status = 'pending'", txHash, id);
  }

  /** pending → slashed. */
  markSlashed(id: number, txHash: string, amount?: bigint): void {
    this.db.run("UPDATE slashes SET status = 'slashed', tx_hash = ?, amount = COALESCE(?, amount), error = NULL, retry_at = NULL WHERE id = ?", txHash, amount === undefined ? null : amount.toString(), id);
  }

  /** pending → skipped. */
  skipSlash(id: number, why: string): void {
    this.db.run("UPDATE slashes SET status = 'skipped', error = ?, retry_at = NULL WHERE id = ?", why, id);
  }

  /** A failed try: the error, the tries so far, the next (src/orchestrator/rewards/backoff.ts). */
  setSlashError(id: number, error: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE slashes SET error = ?, attempts = ?, retry_at = ? WHERE id = ?', error.slice(0, 500), attempts, retryAt, id);
  }
}
