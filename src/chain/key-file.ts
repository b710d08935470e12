// A plain key file: a secp256k1 key (an Ethereum account) kept in a data dir,
// created on first use. A miner signs with one unless it is given a wallet;
// so does a developer's CLI.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { Type } from '@sinclair/typebox';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { Hex } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';

export interface KeyIdentity {
  privateKey: Hex;
  address: string;
}

const KeyFile = Type.Object({ privateKey: Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' }) });

/** The key in `path`, made (mode 600) when the file does not exist. */
export function loadOrCreateKeyFile(path: string): KeyIdentity {
  if (existsSync(path)) {
    let privateKey: Hex;
    try {
      privateKey = parseJson(KeyFile, readFileSync(path, 'utf8'), `key file ${path}`, 'corrupt').privateKey as Hex;
    } catch (err) {
      throw new NimbleError('corrupt', `${(err as Error).message}; move it away to create a new identity`);
    }
    return { privateKey, address: privateKeyToAccount(privateKey).address };
  }
  const privateKey = generatePrivateKey();
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, JSON.stringify({ privateKey }) + '\n', { mode: 0o600 });
  return { privateKey, address: privateKeyToAccount(privateKey).address };
}
