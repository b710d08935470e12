// Deleting a blob nobody names must not race a put of the same bytes. The
// collector (./gc.ts) checks a blob's references, then deletes it; a put of
// the same bytes in between sees the file still there, skips the write, and
// the row its caller writes names a blob that is then deleted.
//
// BlobGuard wraps the one blob store every part of the orchestrator writes
// through and closes that gap with two things:
//   - a lock per blob id: a put and a guarded delete of one id never overlap
//     (the check of the references and the delete run under the lock, so a
//     put either finishes before the check, or starts after the delete and
//     writes the bytes again);
//   - a generation per id, bumped by every put: a delete is refused when the
//     blob was put again after it was condemned (a caller that puts first and
//     writes its row afterwards may not have written the row yet when the
//     check runs).
// Both live in this process: one orchestrator leads a network and is the only
// one collecting (../cluster/), so every put the collector can race passes here.
import { blobId, type BlobStore } from './blobs.ts';

/** Recent puts remembered at most (the oldest forgotten first; a forgotten one was put long ago). */
const MAX_REMEMBERED = 100_000;

export class BlobGuard implements BlobStore {
  private readonly locks = new Map<string, Promise<unknown>>();
  /** id → [generation, time of its last put] */
  private readonly puts = new Map<string, [number, number]>();
  private generation = 0;

  private constructor(
    readonly inner: BlobStore,
    private readonly now: () => number,
  ) {}

  /** `blobs` guarded (itself when it is a guard already). */
  static of(blobs: BlobStore, now: () => number = Date.now): BlobGuard {
    return blobs instanceof BlobGuard ? blobs : new BlobGuard(blobs, now);
  }

  /** Runs `fn` holding the lock of blob `id` (calls for one id run one after another). */
  private locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const before = this.locks.get(id) ?? Promise.resolve();
    const run = before.then(fn, fn);
    const tail = run.catch(() => undefined);
    this.locks.set(id, tail);
    void tail.then(() => {
      if (this.locks.get(id) === tail) this.locks.delete(id);
    });
    return run;
  }

  /** Generation of the last put of `id` seen (0: none remembered). */
  generationOf(id: string): number {
    return this.puts.get(id)?.[0] ?? 0;
  }

  async put(bytes: Uint8Array): Promise<string> {
    const id = blobId(bytes);
    return this.locked(id, async () => {
      this.remember(id);
      return this.inner.put(bytes);
    });
  }

  async putFile(path: string, id: string): Promise<string> {
    return this.locked(id, async () => {
      this.remember(id);
      return this.inner.putFile(path, id);
    });
  }

  /**
   * Deletes blob `id`, condemned at `since`, unless `named()` says a row names
   * it, or it was put again after `since`: the check and the delete hold the
   * blob's lock, so no put of the same bytes runs between them. True if it
   * was deleted.
   */
  deleteUnlessNamed(id: string, since: number, named: () => boolean): Promise<boolean> {
    return this.locked(id, async () => {
      const put = this.puts.get(id);
      if (put && put[1] > since) return false;
      if (named()) return false;
      return this.inner.delete(id);
    });
  }

  delete(id: string): Promise<boolean> {
    return this.locked(id, () => this.inner.delete(id));
  }

  get(id: string): Promise<Uint8Array> {
    return this.inner.get(id);
  }

  getRange(id: string, start: number, end: number): Promise<Uint8Array> {
    return this.inner.getRange(id, start, end);
  }

  size(id: string): Promise<number | undefined> {
    return this.inner.size(id);
  }

  has(id: string): Promise<boolean> {
    return this.inner.has(id);
  }

  list(prefix?: string): AsyncIterable<string> {
    return this.inner.list(prefix);
  }

  private remember(id: string): void {
    this.puts.delete(id);
    this.puts.set(id, [++this.generation, this.now()]);
    if (this.puts.size > MAX_REMEMBERED) {
      const oldest = this.puts.keys().next().value;
      if (oldest !== undefined) this.puts.delete(oldest);
    }
  }
}
