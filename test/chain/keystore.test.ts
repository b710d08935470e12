import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { scrypt as nobleScrypt } from '@noble/hashes/scrypt';
import { createDecipheriv } from 'node:crypto';
import { concatBytes, hexToBytes, keccak256 } from 'viem';
import { decryptKeystore, encryptKeystore, WrongPasswordError, type KeystoreV3, type ScryptParams } from '../../src/chain/keystore.ts';
import { isValidMnemonic, listWallets, privateKeyFromSecret, saveWallet, unlockWallet } from '../../src/chain/wallets.ts';

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
    assert.equal((JSON.parse(readFileSync(info.file, 'utf8')) as KeystoreV3).crypto.kdfparams.dklen, 32);
    assert.throws(() => saveWallet(dir, 'miner-1', VECTOR_KEY, 'pw'), /already exists/);
    assert.throws(() => saveWallet(dir, '../evil', VECTOR_KEY, 'pw'), /invalid wallet name/);
    assert.deepEqual(listWallets(dir).map((w) => w.name), ['miner-1']);
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
