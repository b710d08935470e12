// The dataset store (docs/jobs.md, "Data"): a developer's local text file or
// folder, packed by the CLI (src/data/dataset.ts), uploaded once and named by
// its content, `sha256:<hex>`. The orchestrator hashes what it received
// itself (a stated sha256 that differs is refused and nothing is kept),
// keeps the bytes as a blob and a row per uploader (../state/datasets.ts),
// and lets only an uploader's jobs and runs train on them; miners download
// the blob (GET /blobs/:id) and check it against the id.
//
// What storing costs (../blobs/store-budget.ts, the one home of it, shared
// with the model store): a dataset counts in the network's free store
// (--free-store, for everyone together, not per key) until it is paid for;
// past that pool an upload is stored only paid (`keepDays` and a NIM transfer
// of the quote: 402 `payment_required` else), and its owner keeps it longer
// (POST /datasets/:sha256/keep, `nbcli dataset keep`). Beside it, at most
// MAX_DATASETS_PER_OWNER rows per address (403 `quota_exceeded`: one key's
// listing stays short; it protects nothing of the disk, which the store's
// bounds do) and one upload received at a time (429, retried by the client).
//
// Retention: a dataset is never deleted while a job or run of its owner that
// has not ended names it. After the last one ended (or after its upload) it
// is kept for the retention period, the orchestrator's checkpoint retention
// (`--checkpoint-retention`, 3 days by default), or until its paid time ends
// if later, then the collector deletes its row, and its blob unless another
// row names the same bytes. Its owner may delete it earlier (DELETE
// /datasets/:sha256), except while in use.
import type { Address } from 'viem';
import type { DatasetView } from '../../api/datasets.ts';
import { checkCorpusSize, datasetHex, isDatasetId, MAX_DATASET_BYTES } from '../../data/dataset.ts';
import { NAMED_DATA_SETS, type ResolvedJob } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { blobId, type BlobStore } from '../blobs/blobs.ts';
import type { StoreBudget } from '../blobs/store-budget.ts';
import type { DatasetRecord } from '../state/datasets.ts';
import type { OrchestratorState } from '../state/index.ts';

/** Datasets one address keeps at most (its listing's bound; the bytes are the store budget's). */
export const MAX_DATASETS_PER_OWNER = 16;
/** Dataset uploads received at once (all developers together): they never crowd out the miners' merge uploads. */
export const MAX_DATASET_UPLOADS_AT_ONCE = 1;
/** By default an unused dataset is kept as long as an ended job's checkpoints (DEFAULT_CHECKPOINT_RETENTION_MS). */
export const DEFAULT_DATASET_RETENTION_MS = 3 * 86_400_000;
/** How often datasets in use are marked used and expired ones collected. */
const COLLECT_EVERY_MS = 10_000;
/** Rows deleted per pass at most. */
const COLLECT_BATCH = 1000;

export interface DatasetServiceOptions {
  /** an unused dataset is kept this long after its last use */
  retentionMs: number;
}

