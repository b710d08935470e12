// Uploaded datasets (src/orchestrator/jobs/datasets.ts fills it): a developer's
// local data packed into one byte corpus, kept as a blob named by its sha256
// (the blob store is content-addressed, so the same bytes uploaded by two
// developers are stored once). A row says that `owner` uploaded those bytes:
// only an owner's jobs and runs may train on them. `used_at` is the last time
// the row was uploaded again or named by a run or job that had not ended; the
// row expires `retention_ms` after it. The collector (src/orchestrator/blobs/gc.ts)
// deletes a blob only when no row names it.
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
});
export type DatasetRecord = Static<typeof DatasetRow>;
const COLUMNS = 'sha256, owner, bytes, created_at AS createdAt, used_at AS usedAt, retention_ms AS retentionMs';
const decode = rowReader(DatasetRow, 'dataset');
const decodeKey = rowReader(Type.Object({ sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }), owner: Type.String() }), 'dataset key');

export class DatasetStore {
  constructor(private readonly db: StateDb) {}

  /** Records that `owner` holds the dataset (once: holding it already only marks it used now). Returns the row and whether it is new. */
  add(d: { sha256: string; owner: string; bytes: number; retentionMs: number }, now: number): { record: DatasetRecord; created: boolean } {
    return this.db.tx(() => {
      const held = this.heldBy(d.sha256, d.owner);
      if (held) this.touch(d.sha256, held.owner, now);
      else {
        this.db.run(
          'INSERT INTO datasets (sha256, owner, bytes, created_at, used_at, retention_ms) VALUES (?, ?, ?, ?, ?, ?)',
          d.sha256,
          d.owner,
          d.bytes,
          now,
          now,
          d.retentionMs,
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

  /** What `owner` keeps: datasets and their bytes. */
  usageOf(owner: string): { count: number; bytes: number } {
    const count = scalar(this.db, 'SELECT COUNT(*) AS n FROM datasets WHERE LOWER(owner) = LOWER(?)', owner);
    const bytes = scalar(this.db, 'SELECT COALESCE(SUM(bytes), 0) AS n FROM datasets WHERE LOWER(owner) = LOWER(?)', owner);
    return { count, bytes };
  }

  /** Bytes of every dataset row (the same bytes uploaded twice count once per uploader: what each keeps). */
  totalBytes(): number {
    return scalar(this.db, 'SELECT COALESCE(SUM(bytes), 0) AS n FROM datasets');
  }

  /** Marks `owner`'s row used now (its expiry starts again). */
  touch(sha256: string, owner: string, now: number): void {
    this.db.run('UPDATE datasets SET used_at = MAX(used_at, ?) WHERE sha256 = ? AND LOWER(owner) = LOWER(?)', now, sha256, owner);
  }

  /** Deletes `owner`'s row; true when there was one. */
  remove(sha256: string, owner: string): boolean {
    return this.db.run('DELETE FROM datasets WHERE sha256 = ? AND LOWER(owner) = LOWER(?)', sha256, owner).changes > 0;
  }

  /** At most `limit` rows whose retention after their last use has passed by `now`. */
  expired(now: number, limit: number): { sha256: string; owner: string }[] {
    return all(this.db, decodeKey, 'SELECT sha256, owner FROM datasets WHERE used_at + retention_ms < ? ORDER BY used_at LIMIT ?', now, limit);
  }

  /** Whether some row names this blob (then the collector keeps it). */
  referencesBlob(blob: string): boolean {
    return scalar(this.db, 'SELECT EXISTS (SELECT 1 FROM datasets WHERE sha256 = ?) AS n', blob) === 1;
  }
}
