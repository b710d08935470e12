// Prepaid inference credit (docs/inference.md, "Payment";
// src/orchestrator/serving/credits.ts drives it): JobEscrow escrows a wallet
// registered as its balance for /v1/completions, and what each epoch pays
// from each of them (written when the epoch closes, sent afterwards).
//
// Credit escrow: open (counts in the balance) → ending (its owner withdrew,
// or its refund time nears: it still pays what was charged before) → closing
// (nothing more is drawn from it; the close is being sent) → closed (the rest
// refunded on chain). Payment: pending (allocated in the epoch's
// transaction) → paid (on chain, JobEscrow.pay once per escrow and epoch), or
// unpaid (the escrow was closed on chain before it was sent). A failed chain
// call is retried at `retryAt` (backoff, ../jobs/job-payments.ts); an
// escrow's own calls (renewing its lock, closing it) share its row's.
// Wei exceed SQLite's 64-bit integers: amounts are text, summed in BigInt.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const CREDIT_MIGRATIONS: Migrations = {
  store: 'credits',
  steps: [
    `CREATE TABLE credit_escrows (
      escrow_id TEXT PRIMARY KEY, owner TEXT NOT NULL, amount TEXT NOT NULL, committed TEXT NOT NULL DEFAULT '0',
      status TEXT NOT NULL, refund_after INTEGER NOT NULL, refunded TEXT, close_tx TEXT, error TEXT,
      created_at INTEGER NOT NULL, closed_at INTEGER
    );
    CREATE INDEX credit_escrows_by_owner ON credit_escrows (owner, status);
    CREATE INDEX credit_escrows_by_status ON credit_escrows (status);
    CREATE TABLE credit_payments (
      epoch INTEGER NOT NULL, escrow_id TEXT NOT NULL, total TEXT NOT NULL, status TEXT NOT NULL, tx_hash TEXT, error TEXT,
      PRIMARY KEY (epoch, escrow_id)
    );
    CREATE INDEX credit_payments_by_status ON credit_payments (status);
    CREATE TABLE credit_payment_shares (
      epoch INTEGER NOT NULL, escrow_id TEXT NOT NULL, payee TEXT NOT NULL, role TEXT NOT NULL, amount TEXT NOT NULL,
      PRIMARY KEY (epoch, escrow_id, payee, role)
    )`,
    // the orchestrator's lock on the escrow (JobEscrow.lock) and the backoff of failed chain calls
    `ALTER TABLE credit_escrows ADD COLUMN locked_until INTEGER;
    ALTER TABLE credit_escrows ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE credit_escrows ADD COLUMN retry_at INTEGER;
    ALTER TABLE credit_payments ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE credit_payments ADD COLUMN retry_at INTEGER`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const NullableText = Type.Union([Type.String(), Type.Null()]);
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });

export const CreditStatus = Type.Union([Type.Literal('open'), Type.Literal('ending'), Type.Literal('closing'), Type.Literal('closed')]);
export type CreditStatus = Static<typeof CreditStatus>;

const CreditRow = Type.Object({
  /** the id on the JobEscrow contract (32 bytes, lower-case hex) */
  escrowId: Type.String({ pattern: '^0x[0-9a-f]{64}$' }),
  /** the wallet whose balance it is (checksummed): refunds go there */
  owner: Type.String(),
  /** wei escrowed */
  amount: Wei,
  /** wei allocated to payments of closed epochs (sent or pending) */
  committed: Wei,
  status: CreditStatus,
  /** ms from which its owner may close it on chain alone (JobEscrow's refundAfter) */
  refundAfter: Int,
  refunded: Type.Union([Wei, Type.Null()]),
  closeTx: NullableText,
  error: NullableText,
  createdAt: Int,
  closedAt: Type.Union([Int, Type.Null()]),
  /** ms until which the orchestrator's lock on chain holds it (null: not locked) */
  lockedUntil: Type.Union([Int, Type.Null()]),
  /** failed tries of its last chain call (a lock renewal or its close) */
  attempts: Int,
  /** ms from which that call is tried again (null: when due) */
  retryAt: Type.Union([Int, Type.Null()]),
});
export type CreditRecord = Static<typeof CreditRow>;
const CREDIT_COLUMNS = `escrow_id AS escrowId, owner, amount, committed, status, refund_after AS refundAfter, refunded, close_tx AS closeTx,
  error, created_at AS createdAt, closed_at AS closedAt, locked_until AS lockedUntil, attempts, retry_at AS retryAt`;
const decodeCredit = rowReader(CreditRow, 'credit escrow');

