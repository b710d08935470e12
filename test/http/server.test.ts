// The shared HTTP server: the one error handler and its contract
// ({ error, code } with the error's status), schema validation without
// coercion of bodies, signed routes checked before the body is looked at,
// answers checked against their schema before they leave, and the client
// half turning error answers back into the same NimbleError.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Type } from '@sinclair/typebox';
import { generatePrivateKey } from 'viem/accounts';
import { httpRequest, JsonClient, SignedClient } from '../../src/http/client.ts';
import { createHttpServer, type HttpServer } from '../../src/http/server.ts';
import { signerOf } from '../../src/http/signed.ts';
import { FrameError, NimbleError } from '../../src/protocol/errors.ts';
import { RequestSigner, RequestVerifier } from '../../src/protocol/signing.ts';

const refused: { code: string; signer?: string }[] = [];
const failed: string[] = [];
let app: HttpServer;
let url: string;

before(async () => {
  app = createHttpServer({
    bodyLimit: 1024,
    verifier: new RequestVerifier(),
    onRefused: (req, err) => refused.push({ code: err.code, signer: req.signer }),
    onFailure: (_req, err) => failed.push(err.message),
  });
  app.post('/echo', { schema: { body: Type.Object({ n: Type.Integer({ minimum: 0 }) }), response: { 200: Type.Object({ n: Type.Integer() }) } } }, async (req) => ({ n: req.body.n }));
  app.get('/items/:id', { schema: { params: Type.Object({ id: Type.Integer({ minimum: 1 }) }), response: { 200: Type.Object({ id: Type.Integer() }) } } }, async (req) => ({ id: req.params.id }));
  app.get('/frame', async () => {
    throw new FrameError('checksum', 'payload sha256 differs');
  });
  app.get('/conflict', async () => {
    throw new NimbleError('conflict', 'not now');
  });
  app.get('/crash', async () => {
    throw new Error('secret internals');
  });
  app.get('/off-contract', { schema: { response: { 200: Type.Object({ n: Type.Integer() }) } } }, async () => ({ n: 'one' }) as unknown as { n: number });
  app.post('/signed', { config: { signed: 'wallet' }, schema: { body: Type.Object({ x: Type.String() }), response: { 200: Type.Object({ signer: Type.String() }) } } }, async (req) => ({ signer: signerOf(req) }));
  app.post('/big', { bodyLimit: 4096 }, async (req) => ({ bytes: req.rawBody?.length ?? 0 }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});
after(() => app.close());

async function call(method: string, path: string, body?: string, contentType = 'application/json'): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${url}${path}`, { method, body, headers: body === undefined ? {} : { 'content-type': contentType } });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

test('every error answers { error, code } with its status', async () => {
  assert.deepEqual(await call('GET', '/frame'), { status: 400, json: { error: 'frame checksum: payload sha256 differs', code: 'checksum' } });
  assert.deepEqual(await call('GET', '/conflict'), { status: 409, json: { error: 'not now', code: 'conflict' } });
  assert.deepEqual(await call('GET', '/nowhere'), { status: 404, json: { error: 'no route GET /nowhere', code: 'not_found' } });
  const crash = await call('GET', '/crash');
  assert.deepEqual(crash, { status: 500, json: { error: 'internal error', code: 'internal' } }, 'internals stay inside');
  assert.ok(failed.includes('secret internals'));
});

test('bodies are validated without coercion, params are converted; the message names the field', async () => {
  assert.deepEqual(await call('POST', '/echo', '{"n": 3}'), { status: 200, json: { n: 3 } });
  const asString = await call('POST', '/echo', '{"n": "3"}');
  assert.equal(asString.status, 400);
  assert.deepEqual(asString.json, { error: 'invalid body: /n Expected integer', code: 'invalid' });
  assert.match(String((await call('POST', '/echo', '{"n": -1}')).json.error), /\/n/);
  assert.deepEqual(await call('POST', '/echo', '{nope'), { status: 400, json: { error: 'the body is not JSON', code: 'invalid' } });
  assert.deepEqual(await call('GET', '/items/7'), { status: 200, json: { id: 7 } });
  assert.equal((await call('GET', '/items/x')).status, 400);
  assert.equal((await call('GET', '/items/0')).status, 400);
});

test('bodies over the route limit are refused with 413 before they are used', async () => {
  const big = await call('POST', '/echo', JSON.stringify({ n: 1, pad: 'x'.repeat(2000) }));
  assert.deepEqual(big, { status: 413, json: { error: 'the body is larger than this route accepts', code: 'too_large' } });
  assert.equal((await call('POST', '/big', 'x'.repeat(3000), 'application/octet-stream')).json.bytes, 3000, 'a route may allow more');
  assert.equal((await call('POST', '/big', 'x'.repeat(5000), 'application/octet-stream')).status, 413);
});

test('an answer that breaks its own schema is a 500, never sent', async () => {
  const r = await call('GET', '/off-contract');
  assert.deepEqual(r, { status: 500, json: { error: 'internal error', code: 'internal' } });
  assert.ok(failed.some((m) => /response does not match its schema: \/n/.test(m)));
});

test('signed routes: the signature is checked first, the signer reaches the handler, refusals name it', async () => {
  refused.length = 0;
  const unsigned = await call('POST', '/signed', '{nope');
  assert.equal(unsigned.status, 401, 'a bad signature is refused before the body is looked at');
  assert.equal(unsigned.json.code, 'missing');
  // refused from the headers alone: a huge unsigned body is not read (the connection closes after the answer)
  const huge = await fetch(`${url}/signed`, { method: 'POST', body: new Uint8Array(64 << 20), headers: { 'content-type': 'application/octet-stream' } });
  assert.equal(huge.status, 401);
  assert.equal(huge.headers.get('connection'), 'close');
  const key = generatePrivateKey();
  const client = new SignedClient(url, new RequestSigner(key));
  const ok = new TextDecoder().decode(await client.request('POST', '/signed', new TextEncoder().encode('{"x":"y"}'), 'application/json'));
  assert.deepEqual(JSON.parse(ok), { signer: client.address });
  await assert.rejects(
    () => client.request('POST', '/signed', new TextEncoder().encode('{"x":1}'), 'application/json'),
    (err: unknown) => err instanceof NimbleError && err.status === 400 && err.code === 'invalid' && /\/x/.test(err.message),
  );
  assert.deepEqual(refused, [{ code: 'missing', signer: undefined }, { code: 'missing', signer: undefined }, { code: 'invalid', signer: client.address }]);
});

test('the client turns answers back into NimbleError: remote code and status, or unreachable', async () => {
  await assert.rejects(
    () => new JsonClient(url).get('/conflict', Type.Object({}), 'thing'),
    (err: unknown) => err instanceof NimbleError && err.code === 'conflict' && err.status === 409 && err.message === 'GET /conflict: not now',
  );
  await assert.rejects(
    () => new JsonClient(url).get('/items/3', Type.Object({ id: Type.String() }), 'item'),
    (err: unknown) => err instanceof NimbleError && err.code === 'invalid' && /invalid item: \/id/.test(err.message),
    'answers are validated against the schema the caller expects',
  );
  await assert.rejects(
    () => httpRequest(new URL('http://127.0.0.1:9/'), { method: 'GET', timeoutMs: 2000 }),
    (err: unknown) => err instanceof NimbleError && err.code === 'unreachable' && err.status === 502,
  );
});
