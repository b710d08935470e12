import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AUTH_HEADERS, RequestSigner, RequestVerifier, bodySha256, canonicalMessage, type AuthHeaders } from '../../src/protocol/signing.ts';
import { AuthError, type AuthErrorCode } from '../../src/protocol/errors.ts';
import { NonceCache } from '../../src/protocol/nonce-cache.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';

// anvil's well-known dev accounts #0 and #1
const KEY0 = '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80';
const ADDR0 = '0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266';
const KEY1 = '0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d';

async function rejects(p: Promise<unknown>, code: AuthErrorCode): Promise<AuthError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  assert.ok(e instanceof AuthError, `expected AuthError ${code}, got ${String(e)}`);
  assert.equal(e.code, code, e.message);
  return e;
}

const body = new TextEncoder().encode('{"stage":1,"microbatch":42}');

test('a signed request verifies to the signer address, with Node-style and fetch-style headers', async () => {
  const signer = new RequestSigner(KEY0);
  assert.equal(signer.address, ADDR0);
  const verifier = new RequestVerifier();
  const headers = await signer.sign('post', '/v1/work?stage=1', body);
  assert.match(headers[AUTH_HEADERS.nonce], /^[0-9a-f]{32}$/);
  assert.equal(await verifier.verify({ method: 'POST', path: '/v1/work?stage=1', headers, body }), ADDR0);
  const h2 = await signer.sign('GET', '/v1/plan');
  assert.equal(await verifier.verify({ method: 'GET', path: '/v1/plan', headers: new Headers(h2) }), ADDR0);
  // the headers alone verify (before the body is read); the body is checked against the signed hash after
  const h3 = await signer.sign('PUT', '/v1/blob', body);
  assert.equal(h3[AUTH_HEADERS.contentSha256], bodySha256(body));
  const v = await verifier.verifyHeaders({ method: 'PUT', path: '/v1/blob', headers: h3 });
  assert.deepEqual(v, { signer: ADDR0, scheme: 'wallet', bodySha256: bodySha256(body) });
  verifier.checkBody(v, body);
  assert.throws(() => verifier.checkBody(v, new Uint8Array(3)), (e: unknown) => e instanceof AuthError && e.code === 'bad_signature');
  assert.equal(verifier.nonceCount, 3);
});

test('tampered method, path, body, timestamp, address or domain fails with bad_signature', async () => {
  const signer = new RequestSigner(KEY0);
  const verifier = new RequestVerifier();
  const h = await signer.sign('POST', '/v1/work', body);
  await rejects(verifier.verify({ method: 'PUT', path: '/v1/work', headers: h, body }), 'bad_signature');
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work?x=1', headers: h, body }), 'bad_signature');
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: { ...h, [AUTH_HEADERS.contentSha256]: bodySha256('x') }, body: 'x' }), 'bad_signature');
  // another body under genuine headers: the headers verify (their nonce is spent), the body does not match
  const h2 = await signer.sign('POST', '/v1/work', body);
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: h2, body: new TextEncoder().encode('{"stage":2,"microbatch":42}') }), 'bad_signature');
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: await signer.sign('POST', '/v1/work', body) }), 'bad_signature');
  const ts = { ...h, [AUTH_HEADERS.timestamp]: String(Number(h[AUTH_HEADERS.timestamp]) + 1) };
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: ts, body }), 'bad_signature');
  const other = new RequestSigner(KEY1);
  const claimed = { ...h, [AUTH_HEADERS.address]: other.address };
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: claimed, body }), 'bad_signature');
  const sigFlip = h[AUTH_HEADERS.signature].slice(0, 10) + (h[AUTH_HEADERS.signature][10] === 'a' ? 'b' : 'a') + h[AUTH_HEADERS.signature].slice(11);
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: { ...h, [AUTH_HEADERS.signature]: sigFlip }, body }), 'bad_signature');
  const foreign = await new RequestSigner(KEY0, { domain: 'other-network' }).sign('POST', '/v1/work', body);
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: foreign, body }), 'bad_signature');
  // failed attempts do not burn the nonce: the genuine request still goes through once
  assert.equal(await verifier.verify({ method: 'POST', path: '/v1/work', headers: h, body }), ADDR0);
});

