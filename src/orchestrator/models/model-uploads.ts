// Large model files come in chunks (docs/models.md, "Size"): an imported
// 1.1B model is gigabytes, more than one request body may be, more than the
// orchestrator may hold in memory, and more than a home link sends without a
// break. A developer opens an upload of a declared size and sha256, sends
// chunks at the offset the upload has reached (a cut upload resumes from
// there), and stores it: the file is then hashed (it must be the declared
// sha256), checked as a whole model one tensor at a time
// (src/model/hf/convert.ts's checks of the header, the tensor set and every
// value), and moved into the blob store streamed (BlobStore.putFile). Nothing
// of an upload is kept in memory beyond one chunk.
//
// Bounds, for an upload needs only a wallet signature: the store's budget
// admits the declared size, with every open upload's, before a byte is taken
// (../blobs/store-budget.ts: the global bound, the disk); one open upload per
// owner and MAX_UPLOADS in all; an upload idle for IDLE_MS, or not done by
// its deadline (IDLE_MS plus its size at MIN_BYTES_PER_S: a trickle cannot
// hold a slot for ever), is dropped with its file.
// Uploads live in this process (an orchestrator restart drops them: the
// client opens a new one).
import { createHash, randomBytes, type Hash } from 'node:crypto';
import { mkdirSync, rmSync, openSync, writeSync, closeSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { NimbleError } from '../../protocol/errors.ts';

/** A chunk is at most this many bytes (one request body). */
export const UPLOAD_CHUNK_BYTES = 32 << 20;
/** The largest model file an upload takes (the store's budget bounds it further). */
export const MAX_UPLOAD_BYTES = 64 * 2 ** 30;
/** Uploads open at once, all owners together. */
export const MAX_UPLOADS = 2;
/** An upload without a chunk this long is dropped. */
export const IDLE_MS = 10 * 60_000;
/** The slowest an upload may come in on average (1 MiB/s: a 2.2 GB model in 35 minutes). */
export const MIN_BYTES_PER_S = 1 << 20;

export interface Upload {
  id: string;
  owner: string;
  bytes: number;
  sha256: string;
  received: number;
  path: string;
  lastMs: number;
  /** dropped if not stored by then */
  deadlineMs: number;
}

interface Open extends Upload {
  hash: Hash;
}

export class ModelUploads {
  private readonly open = new Map<string, Open>();

  constructor(
    /** where upload files are written (made and emptied on start) */
    private readonly dir: string,
    private readonly now: () => number = Date.now,
  ) {
    mkdirSync(dir, { recursive: true });
    for (const f of readdirSync(dir)) rmSync(join(dir, f), { force: true });
  }

  /** Opens an upload of `bytes` bytes hashing to `sha256` for `owner`. */
  create(owner: string, bytes: number, sha256: string): Upload {
    this.sweep();
    if (!(Number.isSafeInteger(bytes) && bytes > 0 && bytes <= MAX_UPLOAD_BYTES)) throw new NimbleError('invalid', `an upload is 1 to ${MAX_UPLOAD_BYTES} bytes, not ${bytes}`);
    if (!/^[0-9a-f]{64}$/.test(sha256)) throw new NimbleError('invalid', 'sha256 must be 64 lowercase hex digits');
    const mine = [...this.open.values()].find((u) => u.owner === owner.toLowerCase());
    if (mine) throw new NimbleError('rate_limited', `${owner} has an upload open already (${mine.id}, ${mine.received} of ${mine.bytes} bytes): finish it or let it lapse`, 429);
    if (this.open.size >= MAX_UPLOADS) throw new NimbleError('rate_limited', `${MAX_UPLOADS} uploads are under way; retry in a few minutes`, 429);
    const id = randomBytes(16).toString('hex');
    const path = join(this.dir, id);
    closeSync(openSync(path, 'wx'));
    const now = this.now();
    const deadlineMs = now + IDLE_MS + Math.ceil((bytes / MIN_BYTES_PER_S) * 1000);
    const u: Open = { id, owner: owner.toLowerCase(), bytes, sha256, received: 0, path, lastMs: now, deadlineMs, hash: createHash('sha256') };
    this.open.set(id, u);
    return view(u);
  }

  /** The upload `id` of `owner` (404 for anyone else's: its existence is not told). */
  get(owner: string, id: string): Upload {
    return view(this.mine(owner, id));
  }

  /** Appends `chunk` at `offset`, which must be where the upload is. */
  append(owner: string, id: string, offset: number, chunk: Uint8Array): Upload {
    const u = this.mine(owner, id);
    if (offset !== u.received) throw new NimbleError('conflict', `upload ${id} is at byte ${u.received}, not ${offset}: send from there`, 409);
    if (chunk.length === 0 || chunk.length > UPLOAD_CHUNK_BYTES) throw new NimbleError('invalid', `a chunk is 1 to ${UPLOAD_CHUNK_BYTES} bytes, not ${chunk.length}`);
    if (u.received + chunk.length > u.bytes) throw new NimbleError('invalid', `upload ${id} was declared ${u.bytes} bytes; this chunk ends at ${u.received + chunk.length}`);
    const fd = openSync(u.path, 'r+');
    try {
      for (let at = 0; at < chunk.length; ) at += writeSync(fd, chunk, at, chunk.length - at, u.received + at);
    } finally {
      closeSync(fd);
    }
    u.hash.update(chunk);
    u.received += chunk.length;
    u.lastMs = this.now();
    return view(u);
  }

  /**
   * Ends the upload and hands its complete file (hashed to its declared
   * sha256) to `use`; the file is removed afterwards, whatever `use` did.
   */
  async finish<T>(owner: string, id: string, use: (u: Upload) => Promise<T>): Promise<T> {
    const u = this.mine(owner, id);
    if (u.received !== u.bytes) throw new NimbleError('conflict', `upload ${id} has ${u.received} of its ${u.bytes} bytes`, 409);
    this.open.delete(id);
    try {
      const got = u.hash.digest('hex');
      if (got !== u.sha256) throw new NimbleError('invalid', `upload ${id} has sha256 ${got}, not the declared ${u.sha256}`);
      return await use(view(u));
    } finally {
      rmSync(u.path, { force: true });
    }
  }

  /** Bytes the open uploads declared: what they will take once stored (the budget admits a new one beside them). */
  pendingBytes(): number {
    this.sweep();
    let n = 0;
    for (const u of this.open.values()) n += u.bytes;
    return n;
  }

  /** Drops uploads idle past IDLE_MS or past their deadline. */
  sweep(): void {
    const now = this.now();
    for (const u of this.open.values()) {
      if (now - u.lastMs <= IDLE_MS && now <= u.deadlineMs) continue;
      this.open.delete(u.id);
      rmSync(u.path, { force: true });
    }
  }

  /** Drops every upload (the orchestrator is closing). */
  close(): void {
    for (const u of this.open.values()) rmSync(u.path, { force: true });
    this.open.clear();
  }

  private mine(owner: string, id: string): Open {
    this.sweep();
    const u = this.open.get(id);
    if (!u || u.owner !== owner.toLowerCase()) throw new NimbleError('not_found', `no open upload ${id.slice(0, 32)} of ${owner}`);
    return u;
  }
}

function view(u: Open): Upload {
  return { id: u.id, owner: u.owner, bytes: u.bytes, sha256: u.sha256, received: u.received, path: u.path, lastMs: u.lastMs, deadlineMs: u.deadlineMs };
}
