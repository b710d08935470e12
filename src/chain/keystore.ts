// Ethereum keystore v3 ("Web3 Secret Storage"): a private key encrypted with
// aes-128-ctr under a key derived from a password (scrypt; pbkdf2 files from
// other tools are read too), with a keccak256 MAC. Files written here open in
// geth, ethers, foundry's cast, MetaMask import; theirs open here.
import { createCipheriv, createDecipheriv, pbkdf2Sync, randomBytes, randomUUID, scryptSync, timingSafeEqual } from 'node:crypto';
import { bytesToHex, concatBytes, hexToBytes, keccak256, type Hex } from 'viem';
import { privateKeyToAddress } from 'viem/accounts';

export interface ScryptParams {
  dklen: number;
  salt: string;
  n: number;
  r: number;
  p: number;
}

export interface Pbkdf2Params {
  dklen: number;
  salt: string;
  c: number;
  prf: 'hmac-sha256';
}

export interface KeystoreV3 {
  version: 3;
  id: string;
  /** lowercase hex, no 0x */
  address: string;
  crypto: {
    cipher: 'aes-128-ctr';
    cipherparams: { iv: string };
    ciphertext: string;
    kdf: 'scrypt' | 'pbkdf2';
    kdfparams: ScryptParams | Pbkdf2Params;
    mac: string;
  };
}

export class WrongPasswordError extends Error {
  constructor() {
    super('wrong password');
  }
}

/** ethers' default cost (2^17): about 0.35 s and 128 MiB to open a wallet. */
export const DEFAULT_SCRYPT_N = 1 << 17;

export function encryptKeystore(privateKey: Hex, password: string, opts: { n?: number; r?: number; p?: number } = {}): KeystoreV3 {
  const kdfparams: ScryptParams = {
    dklen: 32,
    salt: randomBytes(32).toString('hex'),
    n: opts.n ?? DEFAULT_SCRYPT_N,
    r: opts.r ?? 8,
    p: opts.p ?? 1,
  };
  const derived = deriveKey('scrypt', kdfparams, password);
  const iv = randomBytes(16);
  const cipher = createCipheriv('aes-128-ctr', derived.subarray(0, 16), iv);
  const ciphertext = Buffer.concat([cipher.update(hexToBytes(privateKey)), cipher.final()]);
  return {
    version: 3,
    id: randomUUID(),
    address: privateKeyToAddress(privateKey).slice(2).toLowerCase(),
    crypto: {
      cipher: 'aes-128-ctr',
      cipherparams: { iv: iv.toString('hex') },
      ciphertext: ciphertext.toString('hex'),
      kdf: 'scrypt',
      kdfparams,
      mac: mac(derived, ciphertext).slice(2),
    },
  };
}

/** The private key, or WrongPasswordError when the MAC does not match. */
export function decryptKeystore(keystore: KeystoreV3, password: string): Hex {
  const c = keystore.crypto ?? (keystore as unknown as { Crypto: KeystoreV3['crypto'] }).Crypto;
  if (keystore.version !== 3 || !c) throw new Error('not a version 3 keystore');
  if (c.cipher !== 'aes-128-ctr') throw new Error(`unsupported keystore cipher ${c.cipher}`);
  const derived = deriveKey(c.kdf, c.kdfparams, password);
  const ciphertext = Buffer.from(c.ciphertext, 'hex');
  const expected = Buffer.from(mac(derived, ciphertext).slice(2), 'hex');
  const actual = Buffer.from(c.mac, 'hex');
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) throw new WrongPasswordError();
  const decipher = createDecipheriv('aes-128-ctr', derived.subarray(0, 16), Buffer.from(c.cipherparams.iv, 'hex'));
  const key = Buffer.concat([decipher.update(ciphertext), decipher.final()]);
  return bytesToHex(key);
}

function deriveKey(kdf: string, params: ScryptParams | Pbkdf2Params, password: string): Buffer {
  const salt = Buffer.from(params.salt, 'hex');
  const secret = Buffer.from(password, 'utf8');
  if (kdf === 'scrypt') {
    const { n, r, p, dklen } = params as ScryptParams;
    if (n >= 2 ** (16 * r)) {
      // RFC 7914 (and OpenSSL, under node:crypto) require N < 2^(128 r / 8)
      throw new Error(`unsupported scrypt parameters n=${n}, r=${r}: n must be below 2^(16 r)`);
    }
    return scryptSync(secret, salt, dklen, { N: n, r, p, maxmem: 128 * n * r * p + 64 * 1024 * 1024 });
  }
  if (kdf === 'pbkdf2') {
    const { c, dklen, prf } = params as Pbkdf2Params;
    if (prf !== 'hmac-sha256') throw new Error(`unsupported pbkdf2 prf ${String(prf)}`);
    return pbkdf2Sync(secret, salt, c, dklen, 'sha256');
  }
  throw new Error(`unsupported keystore kdf ${kdf}`);
}

function mac(derived: Buffer, ciphertext: Buffer): Hex {
  return keccak256(concatBytes([derived.subarray(16, 32), ciphertext]));
}