test('missing and malformed headers', async () => {
  const verifier = new RequestVerifier();
  const h = await new RequestSigner(KEY0).sign('GET', '/v1/x');
  for (const name of Object.values(AUTH_HEADERS)) {
    const partial: Record<string, string> = { ...h };
    delete partial[name];
    const e = await rejects(verifier.verify({ method: 'GET', path: '/v1/x', headers: partial }), 'missing');
    assert.match(e.message, new RegExp(name));
  }
  const bad: [string, string][] = [
    [AUTH_HEADERS.address, '0x1234'],
    [AUTH_HEADERS.timestamp, '12e5'],
    [AUTH_HEADERS.nonce, 'NOT-HEX-NONCE-VALUE'],
    [AUTH_HEADERS.signature, '0xdeadbeef'],
    [AUTH_HEADERS.signature, 'ed25519.short'],
    [AUTH_HEADERS.contentSha256, 'ABC'],
  ];
  for (const [name, value] of bad) {
    await rejects(verifier.verify({ method: 'GET', path: '/v1/x', headers: { ...h, [name]: value } }), 'bad_signature');
  }
  await rejects(verifier.verify({ method: 'GET', path: '/v1/x', headers: { ...h, [AUTH_HEADERS.nonce]: [h[AUTH_HEADERS.nonce], 'ab'] } }), 'bad_signature');
  await rejects(verifier.verify({ method: 'GET', path: '/v1/x\nPOST', headers: h }), 'bad_signature');
});

test('stale and future timestamps fail, within the window they pass', async () => {
  let now = 1_700_000_000_000;
  const verifier = new RequestVerifier({ windowMs: 30_000, now: () => now });
  const signer = new RequestSigner(KEY0, { now: () => now });
  const h = await signer.sign('GET', '/v1/status');
  now += 29_000;
  assert.equal(await verifier.verify({ method: 'GET', path: '/v1/status', headers: h }), ADDR0);
  const h2 = await signer.sign('GET', '/v1/status');
  now += 31_000;
  const e = await rejects(verifier.verify({ method: 'GET', path: '/v1/status', headers: h2 }), 'stale');
  assert.equal(e.status, 401);
  now -= 62_000; // the request now looks 31 s in the future
  await rejects(verifier.verify({ method: 'GET', path: '/v1/status', headers: h2 }), 'stale');
});

test('a replayed nonce fails; the same nonce from another address does not collide', async () => {
  const verifier = new RequestVerifier();
  const h = await new RequestSigner(KEY0).sign('POST', '/v1/work', body);
  await verifier.verify({ method: 'POST', path: '/v1/work', headers: h, body });
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: h, body }), 'replayed');
  // another miner that happens to pick the same nonce is fine
  const signer1 = new RequestSigner(KEY1);
  const h1 = await signer1.sign('POST', '/v1/work', body);
  const message = canonicalMessage({ domain: 'nimble', method: 'POST', path: '/v1/work', bodySha256: bodySha256(body), timestamp: Number(h[AUTH_HEADERS.timestamp]), nonce: h[AUTH_HEADERS.nonce] });
  const { privateKeyToAccount } = await import('viem/accounts');
  const sig = await privateKeyToAccount(KEY1).signMessage({ message });
  const same: AuthHeaders = { ...h1, [AUTH_HEADERS.timestamp]: h[AUTH_HEADERS.timestamp], [AUTH_HEADERS.nonce]: h[AUTH_HEADERS.nonce], [AUTH_HEADERS.signature]: sig };
  assert.equal(await verifier.verify({ method: 'POST', path: '/v1/work', headers: same, body }), signer1.address);
});

test('nonce cache is bounded: expires with the window and refuses when full of live nonces', async () => {
  let now = 1_000_000;
  const verifier = new RequestVerifier({ windowMs: 1000, maxNonces: 3, now: () => now });
  const signer = new RequestSigner(KEY0, { now: () => now });
  for (let i = 0; i < 3; i++) await verifier.verify({ method: 'GET', path: '/p', headers: await signer.sign('GET', '/p') });
  const e = await rejects(verifier.verify({ method: 'GET', path: '/p', headers: await signer.sign('GET', '/p') }), 'overloaded');
  assert.equal(e.status, 503);
  now += 1001; // the three earlier nonces expire with their window
  await verifier.verify({ method: 'GET', path: '/p', headers: await signer.sign('GET', '/p') });
  assert.equal(verifier.nonceCount, 1);

  const cache = new NonceCache(10, 100);
  assert.equal(cache.add('s', 'a', 200, 0), 'ok');
  assert.equal(cache.add('s', 'a', 200, 150), 'seen');
  assert.equal(cache.add('s', 'a', 400, 201), 'ok', 'an expired entry no longer blocks');
});

