// The blob store: immutable byte strings named by their sha256 (hex), for
// checkpoints, stage weights, pseudo-gradients and merged partitions.
//
// BlobStore is the whole interface the orchestrator uses, kept to operations an
// S3 bucket has (PutObject, GetObject with Range, HeadObject, ListObjectsV2 with
// a prefix, DeleteObject), so S3BlobStore (./blobs-s3.ts) implements it too. Names
// (which blob is the latest checkpoint of a run) live in the database, not here.
//
// FsBlobStore lays blobs out as <dir>/<id[0..2]>/<id[2..64]>, writes through a
// temp file in <dir>/tmp + fsync + rename + fsync of the folder, and checks the
// sha256 on every full read; a corrupt file is moved to <dir>/corrupt/ so a
// later put of the same bytes repairs it.

import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { copyFile, mkdir, open, readdir, rename, rm, stat, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { NimbleError } from '../../protocol/errors.ts';

/** Why a blob operation failed. */
export type BlobErrorCode =
  | 'bad_id' // not 64 lowercase hex digits (HTTP 400)
  | 'bad_prefix' // list prefix is not 0-64 lowercase hex digits (HTTP 400)
  | 'not_found' // no such blob (HTTP 404)
  | 'bad_range' // range outside the blob (HTTP 416)
  | 'corrupt'; // stored bytes no longer hash to the id; the blob was quarantined (HTTP 500)

const BLOB_STATUS: Record<BlobErrorCode, number> = { bad_id: 400, bad_prefix: 400, not_found: 404, bad_range: 416, corrupt: 500 };

/** A blob operation failed. */
export class BlobError extends NimbleError {
  override readonly name = 'BlobError';
  declare readonly code: BlobErrorCode;

  constructor(code: BlobErrorCode, message: string) {
    super(code, `blob ${code}: ${message}`, BLOB_STATUS[code]);
  }
}

/** Content-addressed blob storage. Ids are sha256 of the bytes, lowercase hex. */
export interface BlobStore {
  /** Stores bytes (idempotent) and returns their id. */
  put(bytes: Uint8Array): Promise<string>;
  /**
   * Stores the file at `path` (idempotent), which must hash to `id`: read as a
   * stream, never whole (a model of gigabytes). The file is left where it is.
   * BlobError 'corrupt' when it does not hash to `id`.
   */
  putFile(path: string, id: string): Promise<string>;
  /** The whole blob, checked against its id. BlobError 'not_found' / 'corrupt'. */
  get(id: string): Promise<Uint8Array>;
  /** Bytes [start, end) of a blob (end is clamped to the size). Not hash-checked: verify the assembled whole. */
  getRange(id: string, start: number, end: number): Promise<Uint8Array>;
  /** Size in bytes, or undefined when absent. */
  size(id: string): Promise<number | undefined>;
  /** Whether the blob exists. */
  has(id: string): Promise<boolean>;
  /** Ids starting with `prefix` (hex, may be empty), in ascending order. */
  list(prefix?: string): AsyncIterable<string>;
  /** Removes a blob; true if it existed. */
  delete(id: string): Promise<boolean>;
}

const ID_RE = /^[0-9a-f]{64}$/;
const PREFIX_RE = /^[0-9a-f]{0,64}$/;
const FANOUT_RE = /^[0-9a-f]{2}$/;
const REST_RE = /^[0-9a-f]{62}$/;

/** sha256 hex id of bytes. */
export function blobId(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** Throws BlobError 'bad_prefix' unless `prefix` is 0-64 lowercase hex digits. */
export function assertBlobPrefix(prefix: unknown): asserts prefix is string {
  if (typeof prefix !== 'string' || !PREFIX_RE.test(prefix)) {
    throw new BlobError('bad_prefix', `${JSON.stringify(prefix)} is not a hex prefix`);
  }
}

/** Throws BlobError 'bad_id' unless `id` is 64 lowercase hex digits (so it can never escape the folder). */
export function assertBlobId(id: unknown): asserts id is string {
  if (typeof id !== 'string' || !ID_RE.test(id)) {
    throw new BlobError('bad_id', `${JSON.stringify(typeof id === 'string' ? id.slice(0, 80) : id)} is not a blob id (64 lowercase hex digits)`);
  }
}

function isMissing(e: unknown): boolean {
  return (e as NodeJS.ErrnoException).code === 'ENOENT';
}

/** Temp files older than this are left-overs of a crash, removed on open. */
const STALE_TEMP_MS = 60 * 60 * 1000;

/** A content-addressed folder. */
export class FsBlobStore implements BlobStore {
  private constructor(readonly dir: string) {}

  /** Opens (creating if needed) a store in `dir` and removes stale temp files. */
  static async open(dir: string): Promise<FsBlobStore> {
    const store = new FsBlobStore(dir);
    await mkdir(join(dir, 'tmp'), { recursive: true });
    const now = Date.now();
    for (const name of await readdir(join(dir, 'tmp'))) {
      const p = join(dir, 'tmp', name);
      const s = await stat(p).catch(() => undefined);
      if (s && now - s.mtimeMs > STALE_TEMP_MS) await rm(p, { force: true });
    }
    return store;
  }

  /** File path of a (validated) id. */
  pathOf(id: string): string {
    assertBlobId(id);
    return join(this.dir, id.slice(0, 2), id.slice(2));
  }

  async put(bytes: Uint8Array): Promise<string> {
    const id = blobId(bytes);
    const path = this.pathOf(id);
    const existing = await stat(path).catch(() => undefined);
    if (existing?.size === bytes.length) return id;
    const folder = join(this.dir, id.slice(0, 2));
    await mkdir(folder, { recursive: true });
    const temp = join(this.dir, 'tmp', `${id.slice(0, 16)}.${randomBytes(8).toString('hex')}`);
    const fh = await open(temp, 'wx');
    try {
      await fh.writeFile(bytes);
      await fh.sync();
    } catch (e) {
      await fh.close();
      await unlink(temp).catch(() => undefined);
      throw e;
    }
    await fh.close();
    try {
      await rename(temp, path);
    } catch (e) {
      await unlink(temp).catch(() => undefined);
      throw e;
    }
    await syncDir(folder);
    return id;
  }

  async putFile(source: string, id: string): Promise<string> {
    const path = this.pathOf(id);
    const size = (await stat(source)).size;
    await checkFileHash(source, id);
    const existing = await stat(path).catch(() => undefined);
    if (existing?.size === size) return id;
    const folder = join(this.dir, id.slice(0, 2));
    await mkdir(folder, { recursive: true });
    const temp = join(this.dir, 'tmp', `${id.slice(0, 16)}.${randomBytes(8).toString('hex')}`);
    try {
      await copyFile(source, temp);
      const fh = await open(temp, 'r+');
      try {
        await fh.sync();
      } finally {
        await fh.close();
      }
      // the copy is the bytes hashed: checked again before it is named by its id
      await checkFileHash(temp, id);
      await rename(temp, path);
    } catch (e) {
      await unlink(temp).catch(() => undefined);
      throw e;
    }
    await syncDir(folder);
    return id;
  }

  /** Opens a blob's file for reading; BlobError 'not_found' when it is absent (the id is checked by pathOf). */
  private async openBlob(id: string): Promise<FileHandle> {
    try {
      return await open(this.pathOf(id), 'r');
    } catch (e) {
      if (isMissing(e)) throw new BlobError('not_found', `no blob ${id}`);
      throw e;
    }
  }

  async get(id: string): Promise<Uint8Array> {
    const fh = await this.openBlob(id);
    let bytes: Uint8Array;
    try {
      const buf = await fh.readFile();
      bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    } finally {
      await fh.close();
    }
    const actual = blobId(bytes);
    if (actual !== id) {
      await this.quarantine(id);
      throw new BlobError('corrupt', `blob ${id} on disk hashes to ${actual}; moved to ${join(this.dir, 'corrupt')}`);
    }
    return bytes;
  }

  async getRange(id: string, start: number, end: number): Promise<Uint8Array> {
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(end) || start < 0 || end < start) {
      throw new BlobError('bad_range', `range [${start}, ${end}) is not a pair of integers 0 <= start <= end`);
    }
    const fh = await this.openBlob(id);
    try {
      const { size } = await fh.stat();
      if (start > size) throw new BlobError('bad_range', `range starts at ${start}, blob ${id} has ${size} bytes`);
      const length = Math.min(end, size) - start;
      const out = new Uint8Array(length);
      let done = 0;
      while (done < length) {
        const { bytesRead } = await fh.read(out, done, length - done, start + done);
        if (bytesRead === 0) break;
        done += bytesRead;
      }
      return done === length ? out : out.subarray(0, done);
    } finally {
      await fh.close();
    }
  }

  async size(id: string): Promise<number | undefined> {
    const s = await stat(this.pathOf(id)).catch((e: unknown) => {
      if (isMissing(e)) return undefined;
      throw e;
    });
    return s?.size;
  }

  async has(id: string): Promise<boolean> {
    return (await this.size(id)) !== undefined;
  }

  async *list(prefix: string = ''): AsyncIterable<string> {
    assertBlobPrefix(prefix);
    const fanouts = (await readdir(this.dir))
      .filter((d) => FANOUT_RE.test(d) && (prefix.length >= 2 ? d === prefix.slice(0, 2) : d.startsWith(prefix)))
      .sort();
    for (const fanout of fanouts) {
      const rest = prefix.slice(2);
      const names = (await readdir(join(this.dir, fanout)).catch(() => [] as string[]))
        .filter((n) => REST_RE.test(n) && n.startsWith(rest))
        .sort();
      for (const n of names) yield fanout + n;
    }
  }

  async delete(id: string): Promise<boolean> {
    try {
      await unlink(this.pathOf(id));
      return true;
    } catch (e) {
      if (isMissing(e)) return false;
      throw e;
    }
  }

  /** Moves a corrupt blob aside so has() is false and a new put() rewrites it. */
  private async quarantine(id: string): Promise<void> {
    await mkdir(join(this.dir, 'corrupt'), { recursive: true });
    await rename(this.pathOf(id), join(this.dir, 'corrupt', `${id}.${Date.now()}`)).catch(() => undefined);
  }
}

/** fsyncs a folder so a rename into it survives a crash (best effort where folders cannot be opened). */
async function syncDir(dir: string): Promise<void> {
  let fh;
  try {
    fh = await open(dir, 'r');
    await fh.sync();
  } catch {
    // some platforms (Windows) cannot fsync a directory
  } finally {
    await fh?.close();
  }
}

/** Throws BlobError 'corrupt' unless the file at `path` hashes to `id` (read as a stream). */
export async function checkFileHash(path: string, id: string): Promise<void> {
  assertBlobId(id);
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 4 << 20 })) hash.update(chunk as Buffer);
  const got = hash.digest('hex');
  if (got !== id) throw new BlobError('corrupt', `the file to store as ${id} has sha256 ${got}`);
}
