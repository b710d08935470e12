// A wallet's prepaid inference credit (docs/inference.md, "Payment"): JobEscrow
// escrows its owner opened and registered here (checked on chain the way a
// job's escrow is, ./job-payments.ts: the signer's, open, untouched, bound to
// nothing), the balance they make, and paying from them at every epoch.
//
//   balance = Σ open escrows (amount − drawn)
//             − max(0, reserved + charged-not-drawn − Σ ending escrows (amount − drawn))
//
// What is owed is drawn from ending escrows first (a withdrawn one still pays
// what was charged before), then from open ones, oldest first.
//
// At each epoch (in its transaction, ./epochs.ts), every request charged since
// the last one is drawn: MINERS_SHARE_BPS of what it was charged goes to the
// miners that ran it, split by their rows through each stage weighed by the
// stage's share of the model's parameters; the rest goes to the model's
// owner. Per escrow, one `JobEscrow.pay(escrow, epoch, payees, amounts)`,
// credited as stake: written 'pending' with the epoch, sent afterwards
// (idempotent per escrow and epoch: the contract keeps the digest of the list
// it took), so a kill -9 anywhere pays nothing twice.
//
// An escrow ends when its owner withdraws, or a day before its refund time
// (from then on its owner could close it on chain alone, and a balance backed
// by it would be backed by nothing). An ending escrow is closed (the rest
// refunded) once nothing it may still owe is pending.
//
// A registered escrow is locked on chain (JobEscrow.lock, as a job's is,
// ../jobs/job-payments.ts) and the lock renewed until the orchestrator closes
// it: its owner cannot close it alone while what it was charged is unpaid.
// Failed payments, renewals and closes are retried with backoff and
// recorded on the escrow's row (shown by nbcli credit balance).
import type { Address, Hex } from 'viem';
import type { CreditEscrowView, CreditView } from '../../api/credits.ts';
import { formatNim } from '../../chain/amounts.ts';
import { closeEscrow, payJob, readEscrow } from '../../chain/escrow.ts';
import { formatDuration } from '../../jobs/duration.ts';
import { normalizeRewards } from '../../chain/rewards.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { JobPayments, type JobPaymentsOptions } from '../jobs/job-payments.ts';
import { retryDelayMs } from '../rewards/backoff.ts';
import { splitEmission, unitWeight, type StageShares } from '../rewards/scoring.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { CreditPaymentRecord, CreditRecord, CreditShare } from '../state/credits.ts';

/** The serving miners' share of what a request pays, in basis points (80 %); the model's owner receives the rest. */
export const MINERS_SHARE_BPS = 8_000n;
/** A credit escrow stops counting this long before its owner may close it on chain alone (1 day). */
export const CREDIT_END_MARGIN_MS = 86_400_000;
/** Credit escrows one wallet may hold open at once. */
export const MAX_CREDITS_PER_OWNER = 32;

export class CreditService {
  constructor(
    private readonly state: OrchestratorState,
    /** the job payments, whose escrow checks and locks credits share */
    private readonly payments: JobPayments,
    private readonly chain: Pick<JobPaymentsOptions, 'client' | 'signer'>,
    private readonly log: (line: string) => void,
    private readonly now: () => number = Date.now,
  ) {}

