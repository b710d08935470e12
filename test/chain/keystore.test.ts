import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { scrypt as nobleScrypt } from '@noble/hashes/scrypt';
import { createDecipheriv } from 'node:crypto';
import { concatBytes, hexToBytes, keccak256 } from 'viem';
import {
  checkPbkdf2Params,
  checkScryptParams,
  decryptKeystore,
  DEFAULT_SCRYPT_N,
  encryptKeystore,
  KDF_BOUNDS,
  LIGHT_SCRYPT,
  WrongPasswordError,
  type KeystoreV3,
  type ScryptParams,
} from '../../src/chain/keystore.ts';
import { isValidMnemonic, listWallets, loadWalletFile, privateKeyFromSecret, saveWallet, unlockWallet } from '../../src/chain/wallets.ts';
import { NimbleError } from '../../src/protocol/errors.ts';

// Test vectors of the Web3 Secret Storage Definition (ethereum.org / geth).
const VECTOR_KEY = '0x7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d';
const PBKDF2_VECTOR = {
  crypto: {
    cipher: 'aes-128-ctr',
    cipherparams: { iv: '6087dab2f9fdbbfaddc31a909735c1e6' },
    ciphertext: '5318b4d5bcd28de64ee5559e671353e16f075ecae9f99c7a79a38af5f869aa46',
    kdf: 'pbkdf2',
    kdfparams: { c: 262144, dklen: 32, prf: 'hmac-sha256', salt: 'ae3cd4e7013836a3df6bd7241b12db061dbe2c6785853cce422d148a624ce0bd' },
    mac: '517ead924a9d0dc3124507e3393d175ce3ff7c1e96529c6c555ce9e51205e9b2',
  },
  id: '3198bc9c-6672-5ab3-d995-4942343ae5b6',
  version: 3,
} as unknown as KeystoreV3;
const SCRYPT_VECTOR = {
  crypto: {
    cipher: 'aes-128-ctr',
    cipherparams: { iv: '83dbcc02d8ccb40e466191a123791e0e' },
    ciphertext: 'd172bf743a674da9cdad04534d56926ef8358534d458fffccd4e6ad2fbde479c',
    kdf: 'scrypt',
    kdfparams: { dklen: 32, n: 262144, p: 8, r: 1, salt: 'ab0c7876052600dd703518d6fc3fe8984592145b591fc8fb5c6d43190334ba19' },
    mac: '2103ac29920d71da29f15d75b4a16dbe95cfd7ff8faea1056c33131d846e3097',
  },
  id: '3198bc9c-6672-5ab3-d995-4942343ae5b6',
  version: 3,
} as unknown as KeystoreV3;

test('decrypts the standard keystore v3 test vector (pbkdf2)', () => {
  assert.equal(decryptKeystore(PBKDF2_VECTOR, 'testpassword'), VECTOR_KEY);
  assert.throws(() => decryptKeystore(PBKDF2_VECTOR, 'testpassword!'), WrongPasswordError);
  // the spec's scrypt vector uses r=1 with n=2^18, which RFC 7914 (and OpenSSL) forbid: a clear error, not a crash
  assert.throws(() => decryptKeystore(SCRYPT_VECTOR, 'testpassword'), /unsupported scrypt parameters n=262144, r=1/);
});

test('files written here open with an independent scrypt implementation (@noble/hashes)', () => {
  const ks = encryptKeystore(VECTOR_KEY, 'pw', { n: 1 << 12 });
  const p = ks.crypto.kdfparams as ScryptParams;
  const dk = nobleScrypt(new TextEncoder().encode('pw'), hexToBytes(`0x${p.salt}`), { N: p.n, r: p.r, p: p.p, dkLen: p.dklen });
  const mac = keccak256(concatBytes([dk.subarray(16, 32), hexToBytes(`0x${ks.crypto.ciphertext}`)]));
  assert.equal(mac.slice(2), ks.crypto.mac);
  const decipher = createDecipheriv('aes-128-ctr', dk.subarray(0, 16), Buffer.from(ks.crypto.cipherparams.iv, 'hex'));
  const key = Buffer.concat([decipher.update(Buffer.from(ks.crypto.ciphertext, 'hex')), decipher.final()]);
  assert.equal(`0x${key.toString('hex')}`, VECTOR_KEY);
});

