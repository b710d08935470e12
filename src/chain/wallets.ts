// Named wallets of a data dir: <data-dir>/wallets/NAME.json, one keystore v3
// file each (mode 0600).
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { getAddress, type Address, type Hex } from 'viem';
import { english, mnemonicToAccount, privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts';
import { NimbleError } from '../protocol/errors.ts';
import { decryptKeystore, encryptKeystore, LIGHT_SCRYPT, parseKeystore, WrongPasswordError, type KeystoreV3 } from './keystore.ts';

export interface WalletInfo {
  name: string;
  address: Address;
  file: string;
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export function walletsDir(dataDir: string): string {
  return join(dataDir, 'wallets');
}

export function checkWalletName(name: string | undefined): string {
  if (!name) throw new NimbleError('invalid', '--wallet.name is required');
  if (!NAME.test(name)) {
    throw new NimbleError('invalid', `invalid wallet name '${name}': use letters, digits, '.', '_' or '-' (at most 64, not starting with a symbol)`);
  }
  return name;
}

function walletFile(dataDir: string, name: string): string {
  return join(walletsDir(dataDir), `${checkWalletName(name)}.json`);
}

/** How costly the wallet's key derivation is: `standard` (scrypt n = 2^17) or `light` (geth's --lightkdf: `LIGHT_SCRYPT`). */
export type WalletKdf = 'standard' | 'light';

/** Encrypts `privateKey` under `password` and stores it as NAME; refuses to overwrite. */
export function saveWallet(dataDir: string, name: string, privateKey: Hex, password: string, kdf: WalletKdf = 'standard'): WalletInfo {
  const file = walletFile(dataDir, name);
  if (existsSync(file)) throw new NimbleError('conflict', `wallet '${name}' already exists (${file})`);
  if (password.length === 0) throw new NimbleError('invalid', 'the password must not be empty');
  const keystore = encryptKeystore(privateKey, password, kdf === 'light' ? LIGHT_SCRYPT : {});
  mkdirSync(walletsDir(dataDir), { recursive: true, mode: 0o700 });
  writeFileSync(file, JSON.stringify(keystore, null, 2) + '\n', { mode: 0o600, flag: 'wx' });
  return { name, address: getAddress(`0x${keystore.address}`), file };
}

export function loadWalletFile(dataDir: string, name: string): { info: WalletInfo; keystore: KeystoreV3 } {
  const file = walletFile(dataDir, name);
  if (!existsSync(file)) {
    throw new NimbleError('not_found', `unknown wallet '${name}': no ${file} (see \`nbcli wallet list\`)`);
  }
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    throw new NimbleError('corrupt', `wallet file ${file} is not valid JSON`);
  }
  if (!hasAddress(value)) throw new NimbleError('corrupt', `wallet file ${file} has no address`);
  const keystore = parseKeystore(value, `wallet file ${file}`);
  return { info: { name, address: getAddress(`0x${keystore.address.replace(/^0x/, '')}`), file }, keystore };
}

function hasAddress(value: unknown): boolean {
  return (
    typeof value === 'object' && value !== null && 'address' in value && typeof value.address === 'string' && /^(0x)?[0-9a-fA-F]{40}$/.test(value.address)
  );
}

/** The wallet's signing account; a NimbleError 'forbidden' for a wrong password. */
export function unlockWallet(dataDir: string, name: string, password: string): { info: WalletInfo; account: PrivateKeyAccount; privateKey: Hex } {
  const { info, keystore } = loadWalletFile(dataDir, name);
  let key: Hex;
  try {
    key = decryptKeystore(keystore, password);
  } catch (err) {
    if (err instanceof WrongPasswordError) throw new NimbleError('forbidden', `wrong password for wallet '${name}'`);
    const message = err instanceof Error ? err.message : String(err);
    throw new NimbleError(err instanceof NimbleError ? err.code : 'invalid', `cannot open wallet '${name}': ${message}`);
  }
  const account = privateKeyToAccount(key);
  if (account.address !== info.address) throw new NimbleError('corrupt', `wallet file ${info.file} is corrupt: its key does not match its address`);
  return { info, account, privateKey: key };
}

export function listWallets(dataDir: string): WalletInfo[] {
  const dir = walletsDir(dataDir);
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json') && NAME.test(f.slice(0, -5)))
    .sort()
    .flatMap((f) => {
      try {
        return [loadWalletFile(dataDir, f.slice(0, -5)).info];
      } catch {
        return [];
      }
    });
}

/**
 * A private key from what a user pastes to import: 64 hex digits (0x optional)
 * or a BIP-39 mnemonic (account `index` of m/44'/60'/0'/0/index).
 */
export function privateKeyFromSecret(secret: string, index = 0): Hex {
  const s = secret.trim();
  const hex = s.startsWith('0x') || s.startsWith('0X') ? s.slice(2) : s;
  if (/^[0-9a-fA-F]{64}$/.test(hex)) {
    const key = `0x${hex.toLowerCase()}` as Hex;
    try {
      privateKeyToAccount(key);
    } catch {
      throw new NimbleError('invalid', 'that private key is out of range');
    }
    return key;
  }
  const words = s.split(/\s+/);
  if (words.length >= 12 && words.length <= 24 && words.length % 3 === 0) {
    const phrase = words.join(' ').toLowerCase();
    if (!isValidMnemonic(phrase)) throw new NimbleError('invalid', 'that is not a valid BIP-39 mnemonic (check the words and their order)');
    const account = mnemonicToAccount(phrase, { addressIndex: index });
    const key = account.getHdKey().privateKey;
    if (!key) throw new NimbleError('invalid', 'could not derive a key from that mnemonic');
    return `0x${Buffer.from(key).toString('hex')}` as Hex;
  }
  throw new NimbleError('invalid', 'expected a private key (64 hex digits) or a 12 to 24 word mnemonic');
}

/** BIP-39 check of an English mnemonic: every word in the list, checksum bits right. */
export function isValidMnemonic(phrase: string): boolean {
  const words = phrase.split(' ');
  if (words.length < 12 || words.length > 24 || words.length % 3 !== 0) return false;
  let bits = '';
  for (const w of words) {
    const i = english.indexOf(w);
    if (i < 0) return false;
    bits += i.toString(2).padStart(11, '0');
  }
  const checksumBits = bits.length / 33;
  const entropyBits = bits.slice(0, bits.length - checksumBits);
  const entropy = Buffer.from(entropyBits.match(/.{8}/g)!.map((b) => parseInt(b, 2)));
  const hash = createHash('sha256').update(entropy).digest();
  const expected = [...hash].map((b) => b.toString(2).padStart(8, '0')).join('').slice(0, checksumBits);
  return expected === bits.slice(bits.length - checksumBits);
}
