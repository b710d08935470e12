// The orchestrator's chain options (orchestrator start, up): which chain, the
// RPC URL it publishes for it (GET /chain), the key that settles epochs,
// emission, epoch length (and the longest anything owed waits for one) and
// minimum stake.
import { NimbleError } from '../../protocol/errors.ts';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parseEther } from 'viem';
import { signerFor } from '../../chain/client.ts';
import type { LocalNode } from '../../chain/node.ts';
import { localOperatorAccount, openChain } from '../../chain/session.ts';
import { DEFAULT_EPOCH_ROUNDS, DEFAULT_PAY_WITHIN_MS, type ChainOptions } from '../../orchestrator/rewards/epochs.ts';
import { parsePositiveInt, resolveDataDir } from '../common.ts';
import { DEFAULT_PRICING } from '../../jobs/plan-constants.ts';
import { chainRpcOf, unlock, type ChainCommandOptions } from '../chain-options.ts';

export interface OrchestratorChainFlags extends ChainCommandOptions {
  chain?: boolean;
  epochRounds?: string;
  epochMinutes?: string;
  payWithinMinutes?: string;
  emission?: string;
  minStake?: string;
  price?: string;
  publicChainRpc?: string;
}

/** The chain an orchestrator pays on, and the local node it runs there (none with --chain-rpc). */
export interface OrchestratorChain extends ChainOptions {
  node?: LocalNode;
}

export function withOrchestratorChainOptions(cmd: Command): Command {
  return cmd
    .option('--no-chain', 'run without paying miners (no chain at all)')
    .option('--chain-rpc <url>', 'settle on the chain at this RPC URL (addresses from <data-dir>/chain/deployment.json) instead of the local node ($NIMBLE_CHAIN_RPC)')
    .option('--wallet.name <name>', 'with --chain-rpc: the wallet holding the orchestrator role that settles epochs')
    .option('--public-chain-rpc <url>', "the chain's RPC URL GET /chain gives developers' commands and miners, which pay and check on that chain (default: the local node's, on 127.0.0.1, so only on this machine; with --chain-rpc none is published unless given, as that URL may hold a key)")
    .option('--epoch-rounds <n>', 'completed merge rounds of a run per epoch', String(DEFAULT_EPOCH_ROUNDS))
    .option('--epoch-minutes <m>', 'also close an epoch this many minutes after it opened')
    .option('--pay-within-minutes <m>', 'close an epoch once the oldest work or inference charge it owes is this many minutes old (a serving-only network pays too)', String(DEFAULT_PAY_WITHIN_MS / 60_000))
    .option('--emission <nim>', 'NIM paid per epoch, split by score', '100')
    .option('--min-stake <nim>', 'refuse miners with less stake than this (NIM): every identity stakes, so splitting work across identities gains nothing', '10')
    .option('--price <nim>', "NIM per PFLOP of training that developers' jobs pay their miners from their escrows", String(DEFAULT_PRICING.nimPerPetaflop));
}

function parseNimOrZero(flag: string, value: string | undefined): bigint {
  const v = (value ?? '0').trim();
  if (!/^\d+(\.\d{1,18})?$/.test(v)) throw new NimbleError('invalid', `${flag} must be a non-negative number of NIM, got '${value}'`);
  return parseEther(v);
}

/** Opens the chain for an orchestrator (the local node stays up while it runs); null with --no-chain. */
export async function orchestratorChain(flags: OrchestratorChainFlags, log: (line: string) => void): Promise<OrchestratorChain | null> {
  if (flags.chain === false) {
    if (flags.publicChainRpc !== undefined) throw new NimbleError('invalid', '--public-chain-rpc names the chain of a paid network: it goes without --no-chain');
    return null;
  }
  const publicRpcUrl = flags.publicChainRpc === undefined ? undefined : checkedRpcUrl(flags.publicChainRpc);
  const emission = parseNimOrZero('--emission', flags.emission ?? '100');
  const minStake = parseNimOrZero('--min-stake', flags.minStake);
  const nimPerPetaflop = Number(flags.price ?? DEFAULT_PRICING.nimPerPetaflop);
  if (!(nimPerPetaflop >= 0) || !Number.isFinite(nimPerPetaflop)) throw new NimbleError('invalid', `--price must be a non-negative number of NIM per PFLOP, got '${flags.price}'`);
  const epochRounds = parsePositiveInt('--epoch-rounds', flags.epochRounds, DEFAULT_EPOCH_ROUNDS);
  let epochMs: number | undefined;
  if (flags.epochMinutes !== undefined) {
    const m = Number(flags.epochMinutes);
    if (!(m > 0)) throw new NimbleError('invalid', `--epoch-minutes must be a positive number, got '${flags.epochMinutes}'`);
    epochMs = m * 60_000;
  }
  const payWithin = Number(flags.payWithinMinutes ?? DEFAULT_PAY_WITHIN_MS / 60_000);
  if (!(payWithin > 0) || !Number.isFinite(payWithin)) throw new NimbleError('invalid', `--pay-within-minutes must be a positive number, got '${flags.payWithinMinutes}'`);
  const payWithinMs = payWithin * 60_000;
  const rpcUrl = chainRpcOf(flags);
  // the settling key: the local chain's operator, or a wallet on another chain
  const wallet = rpcUrl ? await unlock(flags).catch((err: unknown) => {
    if (!flags['wallet.name']) throw new NimbleError('invalid', '--chain-rpc needs --wallet.name: the wallet holding the orchestrator role');
    throw err;
  }) : null;
  const session = await openChain({ dataDir: resolveDataDir(flags), rpcUrl, persistent: true });
  const signer = wallet ? wallet.sign(session.client) : signerFor(session.client, localOperatorAccount());
  const pause = Number(process.env.NIMBLE_TEST_SETTLE_PAUSE_MS ?? 0); // fault injection for the kill -9 test
  const receiptTimeout = Number(process.env.NIMBLE_TEST_RECEIPT_TIMEOUT_MS ?? 0); // a slash's receipt lost quickly, for the slash-once test
  return {
    client: session.client, signer, emission, nimPerPetaflop, epochRounds, epochMs, payWithinMs, minStake, close: () => session.close(), log, local: !rpcUrl, publicRpcUrl, node: session.node,
    ...(pause > 0 ? { pauseAfterSettleMs: pause } : {}),
    ...(receiptTimeout > 0 ? { receiptTimeoutMs: receiptTimeout } : {}),
  };
}

/** An http(s) URL without credentials, for --public-chain-rpc. */
function checkedRpcUrl(value: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new NimbleError('invalid', `--public-chain-rpc must be an http(s) URL, got '${value}'`);
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.username || url.password) throw new NimbleError('invalid', `--public-chain-rpc must be an http(s) URL without user or password, got '${value}'`);
  return value;
}

/**
 * What became of the local node when the orchestrator stopped, in one line
 * (null: it ran on another chain). Its own node it saved and stopped; a node
 * another live process of the data dir keeps (it was there first) runs on.
 */
export function nodeOnStop(chain: OrchestratorChain | null, dataDir: string): string | null {
  const node = chain?.node;
  if (!node) return null;
  if (node.owned) return `stopped the local chain node (anvil pid ${node.pid}, ${node.rpcUrl}); its state is saved in ${join(dataDir, 'chain', 'state.json')}`;
  return `the local chain node (anvil pid ${node.pid}, ${node.rpcUrl}) keeps running for process ${node.ownerPid}, which started it and stops it when it ends; once that process is gone, nbcli chain stop --data-dir ${dataDir} stops it`;
}
