// The uploaded datasets a miner trains on (docs/jobs.md, "Data"): an edge
// stage (first or last) of a run whose data is `sha256:<hex>` needs the
// dataset's bytes. They are downloaded from the orchestrator's signed
// GET /blobs/:id, checked against the id, and cached in
// <miner data dir>/datasets/<hex>; a cached file is checked again when it is
// read (one that does not match is deleted and downloaded anew).
//
// The download runs in the background while the miner goes on heartbeating
// (a large dataset takes longer than the orchestrator waits for a silent
// miner): `prepare` returns the corpus once it is ready, null until then.
//
// A miner never reads a path an assignment names: run data is a named corpus
// (loaded by the stage itself, src/data/dataset.ts `loadNamedCorpus`) or a
// dataset id; anything else is refused.
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ByteCorpus } from '../data/corpus.ts';
import { datasetCorpus, datasetHex, isDatasetId, MAX_DATASET_BYTES, sha256Hex } from '../data/dataset.ts';
import type { SignedClient } from '../http/client.ts';
import { modelParts } from '../model/model-ref.ts';
import { NimbleError } from '../protocol/errors.ts';
import type { StageAssignment } from '../protocol/messages.ts';

/** A failed download is tried again after this long. */
const RETRY_AFTER_MS = 5_000;
/** A dataset download may take this long at most (256 MiB at about 4 Mbit/s). */
const DOWNLOAD_TIMEOUT_MS = 10 * 60_000;

/** Fetches a dataset's bytes (its blob) by the hex of its id. */
export type DatasetFetch = (hex: string) => Promise<Uint8Array>;

export class DatasetCache {
  /** the corpus last made ready (a miner holds one stage at a time) */
  private ready: { id: string; corpus: ByteCorpus } | null = null;
  private loading: { id: string; done: Promise<void> } | null = null;
  private failed: { id: string; at: number } | null = null;

  constructor(
    /** the folder of cached datasets (<miner data dir>/datasets) */
    readonly dir: string,
    private readonly fetch: DatasetFetch,
    private readonly log: (line: string) => void = () => {},
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * The corpus of dataset `id` when it is ready; otherwise starts making it
   * ready in the background (cache, else download) and returns null. Throws
   * at once for data that is not a dataset id.
   */
  prepare(id: string): ByteCorpus | null {
    if (!isDatasetId(id)) throw new NimbleError('invalid', `'${id.slice(0, 200)}' is not a dataset id: a miner loads named data sets or uploaded datasets (sha256:…), never a path`);
    if (this.ready?.id === id) return this.ready.corpus;
    if (this.loading?.id === id) return null;
    if (this.failed?.id === id && this.now() - this.failed.at < RETRY_AFTER_MS) return null;
    const done = this.load(id).then(
      (corpus) => {
        this.ready = { id, corpus };
        this.failed = null;
      },
      (err: unknown) => {
        this.failed = { id, at: this.now() };
        this.log(`dataset ${id}: ${(err as Error).message}`);
      },
    );
    this.loading = { id, done: done.finally(() => (this.loading = this.loading?.id === id ? null : this.loading)) };
    return null;
  }

  /** Resolves when the dataset being made ready is (or failed). */
  async settled(): Promise<void> {
    await this.loading?.done;
  }

  /** Where dataset `id` is cached. */
  pathOf(id: string): string {
    return join(this.dir, datasetHex(id));
  }

  /** The dataset's corpus: from the cache when its file still matches the id, else downloaded, checked and cached. */
  async load(id: string): Promise<ByteCorpus> {
    const hex = datasetHex(id);
    const path = this.pathOf(id);
    let cached: Uint8Array | null = null;
    try {
      cached = new Uint8Array(readFileSync(path));
    } catch {
      // not cached
    }
    if (cached) {
      if (sha256Hex(cached) === hex) return datasetCorpus(id, cached);
      this.log(`the cached dataset ${id} does not match its sha256; downloading it again`);
      rmSync(path, { force: true });
    }
    const t0 = performance.now();
    this.log(`downloading dataset ${id} from the orchestrator`);
    const bytes = await this.fetch(hex);
    const actual = sha256Hex(bytes);
    if (actual !== hex) throw new NimbleError('corrupt', `the downloaded dataset ${id} hashes to sha256:${actual}; it was not kept`);
    mkdirSync(this.dir, { recursive: true });
    const temp = `${path}.${process.pid}.part`;
    writeFileSync(temp, bytes);
    renameSync(temp, path);
    this.log(`downloaded dataset ${id} (${(bytes.length / 1e6).toFixed(2)} MB) in ${((performance.now() - t0) / 1000).toFixed(1)} s; cached in ${path}`);
    return datasetCorpus(id, bytes);
  }
}

/** Fetches a blob from the orchestrator (GET /blobs/:id, signed), streamed, at most MAX_DATASET_BYTES. */
export function blobFetch(client: SignedClient): DatasetFetch {
  return async (hex) => {
    const res = await client.open(`/blobs/${hex}`, {}, AbortSignal.timeout(DOWNLOAD_TIMEOUT_MS));
    const announced = Number(res.headers.get('content-length') ?? 0);
    if (announced > MAX_DATASET_BYTES) {
      await res.body?.cancel();
      throw new NimbleError('too_large', `blob ${hex} has ${announced} bytes; a dataset has at most ${MAX_DATASET_BYTES}`, 413);
    }
    const parts: Uint8Array[] = [];
    let total = 0;
    for await (const chunk of res.body ?? []) {
      total += chunk.length;
      if (total > MAX_DATASET_BYTES) throw new NimbleError('too_large', `blob ${hex} is larger than a dataset may be (${MAX_DATASET_BYTES} bytes)`, 413);
      parts.push(chunk);
    }
    const whole = Buffer.concat(parts, total);
    return new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength);
  };
}

/** Whether an assignment is an edge stage (first or last) of a run on an uploaded dataset: it needs the dataset's bytes. */
export function needsDataset(a: Pick<StageAssignment, 'data' | 'model' | 'from' | 'to'>): boolean {
  return isDatasetId(a.data) && (a.from === 0 || a.to === modelParts(a.model));
}
