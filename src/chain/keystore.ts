// Ethereum keystore v3 ("Web3 Secret Storage"): a private key encrypted with
// aes-128-ctr under a key derived from a password (scrypt; pbkdf2 files from
// other tools are read too), with a keccak256 MAC. Files written here open in
// geth, ethers, foundry's cast, MetaMask import; theirs open here.
//
// The KDF parameters come from the file, so a hostile file could ask for a
// derivation that takes hours or all the memory, or one so cheap the password
// is not protected. They are checked against KDF_BOUNDS before anything runs.
import { createCipheriv, createDecipheriv, pbkdf2Sync, randomBytes, randomUUID, scryptSync, timingSafeEqual } from 'node:crypto';
import { Type, type Static, type TString } from '@sinclair/typebox';
import { bytesToHex, concatBytes, hexToBytes, keccak256, type Hex } from 'viem';
import { privateKeyToAddress } from 'viem/accounts';
import { NimbleError } from '../protocol/errors.ts';
import { parse } from '../protocol/messages.ts';

const hexOf = (bytes: number): TString => Type.String({ pattern: `^[0-9a-fA-F]{${bytes * 2}}$` });

export const ScryptParams = Type.Object({
  dklen: Type.Integer(),
  salt: Type.String(),
  n: Type.Integer(),
  r: Type.Integer(),
  p: Type.Integer(),
});
export type ScryptParams = Static<typeof ScryptParams>;

export const Pbkdf2Params = Type.Object({
  dklen: Type.Integer(),
  salt: Type.String(),
  c: Type.Integer(),
  prf: Type.String(),
});
export type Pbkdf2Params = Static<typeof Pbkdf2Params>;

/** The shape of a v3 keystore; the KDF parameters are checked by kind when it is opened. */
export const KeystoreV3 = Type.Object({
  version: Type.Literal(3),
  /** a UUID; not read, so not required */
  id: Type.Optional(Type.String()),
  /** hex, no 0x (written lowercase) */
  address: Type.String({ pattern: '^(0x)?[0-9a-fA-F]{40}$' }),
  crypto: Type.Object({
    cipher: Type.String(),
    cipherparams: Type.Object({ iv: hexOf(16) }),
    ciphertext: hexOf(32),
    kdf: Type.String(),
    kdfparams: Type.Object({ dklen: Type.Integer(), salt: Type.String() }),
    mac: hexOf(32),
  }),
});
export type KeystoreV3 = Static<typeof KeystoreV3>;

/**
 * What a keystore's KDF may ask for. The floors refuse files whose password
 * protection is negligible; the ceilings keep one unlock to about a second and
 * at most 256 MiB, whatever the file says. Files written by encryptKeystore
 * (scrypt n = 2^17, r = 8, p = 1: 128 MiB), geth's (n = 2^18, r = 8, p = 1 or
 * n = 2^12, r = 8, p = 6), ethers', foundry's and the spec's pbkdf2 vector
 * (c = 262144) are all within.
 */
export const KDF_BOUNDS = {
  /** scrypt n: a power of two in [2^12, 2^20] */
  scryptMinN: 2 ** 12,
  scryptMaxN: 2 ** 20,
  scryptMaxR: 16,
  scryptMaxP: 16,
  /** scrypt memory, 128 n r bytes: geth's "standard" setting */
  scryptMaxMemory: 256 * 1024 * 1024,
  /** scrypt work, n r p: twice geth's "standard" setting */
  scryptMaxWork: 2 ** 22,
  pbkdf2MinC: 10_000,
  pbkdf2MaxC: 10_000_000,
  /** salt length in bytes */
  minSalt: 16,
  maxSalt: 128,
  /** derived key length in bytes: 16 for AES-128, 16 for the MAC */
  dklen: 32,
} as const;

export class WrongPasswordError extends NimbleError {
  override readonly name = 'WrongPasswordError';

  constructor() {
    super('forbidden', 'wrong password');
  }
}

/** ethers' default cost (2^17): 128 MiB and about 0.9 s on this machine (a median of 904 ms) to open a wallet. */
export const DEFAULT_SCRYPT_N = 1 << 17;

/**
 * geth's `--lightkdf` cost (n = 2^12, r = 8, p = 6): a fifth of the default's
 * work in 4 MiB instead of 128, so a wallet opens in about 50 ms instead of
 * 900 (this machine), and its password is at least 5 times cheaper to guess.
 * For throwaway wallets on a local chain (test wallets, `nbcli up`'s demo
 * miners).
 */
export const LIGHT_SCRYPT = { n: 1 << 12, r: 8, p: 6 } as const;

export function encryptKeystore(privateKey: Hex, password: string, opts: { n?: number; r?: number; p?: number } = {}): KeystoreV3 {
  const kdfparams: ScryptParams = {
    dklen: 32,
    salt: randomBytes(32).toString('hex'),
    n: opts.n ?? DEFAULT_SCRYPT_N,
    r: opts.r ?? 8,
    p: opts.p ?? 1,
  };
  const derived = scrypt(kdfparams, password);
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

/**
 * `value` (a parsed keystore file) checked against the v3 shape; "Crypto",
 * which some tools write, is read as "crypto". A NimbleError 'corrupt' naming
 * `what` when it does not match.
 */
export function parseKeystore(value: unknown, what: string): KeystoreV3 {
  const normalized =
    typeof value === 'object' && value !== null && !('crypto' in value) && 'Crypto' in value ? { ...value, crypto: value.Crypto } : value;
  return parse(KeystoreV3, normalized, what, 'corrupt');
}

/** The private key, or WrongPasswordError when the MAC does not match. Refuses KDF parameters outside KDF_BOUNDS before deriving. */
export function decryptKeystore(keystore: KeystoreV3, password: string): Hex {
  const c = keystore.crypto;
  if (keystore.version !== 3 || !c) throw new NimbleError('invalid', 'not a version 3 keystore');
  if (c.cipher !== 'aes-128-ctr') throw new NimbleError('invalid', `unsupported keystore cipher ${c.cipher}`);
  const derived = deriveKey(c.kdf, c.kdfparams, password);
  const ciphertext = Buffer.from(c.ciphertext, 'hex');
  const expected = Buffer.from(mac(derived, ciphertext).slice(2), 'hex');
  const actual = Buffer.from(c.mac, 'hex');
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) throw new WrongPasswordError();
  const decipher = createDecipheriv('aes-128-ctr', derived.subarray(0, 16), Buffer.from(c.cipherparams.iv, 'hex'));
  const key = Buffer.concat([decipher.update(ciphertext), decipher.final()]);
  return bytesToHex(key);
}