  /** Adds escrow `escrowId` to `owner`'s balance once it is checked on chain. */
  async register(escrowId: string, owner: string): Promise<CreditView> {
    return this.payments.locked(escrowId, async () => {
      if (this.state.credits.of(owner, ['open']).length >= MAX_CREDITS_PER_OWNER) throw new NimbleError('too_many_credits', `${owner} holds ${MAX_CREDITS_PER_OWNER} open credit escrows already: withdraw them first`, 429);
      const e = await this.payments.checkFreshEscrow(escrowId, owner);
      const refundAfter = e.refundAfter * 1000;
      if (refundAfter - this.now() <= CREDIT_END_MARGIN_MS) {
        throw new NimbleError('invalid', `escrow ${e.jobId} can be refunded to its owner from ${new Date(refundAfter).toISOString()}: credit needs more than a day before that`);
      }
      // locked on chain before it counts: its owner cannot close it under what it is charged
      const lockedUntil = await this.payments.lock(e.jobId);
      this.state.credits.insert({ escrowId: e.jobId, owner, amount: e.amount, refundAfter, lockedUntil }, this.now());
      this.log(`credit: ${owner} added escrow ${e.jobId} of ${formatNim(e.amount)} NIM`);
      return this.view(owner);
    });
  }

  /** Ends every open credit escrow of `owner`: each is closed, the rest refunded, once what it may owe is paid. */
  withdraw(owner: string): CreditView {
    this.state.tx(() => {
      for (const c of this.state.credits.of(owner, ['open'])) this.state.credits.end(c.escrowId);
    });
    return this.view(owner);
  }

  /** Wei a new request of `owner` may reserve (call inside the transaction that reserves). */
  available(owner: string): bigint {
    const { open, ending } = this.left(owner);
    const owed = this.state.inferenceRequests.reservedOf(owner) + this.state.inferenceRequests.unallocatedOf(owner);
    const fromOpen = owed > ending ? owed - ending : 0n;
    return open > fromOpen ? open - fromOpen : 0n;
  }

  /** Wei left in `owner`'s open and ending escrows. */
  private left(owner: string): { open: bigint; ending: bigint } {
    let open = 0n;
    let ending = 0n;
    for (const c of this.state.credits.of(owner, ['open', 'ending'])) {
      const left = BigInt(c.amount) - BigInt(c.committed);
      if (c.status === 'open') open += left;
      else ending += left;
    }
    return { open, ending };
  }

  view(owner: string): CreditView {
    return {
      owner,
      balance: this.available(owner).toString(),
      reserved: this.state.inferenceRequests.reservedOf(owner).toString(),
      owed: this.state.inferenceRequests.unallocatedOf(owner).toString(),
      spent: this.state.inferenceRequests.spentOf(owner).toString(),
      escrows: this.state.credits.of(owner).map((c) => escrowView(c, this.state.credits.payments({ status: 'pending', escrowId: c.escrowId }).find((p) => p.error !== null))),
    };
  }

  /**
   * Draws every request charged since the last epoch from its wallet's
   * escrows (inside epoch `epochId`'s transaction): the miners' share split by
   * weighted rows, the rest to the model's owner.
   */
  allocate(epochId: number, shares: StageShares): void {
    const byWallet = new Map<string, CreditShare[]>();
    for (const r of this.state.inferenceRequests.unallocated()) {
      this.state.inferenceRequests.setEpoch(r.id, epochId);
      const charged = BigInt(r.charged ?? '0');
      if (charged === 0n) continue;
      const work = this.state.inferenceRequests.work(r.id);
      const weights = new Map<string, number>();
      for (const w of work) weights.set(w.miner, (weights.get(w.miner) ?? 0) + w.rows * unitWeight(shares, r.deploymentId, w.stage));
      const pot = weights.size > 0 ? (charged * MINERS_SHARE_BPS) / 10_000n : 0n;
      const split = splitEmission([...weights].map(([miner, score]) => ({ miner, score })), pot);
      const list = byWallet.get(r.owner) ?? [];
      let toMiners = 0n;
      for (const m of split.rewards) {
        if (m.amount === 0n) continue;
        list.push({ payee: m.miner, role: 'miner', amount: m.amount });
        toMiners += m.amount;
      }
      list.push({ payee: r.modelOwner, role: 'owner', amount: charged - toMiners });
      byWallet.set(r.owner, list);
    }
    for (const [owner, owed] of byWallet) this.draw(epochId, owner, owed);
  }

