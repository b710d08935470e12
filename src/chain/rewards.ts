// Epoch rewards on chain: the orchestrator's settleEpoch (batched, resumable,
// idempotent), whether an epoch is settled and by which transaction, and a
// miner's reward history.
import { encodeAbiParameters, getAddress, isAddress, keccak256, type Address, type Hash, type Hex } from 'viem';
import { rewardDistributorAbi } from './abis.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { sendContractTx } from './tx.ts';

export interface Reward {
  address: Address;
  /** NIM base units (18 decimals) */
  amount: bigint;
}

export interface EpochStatus {
  epochId: bigint;
  settled: boolean;
  /** batches announced by the first post (0: nothing posted yet) */
  batchCount: number;
  batchesPosted: number;
  total: bigint;
  digest: Hex;
  /** unix seconds; 0 while not settled */
  settledAt: number;
}

export interface SettleOptions {
  /** miners per transaction (default 250: about 7 M gas for new miners) */
  maxBatchSize?: number;
  /** credit rewards as stake (default true: "earned tokens are staked by default") or pay them to wallets */
  asStake?: boolean;
  onBatch?: (info: { batchIndex: number; batchCount: number; miners: number; gasUsed: bigint; hash: Hash }) => void;
}

export interface SettleResult {
  epochId: bigint;
  /** true when the chain already showed the epoch settled: nothing was sent */
  alreadySettled: boolean;
  /** batches sent by this call (fewer than batchCount when it resumed a partial post) */
  batchesSent: number;
  batchCount: number;
  miners: number;
  total: bigint;
  gasUsed: bigint;
  txHashes: Hash[];
  digest: Hex;
}

export const DEFAULT_MAX_BATCH = 250;

export async function readEpoch(client: ChainClient, epochId: bigint): Promise<EpochStatus> {
  const e = await client.public.readContract({
    address: client.deployment.rewardDistributor,
    abi: rewardDistributorAbi,
    functionName: 'epoch',
    args: [epochId],
  });
  return {
    epochId,
    settled: e.settledAt !== 0n,
    batchCount: e.batchCount,
    batchesPosted: e.batchesPosted,
    total: e.total,
    digest: e.digest,
    settledAt: Number(e.settledAt),
  };
}

export async function isEpochSettled(client: ChainClient, epochId: bigint): Promise<boolean> {
  return (await readEpoch(client, epochId)).settled;
}

/**
 * Merges duplicate addresses (first occurrence keeps its place), drops zero
 * amounts, and checks every entry. The result is what gets posted and hashed.
 */
export function normalizeRewards(rewards: readonly Reward[]): Reward[] {
  const byAddress = new Map<Address, Reward>();
  for (const r of rewards) {
    if (!isAddress(r.address, { strict: false })) throw new Error(`invalid miner address '${String(r.address)}'`);
    if (typeof r.amount !== 'bigint' || r.amount < 0n) throw new Error(`invalid reward amount for ${r.address}: ${String(r.amount)}`);
    const address = getAddress(r.address);
    if (address === '0x0000000000000000000000000000000000000000') throw new Error('reward to the zero address');
    const hit = byAddress.get(address);
    if (hit) hit.amount += r.amount;
    else byAddress.set(address, { address, amount: r.amount });
  }
  return [...byAddress.values()].filter((r) => r.amount > 0n);
}

/** keccak256 of the whole normalized list: pins what a multi-batch post is made of. */
export function rewardsDigest(rewards: readonly Reward[]): Hex {
  return keccak256(
    encodeAbiParameters(
      [{ type: 'address[]' }, { type: 'uint256[]' }],
      [rewards.map((r) => r.address), rewards.map((r) => r.amount)],
    ),
  );
}

/** Cuts `n` entries into `batchCount` near-equal consecutive batches: [start, end) pairs. */
export function batchRanges(n: number, batchCount: number): [number, number][] {
  const size = Math.ceil(n / batchCount);
  const out: [number, number][] = [];
  for (let i = 0; i < batchCount; i++) out.push([Math.min(i * size, n), Math.min((i + 1) * size, n)]);
  return out;
}

