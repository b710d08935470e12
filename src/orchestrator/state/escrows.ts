// What developers pay with (src/orchestrator/jobs/job-payments.ts drives it): a
// job's escrow on the chain's JobEscrow as this orchestrator tracks it, the
// payment owed to its miners for each epoch (written when the epoch closes,
// sent afterwards), and the NIM paid for keeping checkpoints longer.
//
// Escrow: open (paying) → ending (the job ended; work logged up to `endedLog`
// is still paid) → closed (the rest refunded on chain). Payment: pending
// (allocated in the epoch's transaction) → paid (on chain), or unpaid (its
// escrow was closed on chain before it was sent: it never will be).
// A failed chain call is retried at `retryAt` (exponential backoff, capped:
// ../jobs/job-payments.ts), `attempts` and `error` saying how it goes; an
// escrow's own calls (renewing its lock, closing it) share its row's.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const ESCROW_MIGRATIONS: Migrations = {
  store: 'escrows',
  steps: [
    `CREATE TABLE job_escrows (
      job_id TEXT PRIMARY KEY, escrow_id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, amount TEXT NOT NULL, price REAL NOT NULL,
      committed TEXT NOT NULL DEFAULT '0', status TEXT NOT NULL, spent INTEGER NOT NULL DEFAULT 0, ended_log INTEGER,
      refunded TEXT, close_tx TEXT, error TEXT, created_at INTEGER NOT NULL, closed_at INTEGER
    );
    CREATE INDEX job_escrows_status ON job_escrows (status);
    CREATE TABLE job_payments (
      epoch INTEGER NOT NULL, job_id TEXT NOT NULL, total TEXT NOT NULL, flops REAL NOT NULL, status TEXT NOT NULL,
      tx_hash TEXT, error TEXT, PRIMARY KEY (epoch, job_id)
    );
    CREATE INDEX job_payments_status ON job_payments (status);
    CREATE TABLE job_payment_shares (
      epoch INTEGER NOT NULL, job_id TEXT NOT NULL, miner TEXT NOT NULL, score REAL NOT NULL, amount TEXT NOT NULL,
      PRIMARY KEY (epoch, job_id, miner)
    );
    CREATE TABLE storage_payments (
      tx_hash TEXT PRIMARY KEY, job_id TEXT NOT NULL, payer TEXT NOT NULL, amount TEXT NOT NULL, days INTEGER NOT NULL, at INTEGER NOT NULL
    )`,
    // the orchestrator's lock on the escrow (JobEscrow.lock) and the backoff of failed chain calls
    `ALTER TABLE job_escrows ADD COLUMN locked_until INTEGER;
    ALTER TABLE job_escrows ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE job_escrows ADD COLUMN retry_at INTEGER;
    ALTER TABLE job_payments ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE job_payments ADD COLUMN retry_at INTEGER`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const NullableText = Type.Union([Type.String(), Type.Null()]);
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });
const Hex32 = Type.String({ pattern: '^0x[0-9a-f]{64}$' });

export const EscrowStatus = Type.Union([Type.Literal('open'), Type.Literal('ending'), Type.Literal('closed')]);
export type EscrowStatus = Static<typeof EscrowStatus>;

const EscrowRow = Type.Object({
  jobId: Type.String(),
  /** the id on the JobEscrow contract (32 bytes, lower-case hex) */
  escrowId: Hex32,
  /** the developer: refunds go there */
  owner: Type.String(),
  /** wei escrowed (the job's budget) */
  amount: Wei,
  /** NIM per PFLOP the job pays */
  price: Type.Number({ minimum: 0 }),
  /** wei owed to miners for closed epochs (sent or pending) */
  committed: Wei,
  status: EscrowStatus,
  /** 1 once an epoch wanted more than was left: the job is stopped */
  spent: Type.Integer({ minimum: 0, maximum: 1 }),
  /** the last work log id the escrow pays for (set when the job ends) */
  endedLog: Type.Union([Int, Type.Null()]),
  refunded: Type.Union([Wei, Type.Null()]),
  closeTx: NullableText,
  error: NullableText,
  createdAt: Int,
  closedAt: Type.Union([Int, Type.Null()]),
  /** ms until which the orchestrator's lock on chain holds it (its owner cannot close it before; null: not locked) */
  lockedUntil: Type.Union([Int, Type.Null()]),
  /** failed tries of its last chain call (a lock renewal or its close) */
  attempts: Int,
  /** ms from which that call is tried again (null: when due) */
  retryAt: Type.Union([Int, Type.Null()]),
});
export type EscrowRecord = Static<typeof EscrowRow>;
const ESCROW_COLUMNS = `job_id AS jobId, escrow_id AS escrowId, owner, amount, price, committed, status, spent, ended_log AS endedLog,
  refunded, close_tx AS closeTx, error, created_at AS createdAt, closed_at AS closedAt, locked_until AS lockedUntil, attempts, retry_at AS retryAt`;