export const PayeeRole = Type.Union([Type.Literal('miner'), Type.Literal('owner')]);
export type PayeeRole = Static<typeof PayeeRole>;
const PaymentStatus = Type.Union([Type.Literal('pending'), Type.Literal('paid'), Type.Literal('unpaid')]);
export type CreditPaymentStatus = Static<typeof PaymentStatus>;

const PaymentRow = Type.Object({ epoch: Int, escrowId: Type.String(), total: Wei, status: PaymentStatus, txHash: NullableText, error: NullableText, attempts: Int, retryAt: Type.Union([Int, Type.Null()]) });
export type CreditPaymentRecord = Static<typeof PaymentRow>;
const decodePayment = rowReader(PaymentRow, 'credit payment');

const ShareRow = Type.Object({ epoch: Int, escrowId: Type.String(), payee: Type.String(), role: PayeeRole, amount: Wei, status: PaymentStatus });
export type CreditShareRecord = Static<typeof ShareRow>;
const decodeShare = rowReader(ShareRow, 'credit payment share');

/** One payee's part of a payment. */
export interface CreditShare {
  payee: string;
  role: PayeeRole;
  amount: bigint;
}

export class CreditStore {
  constructor(private readonly db: StateDb) {}

  insert(c: { escrowId: string; owner: string; amount: bigint; refundAfter: number; lockedUntil?: number }, now: number): void {
    this.db.run(
      "INSERT INTO credit_escrows (escrow_id, owner, amount, status, refund_after, created_at, locked_until) VALUES (?, ?, ?, 'open', ?, ?, ?)",
      c.escrowId.toLowerCase(),
      c.owner,
      c.amount.toString(),
      c.refundAfter,
      now,
      c.lockedUntil ?? null,
    );
  }

  get(escrowId: string): CreditRecord | undefined {
    return one(this.db, decodeCredit, `SELECT ${CREDIT_COLUMNS} FROM credit_escrows WHERE escrow_id = ?`, escrowId.toLowerCase());
  }

  /** `owner`'s credit escrows (all, or those in `statuses`): ending ones first, then oldest first, the order they pay in. */
  of(owner: string, statuses?: readonly CreditStatus[]): CreditRecord[] {
    const rows = all(this.db, decodeCredit, `SELECT ${CREDIT_COLUMNS} FROM credit_escrows WHERE owner = ? ORDER BY created_at, escrow_id`, owner);
    const kept = statuses ? rows.filter((r) => statuses.includes(r.status)) : rows;
    return [...kept.filter((r) => r.status === 'ending'), ...kept.filter((r) => r.status !== 'ending')];
  }

  list(status: CreditStatus): CreditRecord[] {
    return all(this.db, decodeCredit, `SELECT ${CREDIT_COLUMNS} FROM credit_escrows WHERE status = ? ORDER BY created_at, escrow_id`, status);
  }

  /** open → ending: it pays what is owed, then closes. */
  end(escrowId: string): boolean {
    return this.db.run("UPDATE credit_escrows SET status = 'ending' WHERE escrow_id = ? AND status = 'open'", escrowId.toLowerCase()).changes > 0;
  }

  /** ending → closing: nothing more is drawn from it. */
  startClosing(escrowId: string): void {
    this.db.run("UPDATE credit_escrows SET status = 'closing' WHERE escrow_id = ? AND status = 'ending'", escrowId.toLowerCase());
  }

  /** Closed on chain; `error` says why when it was not the orchestrator's close. */
  markClosed(escrowId: string, refunded: bigint, txHash: string | null, now: number, error: string | null = null): void {
    this.db.run(
      "UPDATE credit_escrows SET status = 'closed', refunded = ?, close_tx = ?, error = ?, attempts = 0, retry_at = NULL, closed_at = ? WHERE escrow_id = ?",
      refunded.toString(),
      txHash,
      error === null ? null : error.slice(0, 500),
      now,
      escrowId.toLowerCase(),
    );
  }

  /** The orchestrator's lock on chain now holds until `lockedUntil` (ms); a failed call before it is forgotten. */
  setLock(escrowId: string, lockedUntil: number): void {
    this.db.run('UPDATE credit_escrows SET locked_until = ?, attempts = 0, retry_at = NULL, error = NULL WHERE escrow_id = ?', lockedUntil, escrowId.toLowerCase());
  }

  /** A chain call for the escrow failed (its `attempts`-th try): tried again from `retryAt`. */
  setError(escrowId: string, message: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE credit_escrows SET error = ?, attempts = ?, retry_at = ? WHERE escrow_id = ?', message.slice(0, 500), attempts, retryAt, escrowId.toLowerCase());
  }

