// Blobs whose rows were collected (src/orchestrator/blobs/gc.ts): each is deleted
// from the blob store once a grace period has passed and no kept row names
// it any more (content-addressed: the same bytes can be named twice). Kept
// here, so a crash between deleting the rows and deleting the blobs leaks
// nothing: the next pass picks them up.
import { Type } from '@sinclair/typebox';
import { all, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const GARBAGE_MIGRATIONS: Migrations = {
  store: 'blob_garbage',
  steps: ['CREATE TABLE IF NOT EXISTS blob_garbage (blob TEXT PRIMARY KEY, since INTEGER NOT NULL)'],
};

const decodeBlob = rowReader(Type.Object({ blob: Type.String({ pattern: '^[0-9a-f]{64}$' }) }), 'condemned blob');

export class BlobGarbage {
  constructor(private readonly db: StateDb) {}

  /** Blobs no collected row needs any more, from `now` (a blob condemned already keeps its time). */
  condemn(blobs: readonly string[], now: number): void {
    for (const blob of new Set(blobs)) this.db.run('INSERT OR IGNORE INTO blob_garbage (blob, since) VALUES (?, ?)', blob, now);
  }

  /** At most `limit` blobs condemned before `before`, oldest first. */
  due(before: number, limit: number): string[] {
    return all(this.db, decodeBlob, 'SELECT blob FROM blob_garbage WHERE since < ? ORDER BY since, blob LIMIT ?', before, limit).map((r) => r.blob);
  }

  /** When `blob` was condemned (undefined: it is not). */
  since(blob: string): number | undefined {
    const r = this.db.statement('SELECT since FROM blob_garbage WHERE blob = ?').get(blob) as { since: number } | undefined;
    return r?.since;
  }

  /** The blob was deleted, or is needed again. */
  release(blob: string): void {
    this.db.run('DELETE FROM blob_garbage WHERE blob = ?', blob);
  }

  count(): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM blob_garbage');
  }
}