export class DatasetService {
  private collectedAt = -Infinity;
  readonly options: DatasetServiceOptions;

  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
    options: Partial<DatasetServiceOptions> = {},
    private readonly now: () => number = Date.now,
  ) {
    this.options = { retentionMs: DEFAULT_DATASET_RETENTION_MS, ...options };
  }

  /**
   * What an upload must pass before its body is read: its announced size,
   * room for one more row of its owner, and (with a `budget`) the store's
   * bounds, the disk and, unless `paid`, the network's free store.
   */
  async admit(owner: string, announcedBytes: number, budget: StoreBudget | null = null, paid = false): Promise<void> {
    if (announcedBytes > MAX_DATASET_BYTES) throw tooLarge(announcedBytes);
    const count = this.state.datasets.countOf(owner);
    if (count >= MAX_DATASETS_PER_OWNER) {
      throw new NimbleError('quota_exceeded', `${owner} keeps ${count} datasets, the most one address may; delete one (nbcli dataset rm ID) or wait until one expires`, 403);
    }
    await budget?.admit(announcedBytes, paid, 'dataset');
  }

  /**
   * Stores uploaded bytes for `owner`: hashed here (a stated `expected`
   * sha256 that differs is refused, nothing kept); a new row passes the
   * store's bounds (`budget`) and, `paid`, its payment is checked before
   * anything is kept; the row first, then the blob (so that the collector
   * cannot take it in between). The same bytes again from their owner take
   * nothing more (paid: they are kept longer).
   */
  async store(owner: Address, bytes: Uint8Array, expected?: string, budget: StoreBudget | null = null, paid?: PaidKeep): Promise<{ record: DatasetRecord; created: boolean }> {
    if (bytes.length === 0) throw new NimbleError('invalid', 'the dataset is empty');
    if (bytes.length > MAX_DATASET_BYTES) throw tooLarge(bytes.length);
    const sha256 = blobId(bytes);
    if (expected !== undefined && expected !== sha256) throw new NimbleError('sha_mismatch', `the body has sha256 ${sha256}, not ${expected} as stated; nothing was stored`, 400);
    let keptUntil = 0;
    const held = this.state.datasets.heldBy(sha256, owner);
    if (held && paid && budget) {
      await this.keep(sha256, owner, paid, budget);
    } else if (!held) {
      // the bounds before anything is paid, the payment before anything is kept
      await this.admit(owner, bytes.length, budget, paid !== undefined);
      if (paid && budget) keptUntil = await budget.pay(owner, `dataset sha256:${sha256}`, bytes.length, paid.days, paid.payment, this.now());
    }
    const { record, created } = this.state.datasets.add({ sha256, owner, bytes: bytes.length, retentionMs: this.options.retentionMs, keptUntil }, this.now());
    try {
      await this.blobs.put(bytes);
    } catch (err) {
      if (created) this.state.datasets.remove(sha256, owner);
      throw err;
    }
    return { record, created };
  }

  /** `owner`'s dataset (or, without an owner, its first uploader's); 404 when there is none. */
  get(sha256: string, owner?: string): DatasetRecord {
    const d = owner ? this.state.datasets.heldBy(sha256, owner) : this.state.datasets.first(sha256);
    if (!d) throw new NimbleError('not_found', `no dataset sha256:${sha256}${owner ? ` uploaded by ${owner}` : ''}`);
    return d;
  }

  /** Its owner keeps a dataset `paid.days` more after it would expire, paid first on a paid network (`budget.pay`). */
  async keep(sha256: string, owner: string, paid: PaidKeep, budget: StoreBudget): Promise<DatasetRecord> {
    const d = this.get(sha256, owner);
    const until = await budget.pay(d.owner, `dataset sha256:${sha256}`, d.bytes, paid.days, paid.payment, datasetExpiresAt(d));
    this.state.datasets.keep(sha256, d.owner, until);
    return this.get(sha256, owner);
  }

  /** Its owner deletes a dataset no job or run of theirs that has not ended names. */
  remove(sha256: string, owner: string): DatasetRecord {
    const d = this.get(sha256, owner);
    const user = this.inUse().find((u) => u.sha256 === sha256 && sameAddress(u.owner, owner));
    if (user) throw new NimbleError('conflict', `dataset sha256:${sha256} is in use by ${user.by}; it can be deleted once that ends`);
    this.state.tx(() => {
      this.state.datasets.remove(sha256, owner);
      if (!this.state.datasets.referencesBlob(sha256)) this.state.garbage.condemn([sha256], this.now());
    });
    return d;
  }

  /** From the orchestrator's clock: now and then, a collection. */
  tick(): void {
    const now = this.now();
    if (now - this.collectedAt < COLLECT_EVERY_MS) return;
    this.collectedAt = now;
    try {
      this.collect(now);
    } catch (err) {
      console.error(`orchestrator: collecting datasets failed: ${(err as Error).message}`);
    }
  }

  /**
   * Marks the datasets that jobs and runs not ended name as used now, then
   * deletes the rows whose retention after their last use has passed; their
   * blobs go to the collector (deleted unless another row names them).
   * Returns the rows deleted.
   */
  collect(now: number): number {
    return this.state.tx(() => {
      for (const u of this.inUse()) this.state.datasets.touch(u.sha256, u.owner, now);
      const expired = this.state.datasets.expired(now, COLLECT_BATCH);
      for (const d of expired) this.state.datasets.remove(d.sha256, d.owner);
      const orphans = [...new Set(expired.map((d) => d.sha256))].filter((sha) => !this.state.datasets.referencesBlob(sha));
      if (orphans.length) this.state.garbage.condemn(orphans, now);
      return expired.length;
    });
  }

  /** The datasets named by jobs and runs that have not ended, with their owners. */
  private inUse(): { sha256: string; owner: string; by: string }[] {
    const out: { sha256: string; owner: string; by: string }[] = [];
    for (const r of this.state.runs.active()) if (r.owner && isDatasetId(r.data)) out.push({ sha256: datasetHex(r.data), owner: r.owner, by: `run ${r.id}` });
    for (const j of this.state.jobs.active()) if (isDatasetId(j.spec.data)) out.push({ sha256: datasetHex(j.spec.data), owner: j.owner, by: `job ${j.id}` });
    return out;
  }
}

