// The key a command signs with: a wallet (--wallet.name, decrypted with
// $NIMBLE_PASSWORD or a prompt), else a plain key file in the data dir made
// on first use.
import { join } from 'node:path';
import type { Hex } from 'viem';
import { loadOrCreateKeyFile } from '../chain/key-file.ts';
import { loadWalletFile, unlockWallet } from '../chain/wallets.ts';
import { resolveDataDir, type CommonOptions } from './common.ts';
import { readPassword } from './prompt.ts';

/** Where a developer's key is kept unless a wallet is named. */
export const DEVELOPER_KEY_FILE = 'developer-key.json';

export interface KeyFlags extends CommonOptions {
  'wallet.name'?: string;
}

/** The wallet's key with --wallet.name, else the key in `<dir>/<file>` (dir: the data dir unless given). */
export async function signingKey(flags: KeyFlags, file: string, dir: string = resolveDataDir(flags)): Promise<Hex> {
  const name = flags['wallet.name'];
  if (!name) return loadOrCreateKeyFile(join(dir, file)).privateKey;
  loadWalletFile(resolveDataDir(flags), name); // an unknown wallet fails before the prompt
  const password = await readPassword(`Password for wallet '${name}': `);
  return unlockWallet(resolveDataDir(flags), name, password).privateKey;
}
