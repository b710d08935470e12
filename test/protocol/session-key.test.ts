// Ed25519 session keys: signatures verify for their key and message only, in
// one encoding only, and a saved key reads back as the same key.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SessionKey, verifySignature } from '../../src/protocol/session-key.ts';
import { signReceipt, signTicket, verifyReceipt, verifyTicket } from '../../src/protocol/evidence.ts';
import { challengeMessage, domainOf, verifyNetwork } from '../../src/protocol/network.ts';

test('a signature verifies for its key and message only', () => {
  const key = SessionKey.generate();
  const other = SessionKey.generate();
  const sig = key.sign('hello');
  assert.match(key.publicKey, /^[A-Za-z0-9_-]{43}$/);
  assert.match(sig, /^[A-Za-z0-9_-]{86}$/);
  assert.equal(verifySignature(key.publicKey, 'hello', sig), true);
  assert.equal(verifySignature(key.publicKey, 'hellO', sig), false);
  assert.equal(verifySignature(other.publicKey, 'hello', sig), false);
  for (const bad of ['', 'x'.repeat(86), sig.slice(1), `${sig}A`]) assert.equal(verifySignature(key.publicKey, 'hello', bad), false);
  assert.equal(verifySignature('not a key', 'hello', sig), false);
  assert.equal(verifySignature('A'.repeat(43), 'hello', sig), false);
});

test('one encoding per signature: flipping the spare bits of the last character fails', () => {
  const key = SessionKey.generate();
  const sig = key.sign('m');
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
  const last = alphabet.indexOf(sig[85]);
  // 64 bytes are 512 bits; 86 characters carry 516: the last character's low 4 bits are spare
  const twin = sig.slice(0, 85) + alphabet[last ^ 1];
  assert.deepEqual(Buffer.from(twin, 'base64url'), Buffer.from(sig, 'base64url'), 'decodes to the same bytes');
  assert.equal(verifySignature(key.publicKey, 'm', twin), false);
});

test('a key saved as PKCS#8 reads back as the same key; a non-Ed25519 key is refused', () => {
  const key = SessionKey.generate();
  const again = SessionKey.fromPkcs8(key.toPkcs8());
  assert.equal(again.publicKey, key.publicKey);
  assert.equal(verifySignature(key.publicKey, 'x', again.sign('x')), true);
  assert.throws(() => SessionKey.fromPkcs8('AAAA'));
});

test('tickets and receipts bind every field and the network', () => {
  const orchestrator = SessionKey.generate();
  const miner = SessionKey.generate();
  const t = { runId: 'run-1', microbatch: 5, attempt: 2, shard: 9, step: 9 };
  const ticket = signTicket(orchestrator, 'nimble:a', t);
  assert.equal(verifyTicket(orchestrator.publicKey, 'nimble:a', t, ticket), true);
  for (const changed of [{ ...t, runId: 'run-2' }, { ...t, microbatch: 6 }, { ...t, attempt: 3 }, { ...t, shard: 8 }, { ...t, step: 8 }]) {
    assert.equal(verifyTicket(orchestrator.publicKey, 'nimble:a', changed, ticket), false);
  }
  assert.equal(verifyTicket(orchestrator.publicKey, 'nimble:b', t, ticket), false);
  assert.equal(verifyTicket(miner.publicKey, 'nimble:a', t, ticket), false);
  const r = { runId: 'run-1', microbatch: 5, attempt: 2, stage: 1, phase: 'forward' as const, frameSha: 'a'.repeat(64) };
  const receipt = signReceipt(miner, 'nimble:a', r);
  assert.equal(verifyReceipt(miner.publicKey, 'nimble:a', r, receipt), true);
  for (const changed of [{ ...r, stage: 0 }, { ...r, phase: 'backward' as const }, { ...r, frameSha: 'b'.repeat(64) }, { ...r, attempt: 1 }]) {
    assert.equal(verifyReceipt(miner.publicKey, 'nimble:a', changed, receipt), false);
  }
});

test("a network is its orchestrator's key: the domain follows from it, proven by a fresh challenge", () => {
  const key = SessionKey.generate();
  const challenge = 'c0ffee'.repeat(6);
  const info = { publicKey: key.publicKey, signature: key.sign(challengeMessage(challenge)) };
  assert.equal(verifyNetwork(info, challenge), domainOf(key.publicKey));
  assert.equal(verifyNetwork(info, 'beef'.repeat(8)), null);
  assert.equal(verifyNetwork({ ...info, publicKey: SessionKey.generate().publicKey }, challenge), null, 'another key cannot reuse the proof');
  assert.notEqual(domainOf(key.publicKey), domainOf(SessionKey.generate().publicKey));
});