/**
 * Pays one epoch's rewards. Idempotent: when the chain shows the epoch
 * settled, nothing is sent and `alreadySettled` is true. When an earlier call
 * stopped half-way (crash, lost connection), the remaining batches are posted,
 * provided the rewards are the same list (same digest); a different list for a
 * half-posted epoch is refused. `signer` must hold ORCHESTRATOR_ROLE.
 */
export async function settleEpoch(
  client: ChainClient,
  signer: SigningClient,
  epochId: bigint,
  rewards: readonly Reward[],
  opts: SettleOptions = {},
): Promise<SettleResult> {
  if (epochId < 0n) throw new Error(`invalid epoch id ${epochId}`);
  const list = normalizeRewards(rewards);
  const digest = rewardsDigest(list);
  const total = list.reduce((s, r) => s + r.amount, 0n);
  const status = await readEpoch(client, epochId);
  const base = { epochId, miners: list.length, total, digest, txHashes: [] as Hash[], gasUsed: 0n };
  if (status.settled) {
    return { ...base, total: status.total, digest: status.digest, alreadySettled: true, batchesSent: 0, batchCount: status.batchCount };
  }
  let batchCount: number;
  if (status.batchesPosted > 0) {
    if (status.digest !== digest) {
      throw new Error(`epoch ${epochId} is half-posted with a different reward list (digest ${status.digest}, this list ${digest})`);
    }
    batchCount = status.batchCount;
  } else {
    const maxBatch = opts.maxBatchSize ?? DEFAULT_MAX_BATCH;
    if (!Number.isInteger(maxBatch) || maxBatch < 1) throw new Error(`invalid maxBatchSize ${maxBatch}`);
    batchCount = Math.max(1, Math.ceil(list.length / maxBatch));
  }
  const ranges = batchRanges(list.length, batchCount);
  let gasUsed = 0n;
  const txHashes: Hash[] = [];
  for (let i = status.batchesPosted; i < batchCount; i++) {
    const batch = list.slice(ranges[i][0], ranges[i][1]);
    const tx = await sendContractTx(client, signer, {
      address: client.deployment.rewardDistributor,
      abi: rewardDistributorAbi,
      functionName: 'postRewards',
      args: [epochId, i, batchCount, digest, batch.map((r) => r.address), batch.map((r) => r.amount), opts.asStake ?? true],
    });
    gasUsed += tx.gasUsed;
    txHashes.push(tx.hash);
    opts.onBatch?.({ batchIndex: i, batchCount, miners: batch.length, gasUsed: tx.gasUsed, hash: tx.hash });
  }
  return { ...base, alreadySettled: false, batchesSent: txHashes.length, batchCount, gasUsed, txHashes };
}

export interface EpochReward {
  epochId: bigint;
  amount: bigint;
  blockNumber: bigint;
}

/** Every reward `miner` was paid, per epoch (from the Rewarded events since deployment). */
export async function rewardHistory(client: ChainClient, miner: Address): Promise<EpochReward[]> {
  const logs = await client.public.getContractEvents({
    address: client.deployment.rewardDistributor,
    abi: rewardDistributorAbi,
    eventName: 'Rewarded',
    args: { miner },
    fromBlock: BigInt(client.deployment.deployBlock),
    toBlock: 'latest',
    strict: true,
  });
  const byEpoch = new Map<bigint, EpochReward>();
  for (const log of logs) {
    const { epochId, amount } = log.args;
    const hit = byEpoch.get(epochId);
    if (hit) hit.amount += amount;
    else byEpoch.set(epochId, { epochId, amount, blockNumber: log.blockNumber });
  }
  return [...byEpoch.values()].sort((a, b) => (a.epochId < b.epochId ? -1 : 1));
}

/** The transaction that settled on-chain epoch `epochId` (from its EpochSettled event); null when it is not settled. */
export async function settlementTxOf(client: ChainClient, epochId: bigint): Promise<Hash | null> {
  const logs = await client.public.getContractEvents({
    address: client.deployment.rewardDistributor,
    abi: rewardDistributorAbi,
    eventName: 'EpochSettled',
    args: { epochId },
    fromBlock: BigInt(client.deployment.deployBlock),
    toBlock: 'latest',
  });
  return logs.at(-1)?.transactionHash ?? null;
}
