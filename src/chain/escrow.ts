// The JobEscrow contract: a developer's training job paid from NIM held in
// escrow. The developer opens it (approve + open, refused before anything is
// sent when its NIM is short), the orchestrator pays the job's miners once per
// (job, epoch) as stake and closes it (the rest goes back to the developer),
// or the developer closes it after its refund time, and not while the
// orchestrator holds its lock (taken when the escrow starts paying for work,
// renewed while it does, lapsing by itself `lockTimeout` after the last
// renewal if the orchestrator vanished). Paying and closing are
// idempotent here: a call the chain already took returns `alreadyPaid` /
// `alreadyClosed` instead of failing, so an orchestrator that crashed
// mid-settlement simply calls again. Reads: one escrow, one (job, epoch)
// payment, a miner's job earnings, the chain's clock.
import { isHex, keccak256, toHex, type Address, type Hex } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { jobEscrowAbi, nimAbi } from './abis.ts';
import { formatNim } from './amounts.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { normalizeRewards, rewardsDigest, type Reward } from './rewards.ts';
import { ensureGas, nimBalance } from './token.ts';
import { ChainTxError, sendContractTx, type SentTx } from './tx.ts';

const ZERO_BYTES32: Hex = `0x${'0'.repeat(64)}`;

type NimError = Extract<(typeof nimAbi)[number], { type: 'error' }>;

/**
 * JobEscrow's ABI plus NIM's errors: `open` pulls the tokens with
 * transferFrom, so a missing approval or balance reverts with the token's
 * error (ERC20InsufficientAllowance, ERC20InsufficientBalance), named thanks to these.
 */
export const jobEscrowCallAbi = [...jobEscrowAbi, ...nimAbi.filter((item): item is NimError => item.type === 'error')];
const MAX_UINT64 = (1n << 64n) - 1n;

export interface JobEscrowState {
  jobId: Hex;
  /** the developer who opened it: refunds go there */
  owner: Address;
  /** NIM base units escrowed at open */
  amount: bigint;
  /** paid to miners so far */
  paid: bigint;
  /** sent back to the owner at close (0 while open) */
  refunded: bigint;
  /** still held: amount − paid while open, 0 once closed */
  remaining: bigint;
  closed: boolean;
  /** unix seconds from which the owner may close it itself (and not before `lockedUntil`) */
  refundAfter: number;
  /** unix seconds until which the orchestrator's lock holds it (0: never locked) */
  lockedUntil: number;
}

/** A job id for the contract from any string id (keccak256 of its UTF-8 bytes); a 32-byte hex id is used as is. */
export function jobIdOf(id: string): Hex {
  if (isHex(id, { strict: true }) && id.length === 66) return id.toLowerCase() as Hex;
  return keccak256(toHex(id));
}

/** The JobEscrow address of this deployment; a clear error for a deployment recorded before it existed. */
export function escrowAddress(client: ChainClient): Address {
  const address = client.deployment.jobEscrow;
  if (!address) {
    throw new NimbleError(
      'not_found',
      `no JobEscrow address for chain ${client.chainId} in deployment.json: the deployment predates it (deploy it with upgradeDeployment in src/chain/deploy.ts)`,
    );
  }
  return address;
}

function checkJobId(jobId: Hex): void {
  if (!isHex(jobId, { strict: true }) || jobId.length !== 66) throw new NimbleError('invalid', `job id must be 32 bytes of hex (see jobIdOf), got '${jobId}'`);
  if (jobId === ZERO_BYTES32) throw new NimbleError('invalid', 'job id must not be zero');
}

/** The escrow of `jobId`, or null when none was ever opened. */
export async function readEscrow(client: ChainClient, jobId: Hex): Promise<JobEscrowState | null> {
  checkJobId(jobId);
  const e = await client.public.readContract({ address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'escrowOf', args: [jobId] });
  if (e.owner === '0x0000000000000000000000000000000000000000') return null;
  return {
    jobId,
    owner: e.owner,
    amount: e.amount,
    paid: e.paid,
    refunded: e.refunded,
    remaining: e.closed ? 0n : e.amount - e.paid,
    closed: e.closed,
    refundAfter: Number(e.refundAfter),
    lockedUntil: Number(e.lockedUntil),
  };
}