  // ---- payments per epoch ------------------------------------------------------------

  /** Records what escrow `escrowId` pays for epoch `epoch` (inside the epoch's transaction) and adds it to its committed sum. */
  addPayment(epoch: number, escrowId: string, shares: readonly CreditShare[]): void {
    const id = escrowId.toLowerCase();
    const credit = this.get(id);
    if (!credit) throw new Error(`no credit escrow ${id}`);
    const merged = new Map<string, CreditShare>();
    for (const s of shares) {
      if (s.amount <= 0n) continue;
      const key = `${s.payee}/${s.role}`;
      const m = merged.get(key);
      if (m) m.amount += s.amount;
      else merged.set(key, { ...s });
    }
    const total = [...merged.values()].reduce((a, s) => a + s.amount, 0n);
    if (total === 0n) return;
    const left = BigInt(credit.amount) - BigInt(credit.committed);
    if (total > left) throw new Error(`credit escrow ${id} has ${left} wei left, epoch ${epoch} wants ${total}`);
    this.db.run("INSERT INTO credit_payments (epoch, escrow_id, total, status) VALUES (?, ?, ?, 'pending')", epoch, id, total.toString());
    for (const s of merged.values()) {
      this.db.run('INSERT INTO credit_payment_shares (epoch, escrow_id, payee, role, amount) VALUES (?, ?, ?, ?, ?)', epoch, id, s.payee, s.role, s.amount.toString());
    }
    this.db.run('UPDATE credit_escrows SET committed = ? WHERE escrow_id = ?', (BigInt(credit.committed) + total).toString(), id);
  }

  /** Payments, oldest epoch first: all pending ones, or those of one escrow. */
  payments(q: { status?: CreditPaymentStatus; escrowId?: string } = {}): CreditPaymentRecord[] {
    const where = ([['status', q.status], ['escrow_id', q.escrowId?.toLowerCase()]] as const).filter((w) => w[1] !== undefined);
    const clause = where.length ? `WHERE ${where.map(([col]) => `${col} = ?`).join(' AND ')}` : '';
    return all(this.db, decodePayment, `SELECT epoch, escrow_id AS escrowId, total, status, tx_hash AS txHash, error, attempts, retry_at AS retryAt FROM credit_payments ${clause} ORDER BY epoch, escrow_id`, ...where.map(([, v]) => v!));
  }

  /** The shares of one payment, or of every payment of an epoch (with their payment's status). */
  shares(epoch: number, escrowId?: string): CreditShareRecord[] {
    const rows = all(
      this.db,
      decodeShare,
      `SELECT s.epoch, s.escrow_id AS escrowId, s.payee, s.role, s.amount, p.status FROM credit_payment_shares s
        JOIN credit_payments p ON p.epoch = s.epoch AND p.escrow_id = s.escrow_id WHERE s.epoch = ? ORDER BY s.escrow_id, s.payee, s.role`,
      epoch,
    );
    return escrowId ? rows.filter((r) => r.escrowId === escrowId.toLowerCase()) : rows;
  }

  markPaid(epoch: number, escrowId: string, txHash: string | null): void {
    this.db.run("UPDATE credit_payments SET status = 'paid', tx_hash = ?, error = NULL, retry_at = NULL WHERE epoch = ? AND escrow_id = ?", txHash, epoch, escrowId.toLowerCase());
  }

  /** The escrow was closed on chain before this payment was sent: it is never paid (`why` says so). */
  markUnpaid(epoch: number, escrowId: string, why: string): void {
    this.db.run("UPDATE credit_payments SET status = 'unpaid', error = ?, retry_at = NULL WHERE epoch = ? AND escrow_id = ? AND status = 'pending'", why.slice(0, 500), epoch, escrowId.toLowerCase());
  }

  /** Sending it failed (its `attempts`-th try): tried again from `retryAt`. */
  setPaymentError(epoch: number, escrowId: string, message: string, attempts: number, retryAt: number): void {
    this.db.run('UPDATE credit_payments SET error = ?, attempts = ?, retry_at = ? WHERE epoch = ? AND escrow_id = ?', message.slice(0, 500), attempts, retryAt, epoch, escrowId.toLowerCase());
  }

  countPending(escrowId: string): number {
    return scalar(this.db, "SELECT COUNT(*) AS n FROM credit_payments WHERE escrow_id = ? AND status = 'pending'", escrowId.toLowerCase());
  }
}