/**
 * Refuses `data` unless it names a dataset `owner` uploaded that is large
 * enough for a model of `contextLength` (a job's or run's data check).
 */
export function requireDataset(state: OrchestratorState, data: string, owner: string, contextLength: number): DatasetRecord {
  const sha256 = datasetHex(data);
  const d = state.datasets.heldBy(sha256, owner);
  if (!d) {
    const other = state.datasets.first(sha256);
    throw new NimbleError(
      'invalid',
      other
        ? `dataset ${data} was not uploaded by ${owner}: a job trains only on data its owner uploaded (nbcli job submit uploads a spec's local file or folder)`
        : `no dataset ${data} is stored on this orchestrator: upload it first (nbcli job submit uploads a spec's local file or folder)`,
    );
  }
  checkCorpusSize(d.bytes, contextLength, `dataset ${data}`);
  return d;
}

/** A keep paid for `days` by transaction `payment` (none on an unpaid network). */
export interface PaidKeep {
  days: number;
  payment?: string;
}

/** When a dataset is collected unless used again or kept longer: its retention after its last use, or its paid time if later. */
export function datasetExpiresAt(d: DatasetRecord): number {
  return Math.max(d.usedAt + d.retentionMs, d.keptUntil);
}

export function datasetView(d: DatasetRecord): DatasetView {
  return { id: `sha256:${d.sha256}`, sha256: d.sha256, owner: d.owner, bytes: d.bytes, createdAt: d.createdAt, usedAt: d.usedAt, keptUntil: d.keptUntil, expiresAt: datasetExpiresAt(d) };
}

function tooLarge(bytes: number): NimbleError {
  return new NimbleError('too_large', `a dataset may have at most ${MAX_DATASET_BYTES} bytes (256 MiB), this one has ${bytes}`, 413);
}

function sameAddress(a: string, b: string): boolean {
  return a.toLowerCase() === b.toLowerCase();
}

/**
 * What a job may name as its data on the network: a named data set (the spec
 * says which fits its model), or a dataset its owner uploaded (GPT only),
 * large enough for its context. A local path is refused: the CLI uploads it
 * and submits its `sha256:` id instead.
 */
export function checkJobData(state: OrchestratorState, job: ResolvedJob, owner: string): void {
  if (isDatasetId(job.data)) {
    if (job.model.kind !== 'gpt') throw new NimbleError('invalid', `an uploaded dataset (${job.data}) trains GPT models only`);
    requireDataset(state, job.data, owner, job.model.config.contextLength);
    return;
  }
  if (!(NAMED_DATA_SETS as readonly string[]).includes(job.data)) {
    throw new NimbleError('invalid', `'${job.data.slice(0, 200)}' is not data the network's miners load: a named data set (${NAMED_DATA_SETS.join(', ')}) or an uploaded dataset (sha256:…); nbcli job submit uploads a spec's local file or folder, and it runs with --local`);
  }
}