function deriveKey(kdf: string, kdfparams: unknown, password: string): Buffer {
  if (kdf === 'scrypt') return scrypt(parse(ScryptParams, kdfparams, 'keystore scrypt parameters'), password);
  if (kdf === 'pbkdf2') return pbkdf2(parse(Pbkdf2Params, kdfparams, 'keystore pbkdf2 parameters'), password);
  throw new NimbleError('invalid', `unsupported keystore kdf ${kdf}`);
}

function scrypt(params: ScryptParams, password: string): Buffer {
  const { n, r, p, dklen } = checkScryptParams(params);
  return scryptSync(Buffer.from(password, 'utf8'), checkSalt(params.salt), dklen, { N: n, r, p, maxmem: 128 * n * r * p + 64 * 1024 * 1024 });
}

function pbkdf2(params: Pbkdf2Params, password: string): Buffer {
  const { c, dklen } = checkPbkdf2Params(params);
  return pbkdf2Sync(Buffer.from(password, 'utf8'), checkSalt(params.salt), c, dklen, 'sha256');
}

/** `params` when within KDF_BOUNDS (and RFC 7914); otherwise a NimbleError 'invalid' saying which bound. */
export function checkScryptParams(params: ScryptParams): ScryptParams {
  const { n, r, p, dklen } = params;
  const b = KDF_BOUNDS;
  if (n < 2 || !Number.isInteger(Math.log2(n))) refuse(`scrypt n=${n} is not a power of two`);
  if (n < b.scryptMinN) refuse(`scrypt n=${n} is too weak (at least 2^12 = ${b.scryptMinN})`);
  if (n > b.scryptMaxN) refuse(`scrypt n=${n} is too costly (at most 2^20 = ${b.scryptMaxN})`);
  if (r < 1 || r > b.scryptMaxR) refuse(`scrypt r=${r} is out of range (1 to ${b.scryptMaxR})`);
  if (p < 1 || p > b.scryptMaxP) refuse(`scrypt p=${p} is out of range (1 to ${b.scryptMaxP})`);
  if (128 * n * r > b.scryptMaxMemory) refuse(`scrypt n=${n}, r=${r} needs ${(128 * n * r) / 2 ** 20} MiB (at most ${b.scryptMaxMemory / 2 ** 20})`);
  if (n * r * p > b.scryptMaxWork) refuse(`scrypt n=${n}, r=${r}, p=${p} is too costly (n r p at most 2^22)`);
  if (dklen !== b.dklen) refuse(`scrypt dklen=${dklen} (must be ${b.dklen})`);
  if (n >= 2 ** (16 * r)) {
    // RFC 7914 (and OpenSSL, under node:crypto) require N < 2^(128 r / 8)
    throw new NimbleError('invalid', `unsupported scrypt parameters n=${n}, r=${r}: n must be below 2^(16 r)`);
  }
  return params;
}

/** `params` when within KDF_BOUNDS; otherwise a NimbleError 'invalid' saying which bound. */
export function checkPbkdf2Params(params: Pbkdf2Params): Pbkdf2Params {
  const { c, dklen, prf } = params;
  const b = KDF_BOUNDS;
  if (prf !== 'hmac-sha256') throw new NimbleError('invalid', `unsupported pbkdf2 prf ${prf}`);
  if (c < b.pbkdf2MinC) refuse(`pbkdf2 c=${c} is too weak (at least ${b.pbkdf2MinC})`);
  if (c > b.pbkdf2MaxC) refuse(`pbkdf2 c=${c} is too costly (at most ${b.pbkdf2MaxC})`);
  if (dklen !== b.dklen) refuse(`pbkdf2 dklen=${dklen} (must be ${b.dklen})`);
  return params;
}

/** The salt's bytes when it is hex of KDF_BOUNDS.minSalt to maxSalt bytes. */
function checkSalt(salt: string): Buffer {
  if (!/^([0-9a-fA-F]{2})*$/.test(salt)) refuse('the salt is not hex');
  const bytes = salt.length / 2;
  if (bytes < KDF_BOUNDS.minSalt || bytes > KDF_BOUNDS.maxSalt) {
    refuse(`a salt of ${bytes} bytes (${KDF_BOUNDS.minSalt} to ${KDF_BOUNDS.maxSalt})`);
  }
  return Buffer.from(salt, 'hex');
}

function refuse(why: string): never {
  throw new NimbleError('invalid', `refusing keystore KDF parameters: ${why}`);
}

function mac(derived: Buffer, ciphertext: Buffer): Hex {
  return keccak256(concatBytes([derived.subarray(16, 32), ciphertext]));
}