/** Unix seconds from which the owner of `e` may close it alone: its refund time, or the end of the orchestrator's lock if later. */
export function ownerMayCloseFrom(e: Pick<JobEscrowState, 'refundAfter' | 'lockedUntil'>): number {
  return Math.max(e.refundAfter, e.lockedUntil);
}

/** Seconds a lock holds after the orchestrator's last `lock` of an escrow (JobEscrow.lockTimeout). */
export async function escrowLockTimeout(client: ChainClient): Promise<number> {
  return Number(await client.public.readContract({ address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'lockTimeout' }));
}

/**
 * The chain's clock (unix seconds) as its contracts will see it, never below
 * this machine's: the latest block's timestamp, or now if that is older (a
 * node mines no block while idle). What refund times and locks are measured by.
 */
export async function chainTime(client: ChainClient): Promise<number> {
  const block = await client.public.getBlock({ blockTag: 'latest' });
  return Math.max(Number(block.timestamp), Math.floor(Date.now() / 1000));
}

/** NIM the contract holds for open escrows (equal to its NIM balance). */
export async function escrowTotalHeld(client: ChainClient): Promise<bigint> {
  return client.public.readContract({ address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'totalHeld' });
}

/** The digest of what job `jobId` paid for `epoch`, or null when it paid nothing for that epoch. */
export async function jobEpochPaid(client: ChainClient, jobId: Hex, epoch: bigint): Promise<Hex | null> {
  checkJobId(jobId);
  checkEpoch(epoch);
  const digest = await client.public.readContract({ address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'paidDigestOf', args: [jobId, epoch] });
  return digest === ZERO_BYTES32 ? null : digest;
}

function checkEpoch(epoch: bigint): void {
  if (epoch < 0n || epoch > MAX_UINT64) throw new NimbleError('invalid', `epoch must be a uint64, got ${epoch}`);
}

export interface OpenEscrowOptions {
  /** approve the contract for `amount` when its allowance is short (default true); false: refuse instead */
  approve?: boolean;
}

export interface OpenEscrowResult {
  /** an escrow by this developer with this amount was already open: nothing was sent */
  alreadyOpen: boolean;
  escrow: JobEscrowState;
  txs: SentTx[];
}

/**
 * Escrows `amount` of the developer's NIM for job `jobId` (approve when needed,
 * then open). Refused before anything is sent when the developer's free NIM
 * (or, with `approve: false`, its allowance) is short, naming the shortfall,
 * or when the job already has another escrow. Calling again after a success
 * returns `alreadyOpen`.
 */
export async function openEscrow(
  client: ChainClient,
  developer: SigningClient,
  jobId: Hex,
  amount: bigint,
  opts: OpenEscrowOptions = {},
): Promise<OpenEscrowResult> {
  checkJobId(jobId);
  if (amount <= 0n) throw new NimbleError('invalid', `escrow amount must be more than 0 NIM, got ${formatNim(amount)}`);
  const escrow = escrowAddress(client);
  const me = developer.account.address;
  const existing = await readEscrow(client, jobId);
  if (existing) return alreadyOpen(existing, me, amount);
  const free = await nimBalance(client, me);
  if (free < amount) {
    throw new NimbleError(
      'invalid',
      `not enough NIM to escrow job ${jobId}: ${formatNim(amount)} NIM needed, ${formatNim(free)} NIM free in ${me} (${formatNim(amount - free)} NIM short)`,
    );
  }
  const allowance = await client.public.readContract({ address: client.deployment.nim, abi: nimAbi, functionName: 'allowance', args: [me, escrow] });
  if (allowance < amount && opts.approve === false) {
    throw new NimbleError(
      'invalid',
      `JobEscrow ${escrow} may spend ${formatNim(allowance)} NIM of ${me}, job ${jobId} needs ${formatNim(amount)} (${formatNim(amount - allowance)} NIM short): approve it first`,
    );
  }
  await ensureGas(client, me);
  const txs: SentTx[] = [];
  if (allowance < amount) {
    txs.push(await sendContractTx(client, developer, { address: client.deployment.nim, abi: nimAbi, functionName: 'approve', args: [escrow, amount] }));
  }
  try {
    txs.push(await sendContractTx(client, developer, { address: escrow, abi: jobEscrowCallAbi, functionName: 'open', args: [jobId, amount] }));
  } catch (err) {
    const raced = err instanceof ChainTxError && err.errorName === 'JobExists' ? await readEscrow(client, jobId) : null;
    if (raced) return { ...alreadyOpen(raced, me, amount), txs };
    throw err;
  }
  const opened = await readEscrow(client, jobId);
  if (!opened) throw new Error(`open of job ${jobId} left no escrow (${txs.at(-1)?.hash})`);
  return { alreadyOpen: false, escrow: opened, txs };
}

