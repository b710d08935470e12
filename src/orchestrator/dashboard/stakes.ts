// Each miner's stake as the Network page shows it (docs/dashboard.md): read
// from the Staking contract in the background by a ChainReadCache
// (./chain-reads.ts): a live miner's at most every 30 s.
import { formatEther, type Address } from 'viem';
import type { DashboardMiner } from '../../api/dashboard.ts';
import type { ChainClient } from '../../chain/client.ts';
import { readStake } from '../../chain/staking.ts';
import { CHAIN_READ_EVERY_MS, CHAIN_READS_IN_FLIGHT, ChainReadCache, type ChainReadOptions } from './chain-reads.ts';

/** A miner's stake as the miners section carries it. */
export type MinerStake = NonNullable<DashboardMiner['stake']>;

/** What the miners section reads stakes from (a StakeCache; a fake in tests). */
export interface StakeSource {
  /** The last stake read of `address` (null: none yet); when `live`, a read is queued if the last one is old. */
  get(address: string, live?: boolean): MinerStake | null;
}

/** Reads an address's stake (readStake on the orchestrator's chain). */
export type StakeReader = (address: Address) => Promise<{ staked: bigint; unstaking: bigint }>;

/** A live miner's stake is read again after this long. */
export const STAKE_EVERY_MS = CHAIN_READ_EVERY_MS;
/** Reads of the chain in flight at once. */
export const STAKE_READS_IN_FLIGHT = CHAIN_READS_IN_FLIGHT;
const ADDRESS = /^0x[0-9a-fA-F]{40}$/;

export class StakeCache extends ChainReadCache<MinerStake> implements StakeSource {
  constructor(read: StakeReader, options: ChainReadOptions = {}) {
    super(
      'the stake of',
      async (address) => {
        const { staked, unstaking } = await read(address as Address);
        return { stakedWei: staked.toString(), staked: formatEther(staked), unstakingWei: unstaking.toString(), unstaking: formatEther(unstaking) };
      },
      (address) => ADDRESS.test(address),
      options,
    );
  }

  /** A cache reading the Staking contract of `client` (readStake). */
  static ofChain(client: ChainClient, options: ChainReadOptions = {}): StakeCache {
    return new StakeCache((address) => readStake(client, address), options);
  }
}
