// A miner's stake: read it, add to it, take it out (unstake, then withdraw
// after the cooldown), the orchestrator's slash (once per offence: the
// contract refuses an offence id its caller slashed already), and finding an
// earlier slash.
import { BaseError, keccak256, parseAbi, stringToBytes, type Address, type Hash, type Hex } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { nimAbi, stakingAbi } from './abis.ts';
import { formatNim } from './amounts.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { ensureGas, nimBalance } from './token.ts';
import { ChainTxError, sendContractTx, type SendOptions, type SentTx } from './tx.ts';

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

/** The offence id a slash names on chain: keccak256 of its reason, which is unique to the offence. */
export function offenceIdOf(reason: string): Hex {
  return keccak256(stringToBytes(reason));
}

/**
 * Burns `amount` of `account`'s stake for one offence (`offence`, by default
 * the id of `reason`); the signer must hold ORCHESTRATOR_ROLE. The contract
 * refuses an offence the signer slashed already (`OffenceAlreadySlashed`).
 */
export async function slashStake(
  client: ChainClient, orchestrator: SigningClient, account: Address, amount: bigint, reason: string, options: SendOptions & { offence?: Hex } = {},
): Promise<SentTx> {
  if (!(await stakingHasOffences(client))) {
    return sendContractTx(client, orchestrator, { address: client.deployment.staking, abi: LEGACY_STAKING_ABI, functionName: 'slash', args: [account, amount, reason] }, options);
  }
  return sendContractTx(
    client,
    orchestrator,
    { address: client.deployment.staking, abi: stakingAbi, functionName: 'slash', args: [account, amount, options.offence ?? offenceIdOf(reason), reason] },
    options,
  );
}

/** Whether `orchestrator` slashed for `offence` already, as the chain records it (false on a Staking that predates offence ids). */
export async function isOffenceSlashed(client: ChainClient, orchestrator: Address, offence: Hex): Promise<boolean> {
  if (!(await stakingHasOffences(client))) return false;
  return client.public.readContract({ address: client.deployment.staking, abi: stakingAbi, functionName: 'offenceSlashed', args: [orchestrator, offence] });
}

/** `slash(account, amount, reason)` of a Staking deployed before offence ids (a local chain's state kept from then). */
const LEGACY_STAKING_ABI = parseAbi(['function slash(address account, uint256 amount, string reason)']);
const offenceSupport = new Map<string, Promise<boolean>>();

/**
 * Whether the deployment's Staking records offences (`offenceSlashed`): a
 * contract deployed before it has no such function, and its slash takes no
 * offence id. Read once per contract address.
 */
export function stakingHasOffences(client: ChainClient): Promise<boolean> {
  const key = `${client.chainId} ${client.deployment.staking.toLowerCase()}`;
  let known = offenceSupport.get(key);
  if (!known) {
    known = client.public
      .readContract({ address: client.deployment.staking, abi: stakingAbi, functionName: 'offenceSlashed', args: [client.deployment.staking, `0x${'0'.repeat(64)}`] })
      .then(() => true)
      .catch((err: unknown) => {
        offenceSupport.delete(key); // an unreachable node is asked again next time
        if (err instanceof BaseError && /returned no data|reverted/i.test(err.message)) {
          offenceSupport.set(key, Promise.resolve(false));
          return false;
        }
        throw err;
      });
    offenceSupport.set(key, known);
  }
  return known;
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
