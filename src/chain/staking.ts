// A miner's stake: read it, add to it, take it out (unstake, then withdraw
// after the cooldown), and the orchestrator's slash.
import type { Address } from 'viem';
import { UserError } from '../cli/common.ts';
import { formatNim } from './amounts.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { abiOf } from './contracts.ts';
import { ensureGas, nimBalance } from './token.ts';
import { ChainTxError, sendContractTx, type SentTx } from './tx.ts';

export interface StakePosition {
  staked: bigint;
  unstaking: bigint;
  /** unix seconds when `unstaking` can be withdrawn (0 when nothing is unstaking) */
  releaseAt: number;
}

export async function readStake(client: ChainClient, address: Address): Promise<StakePosition> {
  const abi = abiOf('Staking');
  const [staked, unstakingOf] = await Promise.all([
    client.public.readContract({ address: client.deployment.staking, abi, functionName: 'stakeOf', args: [address] }) as Promise<bigint>,
    client.public.readContract({ address: client.deployment.staking, abi, functionName: 'unstakingOf', args: [address] }) as Promise<
      readonly [bigint, bigint]
    >,
  ]);
  return { staked, unstaking: unstakingOf[0], releaseAt: Number(unstakingOf[1]) };
}

export async function stakingTotals(client: ChainClient): Promise<{ totalStaked: bigint; totalUnstaking: bigint; cooldown: number }> {
  const abi = abiOf('Staking');
  const read = (functionName: string) =>
    client.public.readContract({ address: client.deployment.staking, abi, functionName }) as Promise<bigint>;
  const [totalStaked, totalUnstaking, cooldown] = await Promise.all([read('totalStaked'), read('totalUnstaking'), read('cooldown')]);
  return { totalStaked, totalUnstaking, cooldown: Number(cooldown) };
}

/** Stakes `amount` of the signer's free NIM (approve when needed, then stake). */
export async function addStake(client: ChainClient, signer: SigningClient, amount: bigint): Promise<SentTx[]> {
  const me = signer.account.address;
  const free = await nimBalance(client, me);
  if (amount > free) throw new UserError(`amount too large: ${formatNim(amount)} NIM asked, ${formatNim(free)} NIM free in ${me}`);
  await ensureGas(client, me);
  const txs: SentTx[] = [];
  const allowance = (await client.public.readContract({
    address: client.deployment.nim,
    abi: abiOf('NIM'),
    functionName: 'allowance',
    args: [me, client.deployment.staking],
  })) as bigint;
  if (allowance < amount) {
    txs.push(
      await sendContractTx(client, signer, {
        address: client.deployment.nim,
        abi: abiOf('NIM'),
        functionName: 'approve',
        args: [client.deployment.staking, amount],
      }),
    );
  }
  txs.push(await sendContractTx(client, signer, { address: client.deployment.staking, abi: abiOf('Staking'), functionName: 'stake', args: [amount] }));
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
  if (unstaked === 0n && before.unstaking === 0n) throw new UserError(`nothing staked in ${me}`);
  if (unstaked > before.staked) {
    throw new UserError(`amount too large: ${formatNim(unstaked)} NIM asked, ${formatNim(before.staked)} NIM staked in ${me}`);
  }
  await ensureGas(client, me);
  const txs: SentTx[] = [];
  if (unstaked > 0n) {
    txs.push(await sendContractTx(client, signer, { address: client.deployment.staking, abi: abiOf('Staking'), functionName: 'unstake', args: [unstaked] }));
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
    const tx = await sendContractTx(client, signer, { address: client.deployment.staking, abi: abiOf('Staking'), functionName: 'withdraw' });
    return { withdrawn: position.unstaking, tx };
  } catch (err) {
    if (err instanceof ChainTxError && err.errorName === 'CooldownNotOver') return { withdrawn: 0n };
    throw err;
  }
}

/** Burns `amount` of `account`'s stake; the signer must hold ORCHESTRATOR_ROLE. */
export async function slashStake(client: ChainClient, orchestrator: SigningClient, account: Address, amount: bigint, reason: string): Promise<SentTx> {
  return sendContractTx(client, orchestrator, {
    address: client.deployment.staking,
    abi: abiOf('Staking'),
    functionName: 'slash',
    args: [account, amount, reason],
  });
}