  /** Splits what `owner` owes for an epoch across its escrows (ending first, then oldest first) and records a payment per escrow. */
  private draw(epochId: number, owner: string, owed: readonly CreditShare[]): void {
    const queue = owed.map((s) => ({ ...s }));
    for (const c of this.state.credits.of(owner, ['ending', 'open'])) {
      let left = BigInt(c.amount) - BigInt(c.committed);
      const paid: CreditShare[] = [];
      while (left > 0n && queue.length > 0) {
        const s = queue[0];
        const take = s.amount < left ? s.amount : left;
        paid.push({ payee: s.payee, role: s.role, amount: take });
        s.amount -= take;
        left -= take;
        if (s.amount === 0n) queue.shift();
      }
      if (paid.length) this.state.credits.addPayment(epochId, c.escrowId, paid);
      if (queue.length === 0) return;
    }
    const short = queue.reduce((a, s) => a + s.amount, 0n);
    if (short > 0n) this.log(`credit: ${owner}'s escrows lack ${formatNim(short)} NIM of what epoch ${epochId} owes (an escrow closed behind the orchestrator's back?)`);
  }

  /**
   * Sends pending payments that are due, renews the locks of credit escrows
   * not closed, ends credits near their refund time, closes ending ones that
   * owe nothing. A failed call is recorded and tried again after its backoff.
   */
  async reconcile(): Promise<void> {
    for (const p of this.state.credits.payments({ status: 'pending' })) {
      if (p.retryAt !== null && p.retryAt > this.now()) continue;
      const list = normalizeRewards(this.state.credits.shares(p.epoch, p.escrowId).map((s) => ({ address: s.payee as Address, amount: BigInt(s.amount) })));
      try {
        const r = await payJob(this.chain.client, this.chain.signer, p.escrowId as Hex, BigInt(p.epoch), list);
        this.state.credits.markPaid(p.epoch, p.escrowId, r.tx?.hash ?? null);
        if (!r.alreadyPaid && r.total > 0n) this.log(`credit: paid ${formatNim(r.total)} NIM of inference from escrow ${p.escrowId} to ${r.miners} payee(s) for epoch ${p.epoch}${p.attempts > 0 ? ` after ${p.attempts + 1} attempts` : ''}`);
      } catch (err) {
        if (await this.closedBehindUs(p.escrowId)) continue;
        const message = (err as Error).message.split('\n')[0];
        const attempts = p.attempts + 1;
        const wait = retryDelayMs(attempts);
        this.state.credits.setPaymentError(p.epoch, p.escrowId, message, attempts, this.now() + wait);
        this.log(`credit: paying epoch ${p.epoch} from escrow ${p.escrowId} failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
      }
    }
    await this.keepLocks();
    const now = this.now();
    for (const c of this.state.credits.list('open')) {
      if (c.refundAfter - now <= CREDIT_END_MARGIN_MS && this.state.credits.end(c.escrowId)) this.log(`credit: escrow ${c.escrowId} of ${c.owner} nears its refund time: it pays what is owed, then closes`);
    }
    for (const c of this.closable()) await this.close(c);
  }

  /** Renews the lock of every credit escrow not closed once less than half a lockTimeout is left of it. */
  private async keepLocks(): Promise<void> {
    const held = (['open', 'ending', 'closing'] as const).flatMap((status) => this.state.credits.list(status));
    if (held.length === 0) return;
    const clock = await this.payments.lockClock('credits').catch((err: unknown) => {
      this.log(`credit: cannot read the chain's clock: ${(err as Error).message.split('\n')[0]}`);
      return null;
    });
    if (!clock) return;
    for (const c of held) {
      if (!JobPayments.lockDue(c.lockedUntil, clock) || (c.retryAt !== null && c.retryAt > this.now())) continue;
      try {
        const until = await this.payments.locked(c.escrowId, () => this.payments.lock(c.escrowId as Hex));
        this.state.credits.setLock(c.escrowId, until);
        this.log(`credit: escrow ${c.escrowId} of ${c.owner} is locked until ${new Date(until).toISOString()}`);
      } catch (err) {
        if (await this.closedBehindUs(c.escrowId)) continue;
        this.callFailed(c, 'renewing its lock', err);
      }
    }
  }

  private callFailed(c: CreditRecord, what: string, err: unknown): void {
    const message = (err as Error).message.split('\n')[0];
    const attempts = c.attempts + 1;
    const wait = retryDelayMs(attempts);
    this.state.credits.setError(c.escrowId, message, attempts, this.now() + wait);
    this.log(`credit: ${what} of escrow ${c.escrowId} failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
  }

  /**
   * Whether credit escrow `escrowId` was closed on chain by someone else (its
   * owner, once the lock had lapsed): then it is recorded closed and what it
   * still owed unpaid, for good. False when it is open or cannot be read.
   */
  private async closedBehindUs(escrowId: string): Promise<boolean> {
    const onChain = await readEscrow(this.chain.client, escrowId as Hex).catch(() => null);
    if (!onChain?.closed) return false;
    const pending = this.state.credits.payments({ status: 'pending', escrowId });
    const unpaid = pending.reduce((a, p) => a + BigInt(p.total), 0n);
    const why = `closed on chain by someone other than this orchestrator (its owner, once the lock had lapsed), ${formatNim(onChain.refunded)} NIM refunded: ${formatNim(unpaid)} NIM it was charged is unpaid`;
    this.state.tx(() => {
      for (const p of pending) this.state.credits.markUnpaid(p.epoch, escrowId, why);
      this.state.credits.markClosed(escrowId, onChain.refunded, null, this.now(), why);
    });
    this.log(`credit: escrow ${escrowId} ${why}`);
    return true;
  }

  /** Ending escrows nothing is pending on whose wallet's open escrows cover what it still owes; marked closing here (no await in between). */
  private closable(): CreditRecord[] {
    const out: CreditRecord[] = [];
    for (const c of this.state.credits.list('ending')) {
      if (this.state.credits.countPending(c.escrowId) > 0) continue;
      const owed = this.state.inferenceRequests.reservedOf(c.owner) + this.state.inferenceRequests.unallocatedOf(c.owner);
      if (owed > this.left(c.owner).open) continue;
      this.state.credits.startClosing(c.escrowId);
      out.push(c);
    }
    const closing = [...out, ...this.state.credits.list('closing').filter((c) => !out.some((o) => o.escrowId === c.escrowId))];
    return closing.filter((c) => c.retryAt === null || c.retryAt <= this.now());
  }

  private async close(c: CreditRecord): Promise<void> {
    try {
      const r = await closeEscrow(this.chain.client, this.chain.signer, c.escrowId as Hex);
      this.state.credits.markClosed(c.escrowId, r.refunded, r.tx?.hash ?? null, this.now());
      this.log(`credit: escrow ${c.escrowId} closed, ${formatNim(r.refunded)} NIM refunded to ${c.owner}`);
    } catch (err) {
      this.callFailed(c, 'closing', err);
    }
  }
}

/** A credit escrow as its owner sees it; a failing payment of it (if any) shows as its error, with its backoff. */
function escrowView(c: CreditRecord, failing?: CreditPaymentRecord): CreditEscrowView {
  if (failing) return { ...escrowView(c), error: `paying epoch ${failing.epoch}: ${failing.error}`, attempts: failing.attempts, retryAt: failing.retryAt };
  return {
    escrowId: c.escrowId,
    amount: c.amount,
    committed: c.committed,
    status: c.status,
    refunded: c.refunded,
    refundAfter: c.refundAfter,
    error: c.error,
    lockedUntil: c.status === 'closed' ? null : c.lockedUntil,
    attempts: c.attempts,
    retryAt: c.retryAt,
  };
}