const decodeEscrow = rowReader(EscrowRow, 'job escrow');

const PaymentRow = Type.Object({
  epoch: Int,
  jobId: Type.String(),
  /** wei, Σ of its shares */
  total: Wei,
  /** the training FLOPs it pays for */
  flops: Type.Number({ minimum: 0 }),
  status: Type.Union([Type.Literal('pending'), Type.Literal('paid'), Type.Literal('unpaid')]),
  txHash: NullableText,
  error: NullableText,
  /** failed tries to send it */
  attempts: Int,
  /** ms from which it is tried again (null: when due) */
  retryAt: Type.Union([Int, Type.Null()]),
});
export type JobPaymentRecord = Static<typeof PaymentRow>;
export type JobPaymentStatus = JobPaymentRecord['status'];
const decodePayment = rowReader(PaymentRow, 'job payment');

const ShareRow = Type.Object({ miner: Type.String(), score: Type.Number(), amount: Wei });
export type JobPaymentShare = Static<typeof ShareRow>;
const decodeShare = rowReader(ShareRow, 'job payment share');

/** A NIM transfer that paid for keeping a job's checkpoints longer. */
export interface StoragePaymentRecord {
  txHash: string;
  jobId: string;
  payer: string;
  /** wei */
  amount: string;
  days: number;
  at: number;
}

/** What opening a job's escrow records. */
export interface NewEscrow {
  jobId: string;
  escrowId: string;
  owner: string;
  amount: bigint;
  price: number;
  /** ms until which the orchestrator's lock holds it */
  lockedUntil?: number;
}

export class EscrowStore {
  constructor(private readonly db: StateDb) {}

  insert(e: NewEscrow, now: number): void {
    this.db.run(
      "INSERT INTO job_escrows (job_id, escrow_id, owner, amount, price, status, created_at, locked_until) VALUES (?, ?, ?, ?, ?, 'open', ?, ?)",
      e.jobId,
      e.escrowId.toLowerCase(),
      e.owner,
      e.amount.toString(),
      e.price,
      now,
      e.lockedUntil ?? null,
    );
  }

  get(jobId: string): EscrowRecord | undefined {
    return one(this.db, decodeEscrow, `SELECT ${ESCROW_COLUMNS} FROM job_escrows WHERE job_id = ?`, jobId);
  }

  byEscrowId(escrowId: string): EscrowRecord | undefined {
    return one(this.db, decodeEscrow, `SELECT ${ESCROW_COLUMNS} FROM job_escrows WHERE escrow_id = ?`, escrowId.toLowerCase());
  }

  /** Escrows in `status`, oldest first. */
  list(status?: EscrowStatus): EscrowRecord[] {
    return status
      ? all(this.db, decodeEscrow, `SELECT ${ESCROW_COLUMNS} FROM job_escrows WHERE status = ? ORDER BY created_at, job_id`, status)
      : all(this.db, decodeEscrow, `SELECT ${ESCROW_COLUMNS} FROM job_escrows ORDER BY created_at, job_id`);
  }

  /** The job ended: its escrow pays for work logged up to `lastLog`, then closes. */
  end(jobId: string, lastLog: number): void {
    this.db.run("UPDATE job_escrows SET status = 'ending', ended_log = ? WHERE job_id = ? AND status = 'open'", lastLog, jobId);
  }

  /** Closed on chain; `error` says why when it was not the orchestrator's close (its owner's, after the lock lapsed). */
  markClosed(jobId: string, refunded: bigint, txHash: string | null, now: number, error: string | null = null): void {
    this.db.run(
      "UPDATE job_escrows SET status = 'closed', refunded = ?, close_tx = ?, error = ?, attempts = 0, retry_at = NULL, closed_at = ? WHERE job_id = ?",
      refunded.toString(),
      txHash,
      error === null ? null : error.slice(0, 500),
      now,
      jobId,
    );
  }

