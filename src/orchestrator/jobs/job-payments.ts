// Developers pay for their jobs (docs/jobs.md "Payment"): the budget is
// escrowed on the chain's JobEscrow by the developer before the job is
// submitted; the orchestrator checks that escrow on chain (never the
// developer's word), pays the job's miners from it at every epoch in
// proportion to their scored work on the job, and refunds the rest when the
// job has ended and its last work is paid.
//
// What an epoch costs a job: the training FLOPs of the forward and backward
// units its miners were credited with (each stage's FLOPs per item from the
// planner's cost model, src/jobs/plan-workload.ts, times the items of a
// microbatch) at the job's price in NIM per PFLOP, never more than what is
// left in the escrow. That pot is split among the job's miners by their
// score on the job's work (src/orchestrator/rewards/scoring.ts: penalties included),
// so a miner that dropped or faked work takes less and the difference stays
// the developer's. Merges are not charged. The network's emission pays every
// miner as before, on top.
//
// Durable order (a kill -9 anywhere loses nothing and pays nothing twice):
//   1. in the epoch's transaction: each job's payment and shares are written
//      ('pending') and its escrow's committed sum grows;
//   2. pending payments are sent with payJob (idempotent per job and epoch:
//      the contract keeps the digest of the list it took);
//   3. an ended job's escrow is closed once every epoch holding its work is
//      closed and paid: closeEscrow (idempotent) refunds amount − paid.
//
// An escrow that pays for work is never its owner's to close while it does
// (the attack: wait past its refund time, have the job accepted, close it for
// a full refund after the miners worked). So: a job's timeout is bounded
// (MAX_JOB_TIMEOUT, src/jobs/spec.ts); an escrow whose refund time comes
// before the job's timeout plus SETTLEMENT_MARGIN_MS is refused; and when the
// job is accepted the orchestrator takes JobEscrow's lock on it (`lock`),
// renewed while the escrow is not closed, half a lockTimeout ahead: its owner
// cannot close it before the lock ends. The orchestrator's close releases
// it; if the orchestrator vanishes, the lock lapses by itself. Wallets'
// inference credit (../serving/credits.ts) is locked the same way.
//
// A failing chain call (a payment, a lock renewal, a close) is retried with
// exponential backoff (../rewards/backoff.ts: 1 s doubling to 5 min), its attempts,
// next try and error recorded on its row, shown in the job's `payment` and
// noted in the job's events; never in a tight loop. An escrow found closed on
// chain with payments pending (its owner's close after the lock lapsed) marks
// them unpaid, for good, and says so.
import { getAddress, parseEventLogs, type Address, type Hex } from 'viem';
import type { ChainClient, SigningClient } from '../../chain/client.ts';
import { chainTime, closeEscrow, escrowAddress, escrowLockTimeout, lockEscrow, payJob, readEscrow, type JobEscrowState } from '../../chain/escrow.ts';
import { formatDuration } from '../../jobs/duration.ts';
import { retryDelayMs } from '../rewards/backoff.ts';
import { formatNim } from '../../chain/amounts.ts';
import { nimAbi } from '../../chain/abis.ts';
import { DEFAULT_PRICING, STORAGE_NIM_PER_GB_DAY } from '../../jobs/plan-constants.ts';
import { workload } from '../../jobs/plan-workload.ts';
import { itemsPerStep, resolveJobSpec } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { scoreEpoch, splitEmission, type StageShares } from '../rewards/scoring.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { WorkRecord } from '../state/ledger.ts';
import type { EscrowRecord } from '../state/escrows.ts';

/**
 * What an escrow must hold beyond a job's timeout before its owner may close
 * it alone (1 day): the ended job's last epochs close and are paid well within.
 */
export const SETTLEMENT_MARGIN_MS = 86_400_000;
/** How often the locks of escrows that pay for work are checked against the chain's clock. */
const LOCK_CHECK_MS = 5_000;

/** One line of an error. */
function firstLine(err: unknown): string {
  return (err as Error).message.split('\n')[0];
}

/** What a developer needs in order to pay: where, to whom, at what price. */
export interface PaymentTerms {
  chainId: number;
  jobEscrow: Address;
  /** the orchestrator's account: storage payments go there */
  payee: Address;
  nimPerPetaflop: number;
  storageNimPerGbDay: number;
}