test('encrypt then decrypt round-trips; a wrong password is caught by the MAC', () => {
  const ks = encryptKeystore(VECTOR_KEY, 'correct horse', { n: 1 << 12 });
  assert.equal(ks.version, 3);
  assert.equal(ks.crypto.kdf, 'scrypt');
  assert.equal(ks.address, '008aeeda4d805471df9b2a5b0f38a0c3bcba786b');
  assert.equal(decryptKeystore(ks, 'correct horse'), VECTOR_KEY);
  assert.throws(() => decryptKeystore(ks, 'correct horse '), WrongPasswordError);
});

test('wallet files: save, list, unlock, no overwrite, mode 0600', () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-wallets-'));
  try {
    const info = saveWallet(dir, 'miner-1', VECTOR_KEY, 'pw');
    assert.equal(info.address, '0x008AeEda4D805471dF9b2A5B0f38A0C3bCBA786b');
    assert.equal(statSync(info.file).mode & 0o777, 0o600);
    const kdfOf = (file: string): Record<string, unknown> => (JSON.parse(readFileSync(file, 'utf8')) as KeystoreV3).crypto.kdfparams;
    assert.deepEqual([kdfOf(info.file).dklen, kdfOf(info.file).n, kdfOf(info.file).r, kdfOf(info.file).p], [32, DEFAULT_SCRYPT_N, 8, 1], 'the standard cost by default');
    // geth's --lightkdf cost when asked (nbcli wallet create --light-kdf); the file opens like any other
    const light = saveWallet(dir, 'throwaway', VECTOR_KEY, 'pw', 'light');
    assert.deepEqual([kdfOf(light.file).n, kdfOf(light.file).r, kdfOf(light.file).p], [LIGHT_SCRYPT.n, LIGHT_SCRYPT.r, LIGHT_SCRYPT.p]);
    assert.equal(unlockWallet(dir, 'throwaway', 'pw').account.address, info.address);
    assert.throws(() => unlockWallet(dir, 'throwaway', 'nope'), /wrong password for wallet 'throwaway'/);
    assert.throws(() => saveWallet(dir, 'miner-1', VECTOR_KEY, 'pw'), /already exists/);
    assert.throws(() => saveWallet(dir, '../evil', VECTOR_KEY, 'pw'), /invalid wallet name/);
    assert.deepEqual(listWallets(dir).map((w) => w.name), ['miner-1', 'throwaway']);
    assert.equal(unlockWallet(dir, 'miner-1', 'pw').account.address, info.address);
    assert.throws(() => unlockWallet(dir, 'miner-1', 'nope'), /wrong password for wallet 'miner-1'/);
    assert.throws(() => unlockWallet(dir, 'ghost', 'pw'), /unknown wallet 'ghost'/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('imports private keys and BIP-39 mnemonics, rejects anything else', () => {
  assert.equal(privateKeyFromSecret(VECTOR_KEY.slice(2).toUpperCase()), VECTOR_KEY);
  const dev = 'test test test test test test test test test test test junk';
  assert.ok(isValidMnemonic(dev));
  // anvil's dev account 0 and 1
  assert.equal(privateKeyFromSecret(dev), '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80');
  assert.equal(privateKeyFromSecret(dev, 1), '0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d');
  assert.throws(() => privateKeyFromSecret('test test test test test test test test test test test test'), /not a valid BIP-39/);
  assert.throws(() => privateKeyFromSecret('0x1234'), /expected a private key/);
  assert.throws(() => privateKeyFromSecret('0'.repeat(64)), /out of range/);
});

/** `ks` with its KDF parameters (or whole crypto section) changed as a hostile file could. */
function tampered(ks: KeystoreV3, kdfparams: Record<string, unknown>, crypto: Record<string, unknown> = {}): KeystoreV3 {
  return { ...ks, crypto: { ...ks.crypto, ...crypto, kdfparams: { ...ks.crypto.kdfparams, ...kdfparams } } } as KeystoreV3;
}

const refused = (pattern: RegExp) => (err: unknown): boolean =>
  err instanceof NimbleError && err.code === 'invalid' && pattern.test(err.message) && /refusing keystore KDF parameters/.test(err.message);

test('KDF parameters too weak or absurd are refused before deriving (each case is fast, or would be refused by nothing)', () => {
  const ks = encryptKeystore(VECTOR_KEY, 'pw', { n: 1 << 12 }); // r = 8, p = 1
  assert.equal(decryptKeystore(ks, 'pw'), VECTOR_KEY, 'the lowest accepted cost opens');
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ n: 1 << 10 }, /scrypt n=1024 is too weak/],
    [{ n: 2 }, /scrypt n=2 is too weak/],
    [{ n: 5000 }, /scrypt n=5000 is not a power of two/],
    [{ n: 2 ** 24, r: 1 }, /scrypt n=16777216 is too costly/],
    [{ r: 17 }, /scrypt r=17 is out of range/],
    [{ r: 0 }, /scrypt r=0 is out of range/],
    [{ p: 17 }, /scrypt p=17 is out of range/],
    [{ dklen: 16 }, /scrypt dklen=16/],
    [{ dklen: 64 }, /scrypt dklen=64/],
    [{ salt: '00'.repeat(8) }, /a salt of 8 bytes/],
    [{ salt: 'zz'.repeat(32) }, /the salt is not hex/],
    [{ salt: '0'.repeat(63) }, /the salt is not hex/],
  ];
  for (const [params, pattern] of cases) {
    assert.throws(() => decryptKeystore(tampered(ks, params), 'pw'), refused(pattern), JSON.stringify(params));
  }
  // a file whose parameters are not numbers at all
  assert.throws(() => decryptKeystore(tampered(ks, { n: '4096' }), 'pw'), /invalid keystore scrypt parameters: \/n/);
});

