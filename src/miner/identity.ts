// A miner's identity: a secp256k1 key (an Ethereum account) kept in its data
// dir, created on first start.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { Hex } from 'viem';

export interface Identity {
  privateKey: Hex;
  address: string;
}

const KEY_RE = /^0x[0-9a-fA-F]{64}$/;

export function loadOrCreateIdentity(dataDir: string): Identity {
  const path = join(dataDir, 'miner-key.json');
  if (existsSync(path)) {
    let key: unknown;
    try {
      key = (JSON.parse(readFileSync(path, 'utf8')) as { privateKey?: unknown }).privateKey;
    } catch {
      throw new Error(`${path} is not valid JSON; move it away to create a new identity`);
    }
    if (typeof key !== 'string' || !KEY_RE.test(key)) throw new Error(`${path} holds no valid private key`);
    return { privateKey: key as Hex, address: privateKeyToAccount(key as Hex).address };
  }
  const privateKey = generatePrivateKey();
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, JSON.stringify({ privateKey }) + '\n', { mode: 0o600 });
  return { privateKey, address: privateKeyToAccount(privateKey).address };
}
