// Reading the chain's own record in tests: what a contract emitted, not what
// the orchestrator says it sent.
import { parseAbiItem, type Address } from 'viem';
import type { ChainClient } from '../../src/chain/client.ts';

const SLASHED = parseAbiItem('event Slashed(address indexed account, uint256 amount, string reason)');

/** Every Slashed event of the staking contract (of `account` only, when given), from the first block. */
export async function slashedEvents(client: ChainClient, account?: Address) {
  return client.public.getLogs({ address: client.deployment.staking, event: SLASHED, args: account ? { account } : undefined, fromBlock: 0n, toBlock: 'latest' });
}
