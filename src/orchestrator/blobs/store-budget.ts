// What developers may keep in the orchestrator's store, and what it costs
// (docs/security.md, "Storage"). Stored models (POST /models, /models/file)
// and datasets (POST /datasets) need only a wallet signature, and wallet keys
// cost nothing, so nothing here is counted per key alone:
//   - a global bound, `storeLimitBytes` (--store-limit, 16 GiB): all models
//     and datasets together; past it a store is refused (507 `store_full`);
//   - the disk: a store that would leave less than `diskReserveBytes`
//     (--disk-reserve) free on the blob folder's file system is refused up
//     front (507 `disk_full`), so checkpoints, merge uploads and stage states
//     always find room, and no write discovers a full disk half-way;
//   - a free allowance, `freeStoreBytes` (--free-store, 1 GiB), for the whole
//     network, not per key: unpaid, unpublished models and unpaid datasets
//     together (a dataset counts as at least DATASET_MIN_BYTES, so tiny rows
//     do not flood it for nothing). Past it, a model or dataset is stored
//     only paid (`keepDays` and a NIM transfer of the quote, as `checkpoint
//     keep` pays: 402 `payment_required` else);
//   - a price per GB-day (STORAGE_NIM_PER_GB_DAY) to keep a model or dataset
//     beyond its free retention (`nbcli model keep NAME --days N`, `nbcli
//     dataset keep ID --days N`, GET /storage/quote);
//   - retention: an unpublished model is collected `retentionMs`
//     (--model-retention, 3 days) after it was stored, or when its paid time
//     ends if later; a published one stays (publishing is a transaction of
//     its owner's); its owner deletes it (`nbcli model rm`) whenever no
//     deployment is live. A dataset is collected its retention after its last
//     use, or when its paid time ends if later (../jobs/datasets.ts), and its
//     owner deletes it (`nbcli dataset rm`) when no job of theirs uses it.
// Collection deletes the rows; their blobs go to the collector (./gc.ts),
// which deletes each through the guard (./blob-guard.ts) unless named again.
import { statfs } from 'node:fs/promises';
import { STORAGE_NIM_PER_GB_DAY } from '../../jobs/plan-constants.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { OrchestratorState } from '../state/index.ts';

export const GIB = 2 ** 30;
export const DEFAULT_STORE_LIMIT_BYTES = 16 * GIB;
export const DEFAULT_DISK_RESERVE_BYTES = 2 * GIB;
export const DEFAULT_FREE_STORE_BYTES = 1 * GIB;
export const DEFAULT_MODEL_RETENTION_MS = 3 * 86_400_000;
/** What one unpaid dataset counts as in the free store at least (64 KiB). */
export const DATASET_MIN_BYTES = 64 * 1024;
/** Days a keep may pay for at once. */
export const MAX_KEEP_DAYS = 3650;
const DAY_MS = 86_400_000;
/** Rows collected per pass at most. */
const COLLECT_BATCH = 500;

/** What is stored: a model (POST /models, /models/file) or a dataset (POST /datasets). */
export type StoredKind = 'model' | 'dataset';

export interface StoreBudgetOptions {
  storeLimitBytes: number;
  diskReserveBytes: number;
  freeStoreBytes: number;
  retentionMs: number;
  /** the blob folder whose free space is checked (null: an S3 bucket, no disk of ours) */
  dir: string | null;
}

/** What storing or keeping costs now. */
export interface StorageQuote {
  bytes: number;
  days: number;
  gbDays: number;
  /** wei of NIM for `bytes` over `days` (0 on an unpaid network) */
  price: string;
  nimPerGbDay: number;
  /** where a payment goes (null: an unpaid network) */
  payee: string | null;
  store: { limit: number; used: number };
  free: { limit: number; used: number };
  /** bytes free on the blob folder's disk (null: not a folder) and the reserve a store must leave */
  disk: { free: number | null; reserve: number };
  retentionMs: number;
}

/** The chain half: a price in wei, the payee, and a payment check (null: an unpaid network, storing is free within the bounds). */
export interface StoragePayments {
  price(bytes: number, days: number): bigint;
  payee: string;
  /** checks that `txHash` paid at least `price` from `payer`, once */
  check(txHash: string, payer: string, price: bigint, what: string, days: number): Promise<void>;
}

export class StoreBudget {
  readonly options: StoreBudgetOptions;

  constructor(
    private readonly state: OrchestratorState,
    private readonly payments: StoragePayments | null,
    options: Partial<StoreBudgetOptions> = {},
    private readonly now: () => number = Date.now,
    private readonly freeDisk: (dir: string) => Promise<number> = diskFree,
  ) {
    this.options = { storeLimitBytes: DEFAULT_STORE_LIMIT_BYTES, diskReserveBytes: DEFAULT_DISK_RESERVE_BYTES, freeStoreBytes: DEFAULT_FREE_STORE_BYTES, retentionMs: DEFAULT_MODEL_RETENTION_MS, dir: null, ...options };
  }

  /** Bytes of all models and datasets, and of those kept for free (unpaid, unpublished models and unpaid datasets). */
  usage(): { used: number; free: number } {
    const now = this.now();
    return {
      used: this.state.models.totalBytes() + this.state.datasets.totalBytes(),
      free: this.state.models.freeBytes(now) + this.state.datasets.freeBytes(now, DATASET_MIN_BYTES),
    };
  }

