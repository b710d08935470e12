// What the chain commands (wallet, stake) share: --chain-rpc, --wallet.name,
// opening the chain for one command, unlocking a wallet.
import { NimbleError } from '../protocol/errors.ts';
import type { Command } from 'commander';
import { getAddress, isAddress, type Address } from 'viem';
import { signerFor, type ChainClient, type SigningClient } from '../chain/client.ts';
import { withChain } from '../chain/session.ts';
import { loadWalletFile, unlockWallet, type WalletInfo } from '../chain/wallets.ts';
import { resolveDataDir, type CommonOptions } from './common.ts';
import { readPassword } from './prompt.ts';

export interface ChainCommandOptions extends CommonOptions {
  chainRpc?: string;
  'wallet.name'?: string;
}

export function withChainOption(cmd: Command): Command {
  return cmd.option(
    '--chain-rpc <url>',
    'use the chain at this RPC URL (addresses from <data-dir>/chain/deployment.json) instead of the local node ($NIMBLE_CHAIN_RPC)',
  );
}

export function withWalletName(cmd: Command): Command {
  return cmd.option('--wallet.name <name>', 'the wallet to use (a file in <data-dir>/wallets/)');
}

export function chainRpcOf(opts: ChainCommandOptions): string | undefined {
  return opts.chainRpc ?? (process.env.NIMBLE_CHAIN_RPC || undefined);
}

/** Runs `fn` against the chain of these options; the local node is stopped (state saved) afterwards. */
export function onChain<T>(opts: ChainCommandOptions, fn: (client: ChainClient) => Promise<T>): Promise<T> {
  return withChain({ dataDir: resolveDataDir(opts), rpcUrl: chainRpcOf(opts) }, fn);
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