function alreadyOpen(existing: JobEscrowState, me: Address, amount: bigint): OpenEscrowResult {
  if (existing.owner.toLowerCase() !== me.toLowerCase() || existing.amount !== amount || existing.closed) {
    throw new NimbleError(
      'conflict',
      `job ${existing.jobId} already has an escrow: ${formatNim(existing.amount)} NIM by ${existing.owner}${existing.closed ? ', closed' : ''}`,
    );
  }
  return { alreadyOpen: true, escrow: existing, txs: [] };
}

export interface PayJobResult {
  jobId: Hex;
  epoch: bigint;
  /** the chain had already taken this (job, epoch) with the same list: nothing was sent */
  alreadyPaid: boolean;
  miners: number;
  total: bigint;
  /** keccak256 of the normalized list, as the contract records it */
  digest: Hex;
  tx?: SentTx;
}

/**
 * Pays job `jobId`'s miners for `epoch` from its escrow, credited to their
 * stakes. The list is normalized like epoch rewards (duplicates merged, zeros
 * dropped); an empty list sends nothing. Idempotent: when the chain already
 * shows this (job, epoch) paid with the same list, nothing is sent and
 * `alreadyPaid` is true; paid with a different list is an error. Refused
 * before sending when the job is unknown or closed, or when the list exceeds
 * what remains. `orchestrator` must hold ORCHESTRATOR_ROLE.
 */
export async function payJob(
  client: ChainClient,
  orchestrator: SigningClient,
  jobId: Hex,
  epoch: bigint,
  payments: readonly Reward[],
): Promise<PayJobResult> {
  checkJobId(jobId);
  checkEpoch(epoch);
  const list = normalizeRewards(payments);
  const digest = rewardsDigest(list);
  const total = list.reduce((s, r) => s + r.amount, 0n);
  const base = { jobId, epoch, miners: list.length, total, digest };
  const paid = await jobEpochPaid(client, jobId, epoch);
  if (paid) return alreadyPaid(base, paid);
  const escrow = await readEscrow(client, jobId);
  if (!escrow) throw new NimbleError('not_found', `no escrow for job ${jobId}`);
  if (list.length === 0) return { ...base, alreadyPaid: false };
  if (escrow.closed) throw new NimbleError('conflict', `job ${jobId} is closed: its escrow pays nothing more`);
  if (total > escrow.remaining) {
    throw new NimbleError(
      'invalid',
      `paying job ${jobId} epoch ${epoch} would overpay its escrow: ${formatNim(total)} NIM asked, ${formatNim(escrow.remaining)} NIM left`,
    );
  }
  try {
    const tx = await sendContractTx(client, orchestrator, {
      address: escrowAddress(client),
      abi: jobEscrowAbi,
      functionName: 'pay',
      args: [jobId, epoch, list.map((r) => r.address), list.map((r) => r.amount)],
    });
    return { ...base, alreadyPaid: false, tx };
  } catch (err) {
    const raced = err instanceof ChainTxError && err.errorName === 'EpochAlreadyPaid' ? await jobEpochPaid(client, jobId, epoch) : null;
    if (raced) return alreadyPaid(base, raced);
    throw err;
  }
}

function alreadyPaid(base: Omit<PayJobResult, 'alreadyPaid' | 'tx'>, onChain: Hex): PayJobResult {
  if (onChain !== base.digest) {
    throw new NimbleError(
      'conflict',
      `job ${base.jobId} epoch ${base.epoch} was already paid with a different list (digest ${onChain}, this list ${base.digest})`,
    );
  }
  return { ...base, alreadyPaid: true };
}

export interface LockEscrowResult {
  jobId: Hex;
  /** unix seconds until which the lock now holds */
  lockedUntil: number;
  tx: SentTx;
}