  /**
   * Whether `bytes` more of a `kind` fit: the global bound and the disk
   * always, the free allowance unless `paid` (the store is paid for). Throws
   * the one error that says which and what to do.
   */
  async admit(bytes: number, paid: boolean, kind: StoredKind = 'model'): Promise<void> {
    const { storeLimitBytes, freeStoreBytes, diskReserveBytes, dir } = this.options;
    const { used, free } = this.usage();
    if (used + bytes > storeLimitBytes) {
      throw new NimbleError('store_full', `this orchestrator's model and dataset store holds ${gib(used)} of its ${gib(storeLimitBytes)} (--store-limit): ${gib(bytes)} more do not fit; delete models or datasets you no longer need (nbcli model rm NAME, nbcli dataset rm ID) or retry once unused ones expire`, 507);
    }
    if (dir !== null) {
      const left = await this.freeDisk(dir);
      if (left - bytes < diskReserveBytes) throw new NimbleError('disk_full', `the orchestrator's disk has ${gib(left)} free; storing ${gib(bytes)} would leave less than its reserve of ${gib(diskReserveBytes)} (--disk-reserve) for training`, 507);
    }
    const charged = kind === 'dataset' ? Math.max(bytes, DATASET_MIN_BYTES) : bytes;
    // on an unpaid network nothing is paid for: a store claiming it is as free as any other
    if (!(paid && this.payments) && free + charged > freeStoreBytes) {
      const command = kind === 'dataset' ? 'nbcli dataset upload PATH --keep-days N' : 'nbcli model publish --keep-days N';
      const how = this.payments ? `pay to keep it: ${command} (GET /storage/quote?bytes=${bytes}&days=N says the price, ${STORAGE_NIM_PER_GB_DAY} NIM per GB-day)` : 'retry once unpaid models and datasets expire';
      throw new NimbleError('payment_required', `the network's free store (${gib(freeStoreBytes)} for everyone together, --free-store) holds ${gib(free)}: ${gib(charged)} more are not free; ${how}`, 402);
    }
  }

  /** The quote for keeping `bytes` for `days`. */
  async quote(bytes: number, days: number): Promise<StorageQuote> {
    checkDays(days);
    const { used, free } = this.usage();
    const { dir } = this.options;
    return {
      bytes,
      days,
      gbDays: (bytes / 1e9) * days,
      price: (this.payments?.price(bytes, days) ?? 0n).toString(),
      nimPerGbDay: STORAGE_NIM_PER_GB_DAY,
      payee: this.payments?.payee ?? null,
      store: { limit: this.options.storeLimitBytes, used },
      free: { limit: this.options.freeStoreBytes, used: free },
      disk: { free: dir === null ? null : await this.freeDisk(dir), reserve: this.options.diskReserveBytes },
      retentionMs: this.options.retentionMs,
    };
  }

  /** Checks a payment for keeping `bytes` `days` more (refused on an unpaid network); returns the time it is kept until, from `from`. */
  async pay(payer: string, what: string, bytes: number, days: number, payment: string | undefined, from: number): Promise<number> {
    checkDays(days);
    // a keep that cost nothing would lift a store out of the free allowance for nothing
    if (!this.payments) throw new NimbleError('unpaid_network', `this orchestrator runs unpaid (no JobEscrow on its chain, or no chain): ${what} cannot be paid for; what is stored is kept for free for its retention, within the network's free store (--free-store)`, 409);
    const price = this.payments.price(bytes, days);
    if (price > 0n) {
      if (!payment) throw new NimbleError('payment_required', `keeping ${what} (${(bytes / 1e6).toFixed(1)} MB) ${days} days costs ${price} wei of NIM: transfer it to ${this.payments.payee} and send the transaction's hash (nbcli model keep and nbcli dataset keep do both)`, 402);
      await this.payments.check(payment, payer, price, what, days);
    }
    return Math.max(from, this.now()) + days * DAY_MS;
  }

  /** When a model is collected unless published or kept longer. */
  expiresAt(m: { createdAt: number; keptUntil: number; publishedAt: number | null }): number | null {
    return m.publishedAt !== null ? null : Math.max(m.createdAt + this.options.retentionMs, m.keptUntil);
  }

  /**
   * Collects the unpublished models past their retention and paid time,
   * except those `published(sha256)` finds on the registry (marked, then
   * kept) and those a deployment still serves; their blobs are condemned.
   * Returns how many were deleted.
   */
  async collect(published: (sha256: string) => Promise<boolean>): Promise<number> {
    const now = this.now();
    let deleted = 0;
    for (const m of this.state.models.expired(now - this.options.retentionMs, now, COLLECT_BATCH)) {
      if (this.state.deployments.liveOf(m.sha256)) continue;
      if (await published(m.sha256).catch(() => true)) {
        this.state.models.markPublished(m.sha256, now);
        continue;
      }
      this.remove(m.sha256, now);
      deleted++;
    }
    return deleted;
  }

  /** Deletes a model's row and condemns its blob (kept if another row names it: the collector checks). */
  remove(sha256: string, now = this.now()): void {
    this.state.tx(() => {
      this.state.models.forget(sha256);
      this.state.buildProbes.forget(sha256);
      this.state.garbage.condemn([sha256], now);
    });
  }
}

function checkDays(days: number): void {
  if (!Number.isInteger(days) || days < 1 || days > MAX_KEEP_DAYS) throw new NimbleError('invalid', `days must be a whole number from 1 to ${MAX_KEEP_DAYS}, got ${days}`);
}

async function diskFree(dir: string): Promise<number> {
  const s = await statfs(dir);
  return Number(s.bavail) * Number(s.bsize);
}

function gib(bytes: number): string {
  if (bytes >= GIB) return `${(bytes / GIB).toFixed(2)} GiB`;
  return bytes >= 2 ** 20 ? `${(bytes / 2 ** 20).toFixed(1)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`;
}
