// Uploaded datasets (src/orchestrator/jobs/datasets.ts fills it): a developer's
// local data packed into one byte corpus, kept as a blob named by its sha256
// (the blob store is content-addressed, so the same bytes uploaded by two
// developers are stored once). A row says that `owner` uploaded those bytes:
// only an owner's jobs and runs may train on them. `used_at` is the last time
// the row was uploaded again or named by a run or job that had not ended; the
// row expires `retention_ms` after it, or at `kept_until` if later (the second
// step: paid for until then, 0: not paid; src/orchestrator/blobs/store-budget.ts
// counts the unpaid rows in the network's free store). The collector
// (src/orchestrator/blobs/gc.ts) deletes a blob only when no row names it.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const DATASET_MIGRATIONS: Migrations = {
  store: 'datasets',
  steps: [
    `CREATE TABLE IF NOT EXISTS datasets (
      sha256 TEXT NOT NULL, owner TEXT NOT NULL, bytes INTEGER NOT NULL,
      created_at INTEGER NOT NULL, used_at INTEGER NOT NULL, retention_ms INTEGER NOT NULL,
      PRIMARY KEY (sha256, owner)
    );
    CREATE INDEX IF NOT EXISTS datasets_owner ON datasets (owner, created_at);
    CREATE INDEX IF NOT EXISTS datasets_used ON datasets (used_at)`,
    'ALTER TABLE datasets ADD COLUMN kept_until INTEGER NOT NULL DEFAULT 0',
  ],
};

const Int = Type.Integer({ minimum: 0 });
const DatasetRow = Type.Object({
  sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  owner: Type.String(),
  bytes: Int,
  createdAt: Int,
  usedAt: Int,
  retentionMs: Int,
  keptUntil: Int,
});
export type DatasetRecord = Static<typeof DatasetRow>;
const COLUMNS = 'sha256, owner, bytes, created_at AS createdAt, used_at AS usedAt, retention_ms AS retentionMs, kept_until AS keptUntil';
const decode = rowReader(DatasetRow, 'dataset');
const decodeKey = rowReader(Type.Object({ sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }), owner: Type.String() }), 'dataset key');

export class DatasetStore {
  constructor(private readonly db: StateDb) {}

  /** Records that `owner` holds the dataset (once: holding it already only marks it used now). Returns the row and whether it is new. */
  add(d: { sha256: string; owner: string; bytes: number; retentionMs: number; keptUntil?: number }, now: number): { record: DatasetRecord; created: boolean } {
    return this.db.tx(() => {
      const held = this.heldBy(d.sha256, d.owner);
      if (held) this.touch(d.sha256, held.owner, now);
      else {
        this.db.run(
          'INSERT INTO datasets (sha256, owner, bytes, created_at, used_at, retention_ms, kept_until) VALUES (?, ?, ?, ?, ?, ?, ?)',
          d.sha256,
          d.owner,
          d.bytes,
          now,
          now,
          d.retentionMs,
          d.keptUntil ?? 0,
        );
      }
      return { record: this.heldBy(d.sha256, d.owner)!, created: !held };
    });
  }

  /** `owner`'s row of the dataset, if it uploaded it. */
  heldBy(sha256: string, owner: string): DatasetRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM datasets WHERE sha256 = ? AND LOWER(owner) = LOWER(?)`, sha256, owner);
  }

  /** The row of its first uploader. */
  first(sha256: string): DatasetRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM datasets WHERE sha256 = ? ORDER BY created_at, owner LIMIT 1`, sha256);
  }

  /** Every row, newest first (of one owner when given). */
  list(owner?: string): DatasetRecord[] {
    return owner
      ? all(this.db, decode, `SELECT ${COLUMNS} FROM datasets WHERE LOWER(owner) = LOWER(?) ORDER BY created_at DESC, sha256`, owner)
      : all(this.db, decode, `SELECT ${COLUMNS} FROM datasets ORDER BY created_at DESC, sha256`);
  }

  /** How many datasets `owner` keeps. */
  countOf(owner: string): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM datasets WHERE LOWER(owner) = LOWER(?)', owner);
  }

  /** Bytes of every dataset row (the same bytes uploaded twice count once per uploader: what each keeps). */
  totalBytes(): number {
    return scalar(this.db, 'SELECT COALESCE(SUM(bytes), 0) AS n FROM datasets');
  }

  /**
   * What the rows kept for free count in the network's free store: those not
   * paid for at `now`, each as at least `minBytes` (a flood of tiny rows
   * costs what a flood of small ones does).
   */
  freeBytes(now: number, minBytes: number): number {
    return scalar(this.db, 'SELECT COALESCE(SUM(MAX(bytes, ?)), 0) AS n FROM datasets WHERE kept_until <= ?', minBytes, now);
  }

  /** Paid for until `until` (a later time only: a keep never shortens). */
  keep(sha256: string, owner: string, until: number): void {
    this.db.run('UPDATE datasets SET kept_until = ? WHERE sha256 = ? AND LOWER(owner) = LOWER(?) AND kept_until < ?', until, sha256, owner, until);
  }

  /** Marks `owner`'s row used now (its expiry starts again). */
  touch(sha256: string, owner: string, now: number): void {
    this.db.run('UPDATE datasets SET used_at = MAX(used_at, ?) WHERE sha256 = ? AND LOWER(owner) = LOWER(?)', now, sha256, owner);
  }

  /** Deletes `owner`'s row; true when there was one. */
  remove(sha256: string, owner: string): boolean {
    return this.db.run('DELETE FROM datasets WHERE sha256 = ? AND LOWER(owner) = LOWER(?)', sha256, owner).changes > 0;
  }

  /** At most `limit` rows whose retention after their last use and paid time have passed by `now`. */
  expired(now: number, limit: number): { sha256: string; owner: string }[] {
    return all(this.db, decodeKey, 'SELECT sha256, owner FROM datasets WHERE used_at + retention_ms < ? AND kept_until < ? ORDER BY used_at LIMIT ?', now, now, limit);
  }

  /** Whether some row names this blob (then the collector keeps it). */
  referencesBlob(blob: string): boolean {
    return scalar(this.db, 'SELECT EXISTS (SELECT 1 FROM datasets WHERE sha256 = ?) AS n', blob) === 1;
  }
}
