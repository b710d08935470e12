// The client half of the error contract (src/http/client.ts): a signed
// request refused with 429 is signed afresh and sent again after a pause; any
// other refusal is the caller's at once.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { SignedClient } from '../../src/http/client.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';

const servers: Server[] = [];
after(() => Promise.all(servers.map((s) => new Promise((r) => s.close(r)))));

/** A server that answers each request with the next of `answers` (status, code) and records the nonces it saw. */
async function scripted(answers: [number, string][]): Promise<{ url: string; nonces: string[] }> {
  const nonces: string[] = [];
  const server = createServer((req, res) => {
    nonces.push(String(req.headers['x-nimble-nonce']));
    const [status, code] = answers[Math.min(nonces.length - 1, answers.length - 1)];
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(status === 200 ? { ok: true } : { error: `refused: ${code}`, code }));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, nonces };
}

test('a 429 is sent again, signed afresh each time, until it goes through', async () => {
  const s = await scripted([[429, 'rate_limited'], [429, 'rate_limited'], [200, '']]);
  const client = new SignedClient(s.url, new RequestSigner(generatePrivateKey(), { domain: 'nimble:test' }));
  const body = await client.request('POST', '/runs', new Uint8Array(4));
  assert.deepEqual(JSON.parse(new TextDecoder().decode(body)), { ok: true });
  assert.equal(s.nonces.length, 3);
  assert.equal(new Set(s.nonces).size, 3, 'a new nonce each time');
});

test('a 429 that does not end is the caller\'s after the retries; other refusals at once', async () => {
  const busy = await scripted([[429, 'rate_limited']]);
  const client = new SignedClient(busy.url, new RequestSigner(generatePrivateKey(), { domain: 'nimble:test' }));
  await assert.rejects(() => client.request('GET', '/x'), (err: unknown) => err instanceof NimbleError && err.status === 429);
  assert.equal(busy.nonces.length, 5, 'once and 4 more');
  const bad = await scripted([[400, 'invalid']]);
  await assert.rejects(() => new SignedClient(bad.url, new RequestSigner(generatePrivateKey(), { domain: 'nimble:test' })).request('GET', '/x'), (err: unknown) => err instanceof NimbleError && err.status === 400);
  assert.equal(bad.nonces.length, 1);
});