export interface JobPaymentsOptions {
  client: ChainClient;
  /** holds JobEscrow's ORCHESTRATOR_ROLE */
  signer: SigningClient;
  /** the network's price of work (default DEFAULT_PRICING) */
  nimPerPetaflop?: number;
  log?: (line: string) => void;
}

/** An escrow checked on chain for a job about to be submitted. */
export interface CheckedEscrow {
  escrowId: Hex;
  amount: bigint;
}

/** An escrow checked and locked on chain: the job it pays for may be recorded. */
export interface AcceptedEscrow extends CheckedEscrow {
  /** ms until which the orchestrator's lock holds it */
  lockedUntil: number;
}

/** The chain's clock for one pass over the locks. */
export interface LockClock {
  /** unix seconds, as the contract sees them */
  nowS: number;
  /** JobEscrow.lockTimeout */
  lockTimeoutS: number;
}

export class JobPayments {
  readonly nimPerPetaflop: number;
  private readonly log: (line: string) => void;
  /** escrow ids being checked, bound or released: one at a time each */
  private readonly locks = new Map<string, Promise<unknown>>();
  private lockTimeoutS: number | null = null;
  private locksCheckedAt = new Map<string, number>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly chain: JobPaymentsOptions,
    private readonly now: () => number = Date.now,
  ) {
    this.nimPerPetaflop = chain.nimPerPetaflop ?? DEFAULT_PRICING.nimPerPetaflop;
    this.log = chain.log ?? ((line) => console.error(`orchestrator: ${line}`));
  }

  terms(): PaymentTerms {
    return {
      chainId: this.chain.client.chainId,
      jobEscrow: escrowAddress(this.chain.client),
      payee: this.chain.signer.account.address,
      nimPerPetaflop: this.nimPerPetaflop,
      storageNimPerGbDay: STORAGE_NIM_PER_GB_DAY,
    };
  }

  /** Runs `fn` with escrow `escrowId` to itself: a submit and a release of one escrow never interleave. */
  async locked<T>(escrowId: string, fn: () => Promise<T>): Promise<T> {
    const key = escrowId.toLowerCase();
    const before = this.locks.get(key) ?? Promise.resolve();
    const run = before.catch(() => undefined).then(fn);
    this.locks.set(key, run);
    try {
      return await run;
    } finally {
      if (this.locks.get(key) === run) this.locks.delete(key);
    }
  }

  /**
   * Checks on chain that `escrowId` holds exactly `budget` of `owner`'s NIM,
   * open, untouched, pays for no job or credit here, and cannot be refunded
   * to its owner before a job of `timeoutMs` has run and been paid (its
   * timeout plus SETTLEMENT_MARGIN_MS). Call under `locked`.
   */
  async checkEscrow(escrowId: string, owner: string, budget: bigint, timeoutMs: number): Promise<CheckedEscrow> {
    const e = await this.checkFreshEscrow(escrowId, owner);
    if (e.amount !== budget) throw new NimbleError('invalid', `escrow ${e.jobId} holds ${formatNim(e.amount)} NIM; the job's budget is ${formatNim(budget)} NIM: they must be equal`);
    const nowS = await chainTime(this.chain.client);
    const neededS = nowS + Math.ceil((timeoutMs + SETTLEMENT_MARGIN_MS) / 1000);
    if (e.refundAfter < neededS) {
      throw new NimbleError(
        'invalid',
        `escrow ${e.jobId} can be refunded to its owner from ${iso(e.refundAfter)}; a job with a timeout of ${formatDuration(timeoutMs)} needs its escrow held until ${iso(neededS)} (its timeout plus ${formatDuration(SETTLEMENT_MARGIN_MS)} to settle): open a new escrow (nbcli job submit does), or give the job a shorter limits.timeout`,
      );
    }
    return { escrowId: e.jobId, amount: e.amount };
  }

  /**
   * checkEscrow, then JobEscrow's lock on it: from here its owner cannot close
   * it while the orchestrator holds the lock. Call under `locked`, then record
   * the job (a job that is not recorded leaves the escrow to `release`).
   */
  async acceptEscrow(escrowId: string, owner: string, budget: bigint, timeoutMs: number): Promise<AcceptedEscrow> {
    const checked = await this.checkEscrow(escrowId, owner, budget, timeoutMs);
    const lockedUntil = await this.lock(checked.escrowId);
    return { ...checked, lockedUntil };
  }

  /** Takes (or renews) JobEscrow's lock on `escrowId`: ms until which it holds. */
  async lock(escrowId: Hex): Promise<number> {
    const r = await lockEscrow(this.chain.client, this.chain.signer, escrowId);
    return r.lockedUntil * 1000;
  }

  /**
   * The chain's clock for a pass over the locks of `what` (job escrows,
   * credits), at most every LOCK_CHECK_MS each; null between passes.
   */
  async lockClock(what: 'jobs' | 'credits'): Promise<LockClock | null> {
    const now = this.now();
    if (now - (this.locksCheckedAt.get(what) ?? -Infinity) < LOCK_CHECK_MS) return null;
    this.locksCheckedAt.set(what, now);
    this.lockTimeoutS ??= await escrowLockTimeout(this.chain.client);
    return { nowS: await chainTime(this.chain.client), lockTimeoutS: this.lockTimeoutS };
  }

  /** Whether a lock holding until `lockedUntil` (ms; null: none) must be renewed now: less than half a lockTimeout is left. */
  static lockDue(lockedUntil: number | null, clock: LockClock): boolean {
    return (lockedUntil ?? 0) / 1000 - clock.nowS < clock.lockTimeoutS / 2;
  }

  /**
   * What every escrow taken here must be (a job's budget, or a wallet's
   * inference credit, src/orchestrator/serving/credits.ts): `owner`'s on chain, open,
   * untouched, and bound to nothing here yet. Call under `locked`.
   */
  async checkFreshEscrow(escrowId: string, owner: string): Promise<JobEscrowState> {
    if (!/^0x[0-9a-fA-F]{64}$/.test(escrowId) || /^0x0{64}$/.test(escrowId)) throw new NimbleError('invalid', `escrow must be a non-zero 32-byte hex id, got '${escrowId.slice(0, 80)}'`);
    const id = escrowId.toLowerCase() as Hex;
    this.checkUnbound(id, 'already pays for');
    const e = await readEscrow(this.chain.client, id);
    if (!e) throw new NimbleError('payment_required', `no escrow ${id} on JobEscrow ${escrowAddress(this.chain.client)} (chain ${this.chain.client.chainId}): open it first (nbcli job submit and nbcli credit add do)`, 402);
    if (getAddress(e.owner) !== getAddress(owner)) throw new NimbleError('forbidden', `escrow ${id} is ${e.owner}'s, not ${owner}'s`);
    if (e.closed) throw new NimbleError('conflict', `escrow ${id} is closed`);
    if (e.paid > 0n) throw new NimbleError('conflict', `escrow ${id} has paid ${formatNim(e.paid)} NIM already: open a new one`);
    return { ...e, jobId: id };
  }

  /** Refuses an escrow that pays for a job or is a wallet's inference credit here. */
  private checkUnbound(id: Hex, verb: string): void {
    const bound = this.state.escrows.byEscrowId(id);
    if (bound) throw new NimbleError('conflict', `escrow ${id} ${verb} job ${bound.jobId}${verb === 'pays for' ? ': what it does not pay is refunded when the job ends' : ''}`);
    const credit = this.state.credits.get(id);
    if (credit) throw new NimbleError('conflict', `escrow ${id} is ${credit.owner}'s inference credit${verb === 'pays for' ? ': nbcli credit withdraw gets back what it does not pay' : ''}`);
  }

  /** The owner gets back an escrow that pays for no job and is no credit here (a submission that failed after it was opened). Call under `locked`. */
  async release(escrowId: string, by: string): Promise<{ escrowId: Hex; refunded: bigint; alreadyClosed: boolean; tx: Hex | null }> {
    if (!/^0x[0-9a-fA-F]{64}$/.test(escrowId)) throw new NimbleError('invalid', `escrow must be a 32-byte hex id, got '${escrowId.slice(0, 80)}'`);
    const id = escrowId.toLowerCase() as Hex;
    this.checkUnbound(id, 'pays for');
    const e = await readEscrow(this.chain.client, id);
    if (!e) throw new NimbleError('not_found', `no escrow ${id}`);
    if (getAddress(e.owner) !== getAddress(by)) throw new NimbleError('forbidden', `escrow ${id} is ${e.owner}'s, not ${by}'s`);
    const r = await closeEscrow(this.chain.client, this.chain.signer, id);
    this.log(`released escrow ${id}: ${formatNim(r.refunded)} NIM back to ${e.owner}`);
    return { escrowId: id, refunded: r.refunded, alreadyClosed: r.alreadyClosed, tx: r.tx?.hash ?? null };
  }

  /**
   * Writes what the epoch owes each paying job's miners (inside the epoch's
   * transaction): the job's work in `rows` priced in FLOPs, capped by what is
   * left in its escrow, split by score.
   */
  allocate(epochId: number, rows: readonly WorkRecord[], shares: StageShares): void {
    const byJob = new Map<string, WorkRecord[]>();
    const escrows = new Map<string, EscrowRecord>();
    for (const r of rows) {
      if (r.runId === null) continue;
      const jobId = this.state.jobs.jobOfRun(r.runId);
      if (jobId === null) continue;
      let e = escrows.get(jobId);
      if (!e) {
        const found = this.state.escrows.get(jobId);
        if (!found) continue;
        escrows.set(jobId, (e = found));
      }
      if (e.status === 'closed' || (e.status === 'ending' && e.endedLog !== null && r.id > e.endedLog)) continue;
      let list = byJob.get(jobId);
      if (!list) byJob.set(jobId, (list = []));
      list.push(r);
    }
    for (const [jobId, list] of byJob) {
      const e = escrows.get(jobId)!;
      const flops = this.workFlops(jobId, list);
      const left = BigInt(e.amount) - BigInt(e.committed);
      const cost = weiOf(flops, e.price);
      const pot = cost < left ? cost : left;
      if (pot <= 0n) {
        if (cost > 0n) this.state.escrows.addPayment(epochId, jobId, flops, [], true);
        continue;
      }
      const split = splitEmission(scoreEpoch(list, shares), pot);
      this.state.escrows.addPayment(epochId, jobId, flops, split.rewards, cost >= left);
    }
  }

  /** Training FLOPs of the forward and backward units in `rows` (all of one job). */
  private workFlops(jobId: string, rows: readonly WorkRecord[]): number {
    const job = this.state.jobs.get(jobId);
    if (!job) return 0;
    const resolved = resolveJobSpec(job.spec);
    const work = workload(resolved.model, resolved.batchSize, 1);
    const items = itemsPerStep(resolved.model, resolved.batchSize);
    const perStage = new Map<string, { forward: number; backward: number }[]>();
    let flops = 0;
    for (const r of rows) {
      if ((r.kind !== 'forward' && r.kind !== 'backward') || !(r.units > 0) || r.runId === null) continue;
      let stages = perStage.get(r.runId);
      if (!stages) {
        stages = this.state.runs.stages(r.runId).map((s) => work.cost(work.kind === 'gpt' ? { from: s.fromPart, to: s.toPart } : null).flopsPerToken);
        perStage.set(r.runId, stages);
      }
      // a unit with no stage counts as the whole model's share of an average stage
      const f = r.stage !== null && stages[r.stage] ? stages[r.stage] : { forward: work.whole.flopsPerToken.forward / Math.max(1, stages.length), backward: work.whole.flopsPerToken.backward / Math.max(1, stages.length) };
      flops += r.units * items * (r.kind === 'forward' ? f.forward : f.backward);
    }
    return flops;
  }

  /**
   * Sends pending payments that are due, renews the locks of escrows that
   * pay for work, then closes the escrows of ended jobs whose work is all
   * paid. A failed call is recorded and tried again after its backoff.
   */
  async reconcile(): Promise<void> {
    const now = this.now();
    for (const p of this.state.escrows.payments({ status: 'pending' })) {
      if (p.retryAt !== null && p.retryAt > now) continue;
      const e = this.state.escrows.get(p.jobId);
      if (!e) continue;
      const list = this.state.escrows.shares(p.epoch, p.jobId).map((s) => ({ address: s.miner as Address, amount: BigInt(s.amount) }));
      try {
        const r = await payJob(this.chain.client, this.chain.signer, e.escrowId as Hex, BigInt(p.epoch), list);
        this.state.escrows.markPaid(p.epoch, p.jobId, r.tx?.hash ?? null);
        if (!r.alreadyPaid && r.total > 0n) this.log(`job ${p.jobId}: paid ${formatNim(r.total)} NIM from its escrow to ${r.miners} miner(s) for epoch ${p.epoch}`);
        if (p.attempts > 0) this.state.jobs.note(p.jobId, `its miners were paid ${formatNim(BigInt(p.total))} NIM for epoch ${p.epoch} after ${p.attempts + 1} attempts`, this.now());
      } catch (err) {
        if (await this.closedBehindUs(e)) continue;
        const message = firstLine(err);
        const attempts = p.attempts + 1;
        const wait = retryDelayMs(attempts);
        this.state.escrows.setPaymentError(p.epoch, p.jobId, message, attempts, this.now() + wait);
        this.log(`job ${p.jobId}: paying epoch ${p.epoch} failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
        if (attempts === 1 || message !== p.error) this.state.jobs.note(p.jobId, `paying its miners ${formatNim(BigInt(p.total))} NIM for epoch ${p.epoch} failed (attempt ${attempts}): ${message}; it is retried with a growing wait (next in ${formatDuration(wait)})`, this.now());
      }
    }
    await this.keepLocks();
    const open = this.state.ledger.openEpoch(this.now());
    for (const e of this.state.escrows.list('ending')) {
      // the work it pays for must all be in closed epochs, and those paid
      if ((e.endedLog ?? 0) > open.fromLog || this.state.escrows.countPending(e.jobId) > 0) continue;
      if (e.retryAt !== null && e.retryAt > this.now()) continue;
      try {
        const r = await closeEscrow(this.chain.client, this.chain.signer, e.escrowId as Hex);
        this.state.escrows.markClosed(e.jobId, r.refunded, r.tx?.hash ?? null, this.now());
        this.log(`job ${e.jobId}: escrow closed, ${formatNim(r.refunded)} NIM refunded to ${e.owner}`);
      } catch (err) {
        this.escrowCallFailed(e, 'closing its escrow', err);
      }
    }
  }

  /** Renews the lock of every escrow that pays for a job and is not closed once less than half a lockTimeout is left of it. */
  private async keepLocks(): Promise<void> {
    const bound = [...this.state.escrows.list('open'), ...this.state.escrows.list('ending')];
    if (bound.length === 0) return;
    const clock = await this.lockClock('jobs').catch((err: unknown) => {
      this.log(`escrow locks: cannot read the chain's clock: ${firstLine(err)}`);
      return null;
    });
    if (!clock) return;
    for (const e of bound) {
      if (!JobPayments.lockDue(e.lockedUntil, clock) || (e.retryAt !== null && e.retryAt > this.now())) continue;
      try {
        const until = await this.locked(e.escrowId, () => this.lock(e.escrowId as Hex));
        this.state.escrows.setLock(e.jobId, until);
        this.log(`job ${e.jobId}: its escrow is locked until ${new Date(until).toISOString()}`);
      } catch (err) {
        if (await this.closedBehindUs(e)) continue;
        this.escrowCallFailed(e, 'renewing the lock on its escrow', err);
      }
    }
  }

  private escrowCallFailed(e: EscrowRecord, what: string, err: unknown): void {
    const message = firstLine(err);
    const attempts = e.attempts + 1;
    const wait = retryDelayMs(attempts);
    this.state.escrows.setError(e.jobId, message, attempts, this.now() + wait);
    this.log(`job ${e.jobId}: ${what} failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
    if (attempts === 1 || message !== e.error) this.state.jobs.note(e.jobId, `${what} failed (attempt ${attempts}): ${message}; it is retried with a growing wait (next in ${formatDuration(wait)})`, this.now());
  }

  /**
   * Whether job escrow `e` was closed on chain by someone else (its owner,
   * once the lock had lapsed): then it is recorded closed, what it still
   * owed is unpaid for good, and the job is told. False when the escrow is
   * open or cannot be read.
   */
  private async closedBehindUs(e: EscrowRecord): Promise<boolean> {
    const onChain = await readEscrow(this.chain.client, e.escrowId as Hex).catch(() => null);
    if (!onChain?.closed) return false;
    const pending = this.state.escrows.payments({ status: 'pending', jobId: e.jobId });
    const unpaid = pending.reduce((a, p) => a + BigInt(p.total), 0n);
    const why = `its escrow was closed on chain by someone other than this orchestrator (its owner, once the lock had lapsed), ${formatNim(onChain.refunded)} NIM refunded: ${formatNim(unpaid)} NIM of its miners' work ${pending.length ? `(epochs ${pending.map((p) => p.epoch).join(', ')}) ` : ''}is unpaid`;
    this.state.tx(() => {
      for (const p of pending) this.state.escrows.markUnpaid(p.epoch, p.jobId, why);
      this.state.escrows.markClosed(e.jobId, onChain.refunded, null, this.now(), why);
      this.state.jobs.note(e.jobId, why, this.now());
    });
    this.log(`job ${e.jobId}: ${why}`);
    return true;
  }

  /** The NIM keeping `bytes` of checkpoints `days` more days costs (wei, rounded up). */
  storagePrice(bytes: number, days: number): bigint {
    return weiOfNim((bytes / 1e9) * days * STORAGE_NIM_PER_GB_DAY);
  }

  /**
   * Checks that transaction `txHash` moved at least `price` NIM from `payer`
   * to this orchestrator, and records it (once: a transaction pays for one keep).
   */
  async checkStoragePayment(txHash: string, payer: string, price: bigint, record: { jobId: string; days: number }): Promise<void> {
    if (!/^0x[0-9a-fA-F]{64}$/.test(txHash)) throw new NimbleError('invalid', `payment must be a transaction hash, got '${txHash.slice(0, 80)}'`);
    const receipt = await this.chain.client.public.getTransactionReceipt({ hash: txHash as Hex }).catch(() => null);
    if (!receipt || receipt.status !== 'success') throw new NimbleError('payment_required', `transaction ${txHash} is not a successful transaction on chain ${this.chain.client.chainId}`, 402);
    const payee = getAddress(this.chain.signer.account.address);
    const nim = getAddress(this.chain.client.deployment.nim);
    const logs = parseEventLogs({ abi: nimAbi, eventName: 'Transfer', logs: receipt.logs.filter((l) => getAddress(l.address) === nim) });
    const paid = logs.filter((l) => getAddress(l.args.from) === getAddress(payer) && getAddress(l.args.to) === payee).reduce((a, l) => a + l.args.value, 0n);
    if (paid < price) throw new NimbleError('payment_required', `transaction ${txHash} moved ${formatNim(paid)} NIM from ${payer} to ${payee}; keeping these checkpoints costs ${formatNim(price)} NIM`, 402);
    const fresh = this.state.escrows.addStoragePayment({ txHash, jobId: record.jobId, payer, amount: paid.toString(), days: record.days, at: this.now() });
    if (!fresh) throw new NimbleError('conflict', `transaction ${txHash} has paid for a keep already`);
  }
}

function iso(unixSeconds: number): string {
  return new Date(unixSeconds * 1000).toISOString();
}

/** Wei of `flops` at `nimPerPetaflop` (flops / 1e15 × price NIM), rounded up. */
function weiOf(flops: number, nimPerPetaflop: number): bigint {
  return weiOfNim((flops / 1e15) * nimPerPetaflop);
}

/** `nim` in wei, rounded up (to 1e-9 NIM above 9,007 NIM, where a double holds no more digits). */
function weiOfNim(nim: number): bigint {
  if (!(nim > 0) || !Number.isFinite(nim)) return 0n;
  const wei = nim * 1e18;
  if (wei < Number.MAX_SAFE_INTEGER) return BigInt(Math.ceil(wei));
  return BigInt(Math.ceil(nim * 1e9)) * 1_000_000_000n;
}
