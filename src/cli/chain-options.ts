// What the chain commands share: --chain-rpc, --wallet.name, opening the
// chain for one command (the orchestrator's, when the command acts for one:
// docs/chain.md "Whose chain"), unlocking a wallet.
import { NimbleError } from '../protocol/errors.ts';
import type { Command } from 'commander';
import { getAddress, isAddress, type Address } from 'viem';
import type { OrchestratorClient } from '../api/client.ts';
import { signerFor, type ChainClient, type SigningClient } from '../chain/client.ts';
import { deploymentFile, readDeployments } from '../chain/deploy.ts';
import { openClaimedChain } from '../chain/identity.ts';
import { withChain } from '../chain/session.ts';
import { loadWalletFile, unlockWallet, type WalletInfo } from '../chain/wallets.ts';
import { resolveDataDir, type CommonOptions } from './common.ts';
import { readPassword } from './prompt.ts';

export interface ChainCommandOptions extends CommonOptions {
  chainRpc?: string;
  'wallet.name'?: string;
  /** the orchestrator a wallet or stake command acts for (withOrchestratorChain) */
  orchestrator?: string;
}

export function withChainOption(cmd: Command): Command {
  return cmd.option(
    '--chain-rpc <url>',
    "use the chain at this RPC URL instead of the data dir's local node ($NIMBLE_CHAIN_RPC): contract addresses from <data-dir>/chain/deployment.json, or, for a command acting for an orchestrator, the orchestrator's, whose chain it must be",
  );
}

/** --orchestrator for the wallet and stake commands: act on the chain that orchestrator pays on. */
export function withOrchestratorChain(cmd: Command): Command {
  return cmd.option('--orchestrator <url>', "use the chain this orchestrator pays on (its GET /chain, checked on that chain) instead of the data dir's");
}

export function withWalletName(cmd: Command): Command {
  return cmd.option('--wallet.name <name>', 'the wallet to use (a file in <data-dir>/wallets/)');
}

export function chainRpcOf(opts: Pick<ChainCommandOptions, 'chainRpc'>): string | undefined {
  return opts.chainRpc ?? (process.env.NIMBLE_CHAIN_RPC || undefined);
}

/** Whose chain a command acts on. */
export interface ChainVia {
  /** the orchestrator the command acts for: its chain, or none (no orchestrator named: the data dir's chain or --chain-rpc) */
  orchestrator?: OrchestratorClient | string;
  /** a command that only reads: when the orchestrator cannot be reached, or runs unpaid, it reads the command's own chain instead */
  fallback?: boolean;
}

/**
 * Runs `fn` against the chain of these options. A command that acts for an
 * orchestrator runs it on the chain the orchestrator names (GET /chain,
 * signed with its network's key), checked on that chain's RPC (its genesis,
 * its contracts' block and code: src/chain/identity.ts), or on --chain-rpc
 * when given, which must be that same chain: otherwise it stops, before
 * anything is sent, with one line saying which chain each side is on. Without
 * an orchestrator it is --chain-rpc or the data dir's local node (stopped,
 * its state saved, afterwards).
 */
export async function onChain<T>(opts: ChainCommandOptions, fn: (client: ChainClient) => Promise<T>, via: ChainVia = {}): Promise<T> {
  const own = (): Promise<T> => withChain({ dataDir: resolveDataDir(opts), rpcUrl: chainRpcOf(opts) }, fn);
  if (via.orchestrator === undefined) return own();
  const api = typeof via.orchestrator === 'string' ? new (await import('../api/client.ts')).OrchestratorClient(via.orchestrator) : via.orchestrator;
  let claim: Awaited<ReturnType<OrchestratorClient['chain']>>;
  try {
    claim = await api.chain();
  } catch (err) {
    if (via.fallback && err instanceof NimbleError && err.code === 'unreachable') return own();
    throw err;
  }
  // an orchestrator from before GET /chain does not say: the command's own chain, as then
  if (claim === undefined) return own();
  if (claim === null) {
    if (via.fallback) return own();
    throw new NimbleError('conflict', `the orchestrator at ${api.url} runs unpaid (no chain): there is no chain to act on for it`);
  }
  const dataDir = resolveDataDir(opts);
  const client = await openClaimedChain(claim, { rpcUrl: chainRpcOf(opts), who: 'this command', known: readDeployments(dataDir), knownFile: deploymentFile(dataDir) });
  return fn(client);
}

/** Asks for the password and decrypts the wallet: unknown wallet and wrong password end here. */
export async function unlock(opts: ChainCommandOptions): Promise<{ info: WalletInfo; sign: (client: ChainClient) => SigningClient }> {
  const dataDir = resolveDataDir(opts);
  const name = opts['wallet.name'];
  if (!name) throw new NimbleError('invalid', '--wallet.name is required');
  loadWalletFile(dataDir, name); // an unknown wallet fails before the password prompt
  const password = await readPassword(`Password for wallet '${name}': `);
  const { info, account } = unlockWallet(dataDir, name, password);
  return { info, sign: (client) => signerFor(client, account) };
}

export function parseAddress(value: string | undefined, flag: string): Address {
  if (!value) throw new NimbleError('invalid', `${flag} is required (an address like 0x5A0b...)`);
  if (!isAddress(value, { strict: true })) {
    const hint = isAddress(value, { strict: false }) ? ' (its mixed-case checksum is wrong)' : '';
    throw new NimbleError('invalid', `${flag} is not a valid address${hint}: '${value}'`);
  }
  return getAddress(value);
}