/**
 * Locks (or renews the lock of) job `jobId`'s escrow for the contract's
 * `lockTimeout` from now: until then its owner cannot close it. Refused
 * before sending when the escrow is unknown or closed. `orchestrator` must
 * hold ORCHESTRATOR_ROLE.
 */
export async function lockEscrow(client: ChainClient, orchestrator: SigningClient, jobId: Hex): Promise<LockEscrowResult> {
  const escrow = await readEscrow(client, jobId);
  if (!escrow) throw new NimbleError('not_found', `no escrow for job ${jobId}`);
  if (escrow.closed) throw new NimbleError('conflict', `escrow ${jobId} is closed: there is nothing to lock`);
  const tx = await sendContractTx(client, orchestrator, { address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'lock', args: [jobId] });
  const locked = await readEscrow(client, jobId);
  return { jobId, lockedUntil: locked?.lockedUntil ?? 0, tx };
}

export interface CloseEscrowResult {
  jobId: Hex;
  /** the escrow was already closed: nothing was sent */
  alreadyClosed: boolean;
  /** NIM sent back to the owner (by this call or the one that closed it) */
  refunded: bigint;
  tx?: SentTx;
}

/**
 * Closes job `jobId`'s escrow and refunds what remains to its owner. The
 * orchestrator may close at any time; the owner from `refundAfter` on (before,
 * a ChainTxError 'RefundNotYet' saying when, nothing sent), and not while the
 * orchestrator's lock holds (a ChainTxError 'EscrowLocked' saying until when).
 * Idempotent: an escrow already closed returns `alreadyClosed` with what was refunded.
 */
export async function closeEscrow(client: ChainClient, signer: SigningClient, jobId: Hex): Promise<CloseEscrowResult> {
  const escrow = await readEscrow(client, jobId);
  if (!escrow) throw new NimbleError('not_found', `no escrow for job ${jobId}`);
  if (escrow.closed) return { jobId, alreadyClosed: true, refunded: escrow.refunded };
  await ensureGas(client, signer.account.address);
  try {
    const tx = await sendContractTx(client, signer, { address: escrowAddress(client), abi: jobEscrowAbi, functionName: 'close', args: [jobId] });
    const closed = await readEscrow(client, jobId);
    return { jobId, alreadyClosed: false, refunded: closed?.refunded ?? 0n, tx };
  } catch (err) {
    if (!(err instanceof ChainTxError)) throw err;
    if (err.errorName === 'JobClosed') {
      const closed = await readEscrow(client, jobId);
      return { jobId, alreadyClosed: true, refunded: closed?.refunded ?? 0n };
    }
    if (err.errorName === 'RefundNotYet' || err.errorName === 'EscrowLocked') {
      const now = await readEscrow(client, jobId);
      const from = new Date(ownerMayCloseFrom(now ?? escrow) * 1000).toISOString();
      throw new ChainTxError(
        err.errorName === 'EscrowLocked'
          ? `escrow ${jobId} is locked by the orchestrator until ${new Date((now ?? escrow).lockedUntil * 1000).toISOString()}: it pays for work that runs or is not paid yet. The orchestrator refunds what it does not pay when that work is settled; if the orchestrator is gone, its owner can close it from ${from}`
          : `job ${jobId}'s escrow can be closed by its owner from ${from}; until then only the orchestrator closes it`,
        err.errorName,
      );
    }
    throw err;
  }
}

export interface JobEarning {
  jobId: Hex;
  epoch: bigint;
  amount: bigint;
  blockNumber: bigint;
}

/** Every job payment `miner` received, per (job, epoch), from the Paid events since deployment. */
export async function jobEarnings(client: ChainClient, miner: Address): Promise<JobEarning[]> {
  const logs = await client.public.getContractEvents({
    address: escrowAddress(client),
    abi: jobEscrowAbi,
    eventName: 'Paid',
    args: { miner },
    fromBlock: BigInt(client.deployment.deployBlock),
    toBlock: 'latest',
    strict: true,
  });
  const byKey = new Map<string, JobEarning>();
  for (const log of logs) {
    const { jobId, epoch, amount } = log.args;
    const key = `${jobId}/${epoch}`;
    const hit = byKey.get(key);
    if (hit) hit.amount += amount;
    else byKey.set(key, { jobId, epoch, amount, blockNumber: log.blockNumber });
  }
  return [...byKey.values()];
}