test('pbkdf2: too few or too many iterations, another prf or dklen are refused', () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ c: 9_999 }, /pbkdf2 c=9999 is too weak/],
    [{ c: 1 }, /pbkdf2 c=1 is too weak/],
    [{ dklen: 16 }, /pbkdf2 dklen=16/],
    [{ salt: 'ab' }, /a salt of 1 bytes/],
  ];
  for (const [params, pattern] of cases) {
    assert.throws(() => decryptKeystore(tampered(PBKDF2_VECTOR, params), 'testpassword'), refused(pattern), JSON.stringify(params));
  }
  assert.throws(() => decryptKeystore(tampered(PBKDF2_VECTOR, { prf: 'hmac-sha512' }), 'testpassword'), /unsupported pbkdf2 prf hmac-sha512/);
  assert.throws(() => decryptKeystore(tampered(PBKDF2_VECTOR, {}, { kdf: 'argon2id' }), 'testpassword'), /unsupported keystore kdf argon2id/);
});

test('the bounds themselves: costly settings are refused without running them, the usual ones pass', () => {
  const salt = '00'.repeat(32);
  const scrypt = (n: number, r: number, p: number): ScryptParams => ({ dklen: 32, salt, n, r, p });
  // each of these would take seconds to minutes, or gigabytes, if it ran
  assert.throws(() => checkScryptParams(scrypt(2 ** 21, 8, 1)), refused(/n=2097152 is too costly/));
  assert.throws(() => checkScryptParams(scrypt(2 ** 20, 8, 1)), refused(/needs 1024 MiB \(at most 256\)/));
  assert.throws(() => checkScryptParams(scrypt(2 ** 18, 16, 1)), refused(/needs 512 MiB/));
  assert.throws(() => checkScryptParams(scrypt(2 ** 16, 8, 16)), refused(/n=65536, r=8, p=16 is too costly/));
  assert.throws(() => checkPbkdf2Params({ dklen: 32, salt, c: 10_000_001, prf: 'hmac-sha256' }), refused(/c=10000001 is too costly/));
  assert.throws(() => checkPbkdf2Params({ dklen: 32, salt, c: 1e12, prf: 'hmac-sha256' }), refused(/too costly/));
  // what this project (saveWallet: DEFAULT_SCRYPT_N, r 8, p 1), geth (standard and light), foundry write
  for (const ok of [scrypt(DEFAULT_SCRYPT_N, 8, 1), scrypt(2 ** 18, 8, 1), scrypt(2 ** 12, 8, 6), scrypt(2 ** 13, 8, 1), scrypt(2 ** 20, 2, 1)]) {
    assert.deepEqual(checkScryptParams(ok), ok);
  }
  assert.equal(checkPbkdf2Params({ dklen: 32, salt, c: 262_144, prf: 'hmac-sha256' }).c, 262_144);
  assert.equal(KDF_BOUNDS.scryptMinN, 4096);
  assert.throws(() => encryptKeystore(VECTOR_KEY, 'pw', { n: 1 << 10 }), refused(/too weak/), 'nor are weak files written');
});