  /** The orchestrator's lock on chain now holds until `lockedUntil` (ms); a failed call before it is forgotten. */
  setLock(jobId: string, lockedUntil: number): void {
    this.db.run('UPDATE job_escrows SET locked_until = ?, attempts = 0, retry_at = NULL, error = NULL WHERE job_id = ?', lockedUntil, jobId);
  }

  /** A chain call for the escrow failed (its `attempts`-th try): tried again from `retryAt`. */
  setError(jobId: string, message: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE job_escrows SET error = ?, attempts = ?, retry_at = ? WHERE job_id = ?', message.slice(0, 500), attempts, retryAt, jobId);
  }

  // ---- payments per epoch ------------------------------------------------------------

  /**
   * Records what epoch `epoch` owes job `jobId`'s miners (call inside the
   * epoch's transaction); `spent`: the escrow had less left than the work cost.
   */
  addPayment(epoch: number, jobId: string, flops: number, shares: readonly { miner: string; score: number; amount: bigint }[], spent: boolean): void {
    const total = shares.reduce((a, s) => a + s.amount, 0n);
    this.db.run("INSERT INTO job_payments (epoch, job_id, total, flops, status) VALUES (?, ?, ?, ?, 'pending')", epoch, jobId, total.toString(), flops);
    for (const s of shares) {
      if (s.amount > 0n) this.db.run('INSERT INTO job_payment_shares (epoch, job_id, miner, score, amount) VALUES (?, ?, ?, ?, ?)', epoch, jobId, s.miner, s.score, s.amount.toString());
    }
    const escrow = this.get(jobId);
    if (!escrow) throw new Error(`no escrow for job ${jobId}`);
    // wei exceed SQLite's 64-bit integers: summed here, stored as text
    this.db.run('UPDATE job_escrows SET committed = ?, spent = MAX(spent, ?) WHERE job_id = ?', (BigInt(escrow.committed) + total).toString(), spent ? 1 : 0, jobId);
  }

  /** Payments in `status`, oldest epoch first (of one job when given). */
  payments(q: { status?: JobPaymentStatus; jobId?: string } = {}): JobPaymentRecord[] {
    const where: string[] = [];
    const params: string[] = [];
    if (q.status) {
      where.push('status = ?');
      params.push(q.status);
    }
    if (q.jobId) {
      where.push('job_id = ?');
      params.push(q.jobId);
    }
    return all(
      this.db,
      decodePayment,
      `SELECT epoch, job_id AS jobId, total, flops, status, tx_hash AS txHash, error, attempts, retry_at AS retryAt FROM job_payments ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY epoch, job_id`,
      ...params,
    );
  }

  shares(epoch: number, jobId: string): JobPaymentShare[] {
    return all(this.db, decodeShare, 'SELECT miner, score, amount FROM job_payment_shares WHERE epoch = ? AND job_id = ? ORDER BY miner', epoch, jobId);
  }

  markPaid(epoch: number, jobId: string, txHash: string | null): void {
    this.db.run("UPDATE job_payments SET status = 'paid', tx_hash = ?, error = NULL, retry_at = NULL WHERE epoch = ? AND job_id = ?", txHash, epoch, jobId);
  }

  /** Its escrow was closed on chain before it was sent: it is never paid (`why` says so). */
  markUnpaid(epoch: number, jobId: string, why: string): void {
    this.db.run("UPDATE job_payments SET status = 'unpaid', error = ?, retry_at = NULL WHERE epoch = ? AND job_id = ? AND status = 'pending'", why.slice(0, 500), epoch, jobId);
  }

  /** Sending it failed (its `attempts`-th try): tried again from `retryAt`. */
  setPaymentError(epoch: number, jobId: string, message: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE job_payments SET error = ?, attempts = ?, retry_at = ? WHERE epoch = ? AND job_id = ?', message.slice(0, 500), attempts, retryAt, epoch, jobId);
  }

  countPending(jobId: string): number {
    return scalar(this.db, "SELECT COUNT(*) AS n FROM job_payments WHERE job_id = ? AND status = 'pending'", jobId);
  }

  // ---- storage --------------------------------------------------------------------

  /** Records a NIM transfer that paid for keeping a job's checkpoints; false when that transaction was used already. */
  addStoragePayment(p: StoragePaymentRecord): boolean {
    const r = this.db.run(
      'INSERT OR IGNORE INTO storage_payments (tx_hash, job_id, payer, amount, days, at) VALUES (?, ?, ?, ?, ?, ?)',
      p.txHash.toLowerCase(),
      p.jobId,
      p.payer,
      p.amount,
      p.days,
      p.at,
    );
    return r.changes > 0;
  }
}