test("one sender's flood fills its own share of the nonce cache, not everyone's", async () => {
  const verifier = new RequestVerifier({ maxNonces: 100, maxNoncesPerSender: 3 });
  const loud = new RequestSigner(KEY0);
  const quiet = new RequestSigner(KEY1);
  for (let i = 0; i < 3; i++) await verifier.verify({ method: 'GET', path: '/p', headers: await loud.sign('GET', '/p') });
  const e = await rejects(verifier.verify({ method: 'GET', path: '/p', headers: await loud.sign('GET', '/p') }), 'rate_limited');
  assert.equal(e.status, 429);
  assert.match(e.message, new RegExp(loud.address));
  assert.equal(await verifier.verify({ method: 'GET', path: '/p', headers: await quiet.sign('GET', '/p') }), quiet.address);
  const cache = new NonceCache(10, 100, 2);
  assert.deepEqual([cache.add('x', '1', 500, 0), cache.add('x', '2', 500, 0), cache.add('x', '3', 500, 0), cache.add('y', '1', 500, 0)], ['ok', 'ok', 'sender_full', 'ok']);
  assert.equal(cache.add('x', '4', 900, 501), 'ok', 'expired nonces give the quota back');
  // a sender with a quota of its own (a miner's orchestrator) goes past the default, and only to its own
  const own = new RequestVerifier({ maxNonces: 100, maxNoncesPerSender: 3, quotaOf: (a) => (a === loud.address ? 5 : undefined) });
  for (let i = 0; i < 5; i++) await own.verify({ method: 'GET', path: '/p', headers: await loud.sign('GET', '/p') });
  await rejects(own.verify({ method: 'GET', path: '/p', headers: await loud.sign('GET', '/p') }), 'rate_limited');
  for (let i = 0; i < 3; i++) await own.verify({ method: 'GET', path: '/p', headers: await quiet.sign('GET', '/p') });
  await rejects(own.verify({ method: 'GET', path: '/p', headers: await quiet.sign('GET', '/p') }), 'rate_limited');
});

test('the nonce cache holds no more senders than nonces: a flood of distinct senders is refused past maxEntries, and expired senders are forgotten', () => {
  const cache = new NonceCache(50, 100, 3);
  const answers = Array.from({ length: 500 }, (_, i) => cache.add(`sender-${i}`, 'n', 1_000, 0));
  assert.equal(answers.filter((a) => a === 'ok').length, 50);
  assert.equal(answers.filter((a) => a === 'full').length, 450);
  assert.deepEqual([cache.size, cache.senders], [50, 50]);
  assert.equal(cache.add('late', 'n', 2_000, 1_001), 'ok', 'once the others expire there is room');
  assert.deepEqual([cache.size, cache.senders], [1, 1], 'expired senders are forgotten, not just their nonces');
});

test('a session key signs for a wallet address; the verifier checks it against the key registered for that address', async () => {
  const session = SessionKey.generate();
  const keys = new Map<string, string>([[ADDR0, session.publicKey]]);
  const verifier = new RequestVerifier({ sessionKeyOf: (a) => keys.get(a) });
  const signer = new RequestSigner({ session, address: ADDR0 });
  const h = await signer.sign('POST', '/v1/work', body);
  assert.match(h[AUTH_HEADERS.signature], /^ed25519\.[A-Za-z0-9_-]{86}$/);
  assert.deepEqual(await verifier.verifyHeaders({ method: 'POST', path: '/v1/work', headers: h }), { signer: ADDR0, scheme: 'session', bodySha256: bodySha256(body) });
  // another key claiming the same address, or an address with no key here
  const impostor = new RequestSigner({ session: SessionKey.generate(), address: ADDR0 });
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: await impostor.sign('POST', '/v1/work', body), body }), 'bad_signature');
  const stranger = new RequestSigner({ session, address: new RequestSigner(KEY1).address });
  await rejects(verifier.verify({ method: 'POST', path: '/v1/work', headers: await stranger.sign('POST', '/v1/work', body), body }), 'unknown_signer');
});

test('requests signed before the verifier started are refused: a restart forgets nonces, not the replay window', async () => {
  let now = 1_700_000_000_000;
  const signer = new RequestSigner(KEY0, { now: () => now });
  const h = await signer.sign('GET', '/p');
  const restarted = new RequestVerifier({ notBefore: now + 5, now: () => now + 10 });
  const e = await rejects(restarted.verify({ method: 'GET', path: '/p', headers: h }), 'stale');
  assert.match(e.message, /before this server started/);
  now += 6;
  assert.equal(await restarted.verify({ method: 'GET', path: '/p', headers: await signer.sign('GET', '/p') }), ADDR0);
});