test('wallet files: typed errors, hostile or broken files refused naming the wallet or the file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-wallets-'));
  const code = (c: string, pattern: RegExp) => (err: unknown): boolean => err instanceof NimbleError && err.code === c && pattern.test(err.message);
  try {
    const write = (name: string, value: unknown): void => writeFileSync(join(dir, 'wallets', `${name}.json`), JSON.stringify(value));
    mkdirSync(join(dir, 'wallets'));
    const ks = encryptKeystore(VECTOR_KEY, 'pw', { n: 1 << 12 });
    write('weak', tampered(ks, { n: 1 << 8 }));
    assert.throws(() => unlockWallet(dir, 'weak', 'pw'), code('invalid', /^cannot open wallet 'weak': refusing keystore KDF parameters: scrypt n=256 is too weak/));
    write('upper', { ...ks, crypto: undefined, Crypto: ks.crypto }); // as some tools write it
    assert.equal(unlockWallet(dir, 'upper', 'pw').privateKey, VECTOR_KEY);
    assert.throws(() => unlockWallet(dir, 'upper', 'nope'), code('forbidden', /^wrong password for wallet 'upper'$/));
    write('broken', { ...ks, crypto: { ...ks.crypto, mac: 'xyz' } });
    assert.throws(() => loadWalletFile(dir, 'broken'), code('corrupt', /^invalid wallet file .*broken\.json: \/crypto\/mac /));
    write('noaddr', { ...ks, address: 'nope' });
    assert.throws(() => loadWalletFile(dir, 'noaddr'), code('corrupt', /wallet file .*noaddr\.json has no address/));
    writeFileSync(join(dir, 'wallets', 'garbage.json'), '{');
    assert.throws(() => loadWalletFile(dir, 'garbage'), code('corrupt', /wallet file .*garbage\.json is not valid JSON/));
    assert.throws(() => unlockWallet(dir, 'ghost', 'pw'), code('not_found', /unknown wallet 'ghost'/));
    assert.throws(() => saveWallet(dir, 'weak', VECTOR_KEY, 'pw'), code('conflict', /wallet 'weak' already exists/));
    assert.throws(() => saveWallet(dir, 'other', VECTOR_KEY, ''), code('invalid', /the password must not be empty/));
    assert.deepEqual(listWallets(dir).map((w) => w.name), ['upper', 'weak']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
