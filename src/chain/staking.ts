// A miner's stake: read it, add to it, take it out (unstake, then withdraw
// after the cooldown), the orchestrator's slash, and finding an earlier slash.
import type { Address, Hash } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { nimAbi, stakingAbi } from './abis.ts';
import { formatNim } from './amounts.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { ensureGas, nimBalance } from './token.ts';
import { ChainTxError, sendContractTx, type SentTx } from './tx.ts';

export interface StakePosition {
  staked: bigint;
  unstaking: bigint;
  /** unix seconds when `unstaking` can be withdrawn (0 when nothing is unstaking) */
  releaseAt: number;
}

export async function readStake(client: ChainClient, address: Address): Promise<StakePosition> {
  const staking = { address: client.deployment.staking, abi: stakingAbi } as const;
  const [staked, [unstaking, releaseAt]] = await Promise.all([
    client.public.readContract({ ...staking, functionName: 'stakeOf', args: [address] }),
    client.public.readContract({ ...staking, functionName: 'unstakingOf', args: [address] }),
  ]);
  return { staked, unstaking, releaseAt: Number(releaseAt) };
}

export async function stakingTotals(client: ChainClient): Promise<{ totalStaked: bigint; totalUnstaking: bigint; cooldown: number }> {
  const staking = { address: client.deployment.staking, abi: stakingAbi } as const;
  const [totalStaked, totalUnstaking, cooldown] = await Promise.all([
    client.public.readContract({ ...staking, functionName: 'totalStaked' }),
    client.public.readContract({ ...staking, functionName: 'totalUnstaking' }),
    client.public.readContract({ ...staking, functionName: 'cooldown' }),
  ]);
  return { totalStaked, totalUnstaking, cooldown: Number(cooldown) };
}

/** Stakes `amount` of the signer's free NIM (approve when needed, then stake). */
export async function addStake(client: ChainClient, signer: SigningClient, amount: bigint): Promise<SentTx[]> {
  const me = signer.account.address;
  const free = await nimBalance(client, me);
  if (amount > free) throw new NimbleError('invalid', `amount too large: ${formatNim(amount)} NIM asked, ${formatNim(free)} NIM free in ${me}`);
  await ensureGas(client, me);
  const txs: SentTx[] = [];
  const allowance = await client.public.readContract({
    address: client.deployment.nim,
    abi: nimAbi,
    functionName: 'allowance',
    args: [me, client.deployment.staking],
  });
  if (allowance < amount) {
    txs.push(
      await sendContractTx(client, signer, {
        address: client.deployment.nim,
        abi: nimAbi,
        functionName: 'approve',
        args: [client.deployment.staking, amount],
      }),
    );
  }
  txs.push(await sendContractTx(client, signer, { address: client.deployment.staking, abi: stakingAbi, functionName: 'stake', args: [amount] }));
  return txs;
}

export interface RemoveStakeResult {
  unstaked: bigint;
  /** tokens back in the wallet by this call (0 while the cooldown runs) */
  withdrawn: bigint;
  /** what is still unstaking and when it frees up */
  position: StakePosition;
  txs: SentTx[];
}

/**
 * Unstakes `amount` (all of the stake when undefined), then withdraws
 * everything whose cooldown is over: with the local chain's cooldown of 0 the
 * tokens are free in the wallet when this returns.
 */
export async function removeStake(client: ChainClient, signer: SigningClient, amount?: bigint): Promise<RemoveStakeResult> {
  const me = signer.account.address;
  const before = await readStake(client, me);
  const unstaked = amount ?? before.staked;
  if (unstaked === 0n && before.unstaking === 0n) throw new NimbleError('conflict', `nothing staked in ${me}`);
  if (unstaked > before.staked) {
    throw new NimbleError('invalid', `amount too large: ${formatNim(unstaked)} NIM asked, ${formatNim(before.staked)} NIM staked in ${me}`);
  }
  await ensureGas(client, me);
  const txs: SentTx[] = [];
  if (unstaked > 0n) {
    txs.push(await sendContractTx(client, signer, { address: client.deployment.staking, abi: stakingAbi, functionName: 'unstake', args: [unstaked] }));
  }
  const { withdrawn, tx } = await withdrawIfReady(client, signer);
  if (tx) txs.push(tx);
  return { unstaked, withdrawn, position: await readStake(client, me), txs };
}

/** Withdraws the signer's unstaked tokens when their cooldown is over; otherwise does nothing. */
export async function withdrawIfReady(client: ChainClient, signer: SigningClient): Promise<{ withdrawn: bigint; tx?: SentTx }> {
  const position = await readStake(client, signer.account.address);
  if (position.unstaking === 0n) return { withdrawn: 0n };
  const now = (await client.public.getBlock({ blockTag: 'latest' })).timestamp;
  if (BigInt(position.releaseAt) > now) return { withdrawn: 0n };
  await ensureGas(client, signer.account.address);
  try {
    const tx = await sendContractTx(client, signer, { address: client.deployment.staking, abi: stakingAbi, functionName: 'withdraw' });
    return { withdrawn: position.unstaking, tx };
  } catch (err) {
    if (err instanceof ChainTxError && err.errorName === 'CooldownNotOver') return { withdrawn: 0n };
    throw err;
  }
}

/** Sets the unstake cooldown (seconds); the signer must hold the Staking admin role. */
export async function setCooldown(client: ChainClient, admin: SigningClient, seconds: bigint): Promise<SentTx> {
  return sendContractTx(client, admin, { address: client.deployment.staking, abi: stakingAbi, functionName: 'setCooldown', args: [seconds] });
}

/** Burns `amount` of `account`'s stake; the signer must hold ORCHESTRATOR_ROLE. */
export async function slashStake(client: ChainClient, orchestrator: SigningClient, account: Address, amount: bigint, reason: string): Promise<SentTx> {
  return sendContractTx(client, orchestrator, {
    address: client.deployment.staking,
    abi: stakingAbi,
    functionName: 'slash',
    args: [account, amount, reason],
  });
}

/**
 * The earlier slash of `account` with exactly this `reason` (the first one
 * when there are several), from the Slashed events since deployment; null when
 * there is none. A reason unique to what it punishes lets a caller send a slash once.
 */
export async function findSlash(client: ChainClient, account: Address, reason: string): Promise<{ txHash: Hash; amount: bigint } | null> {
  const logs = await client.public.getContractEvents({
    address: client.deployment.staking,
    abi: stakingAbi,
    eventName: 'Slashed',
    args: { account },
    fromBlock: BigInt(client.deployment.deployBlock),
    toBlock: 'latest',
    strict: true,
  });
  const found = logs.find((l) => l.args.reason === reason);
  return found ? { txHash: found.transactionHash, amount: found.args.amount } : null;
}
