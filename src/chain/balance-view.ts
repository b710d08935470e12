// A wallet's balances as people and pages read them (`nbcli wallet balance`,
// the dashboard's Wallets page): free NIM, staked, unstaking, rewards earned
// per epoch and ether for gas, read from the chain; amounts as exact decimal
// strings.
import { formatEther, type Address } from 'viem';
import { formatNim } from './amounts.ts';
import type { ChainClient } from './client.ts';
import { rewardHistory } from './rewards.ts';
import { readStake } from './staking.ts';
import { nimBalance } from './token.ts';

export interface BalanceView {
  address: Address;
  chainId: number;
  free: string;
  staked: string;
  unstaking: string;
  /** ISO time when `unstaking` can be withdrawn, null when nothing is unstaking */
  unstakingReleaseAt: string | null;
  rewardsTotal: string;
  rewards: { epoch: string; amount: string }[];
  /** ether for gas */
  gas: string;
}

/** `address`'s balances on the chain of `client`. */
export async function readBalanceView(client: ChainClient, address: Address): Promise<BalanceView> {
  const [free, stake, rewards, gas] = await Promise.all([
    nimBalance(client, address),
    readStake(client, address),
    rewardHistory(client, address),
    client.public.getBalance({ address }),
  ]);
  return {
    address,
    chainId: client.chainId,
    free: formatNim(free),
    staked: formatNim(stake.staked),
    unstaking: formatNim(stake.unstaking),
    unstakingReleaseAt: stake.unstaking > 0n ? new Date(stake.releaseAt * 1000).toISOString() : null,
    rewardsTotal: formatNim(rewards.reduce((s, r) => s + r.amount, 0n)),
    rewards: rewards.map((r) => ({ epoch: String(r.epochId), amount: formatNim(r.amount) })),
    gas: formatEther(gas),
  };
}
