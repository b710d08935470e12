// Failover across base URLs (src/http/failover.ts) on real loopback servers:
// requests go to the first URL and stay on the one that last answered; they
// move on only when the first server certainly did nothing (no connection, a
// GET that got no answer, a 503 'unreachable' from a follower without a
// leader), never after a POST may have reached it; a signed request is signed
// afresh and verifies at the second server.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { Type } from '@sinclair/typebox';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { JsonClient, SignedClient } from '../../src/http/client.ts';
import { Failover, verdictOf } from '../../src/http/failover.ts';
import { TransportError } from '../../src/http/transport.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { RequestSigner, RequestVerifier } from '../../src/protocol/signing.ts';

type Handler = (req: IncomingMessage, body: Buffer, res: ServerResponse) => void;

interface TestServer {
  url: string;
  port: number;
  /** "METHOD /path" of each request that arrived whole */
  seen: string[];
  handler: Handler;
  close(): Promise<void>;
  /** listens again on the same port */
  reopen(): Promise<void>;
}

const open = new Set<Server>();
after(() => Promise.all([...open].map((s) => closeServer(s))));

function closeServer(s: Server): Promise<void> {
  open.delete(s);
  s.closeAllConnections();
  return new Promise((r) => s.close(() => r()));
}

const ok: Handler = (_req, _body, res) => json(res, 200, { ok: true });

function json(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

async function listen(port = 0): Promise<Server> {
  const server = createServer();
  open.add(server);
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', () => r()));
  return server;
}

async function testServer(handler: Handler = ok): Promise<TestServer> {
  const t: TestServer = {
    url: '',
    port: 0,
    seen: [],
    handler,
    close: async () => {},
    reopen: async () => {},
  };
  const attach = (server: Server): void => {
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => {
        t.seen.push(`${req.method} ${req.url}`);
        t.handler(req, Buffer.concat(parts), res);
      });
    });
    t.close = () => closeServer(server);
  };
  const server = await listen();
  attach(server);
  t.port = (server.address() as AddressInfo).port;
  t.url = `http://127.0.0.1:${t.port}`;
  t.reopen = async () => attach(await listen(t.port));
  return t;
}

/** A URL nothing listens on. */
async function deadUrl(): Promise<string> {
  const s = await testServer();
  await s.close();
  return s.url;
}

const Ok = Type.Object({ ok: Type.Boolean() });
const pause = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('requests go to the first URL; once it is gone they move to the second, say so once, and stay there', async () => {
  const a = await testServer();
  const b = await testServer();
  const moves: string[] = [];
  const client = new JsonClient(new Failover([a.url, b.url], (from, to, why) => moves.push(`orchestrator ${from} ${why}; now using ${to}`)), 5_000, 'the orchestrator');
  await client.get('/x', Ok, 'x');
  await client.post('/y', { n: 1 }, Ok, 'y');
  assert.deepEqual([a.seen, b.seen], [['GET /x', 'POST /y'], []]);

  await a.close();
  await pause(50); // the pooled connection to it closes
  await client.post('/y', { n: 2 }, Ok, 'y');
  await client.get('/x', Ok, 'x');
  assert.deepEqual(b.seen, ['POST /y', 'GET /x'], 'a refused connection moves a POST too');
  assert.deepEqual(moves, [`orchestrator ${a.url} unreachable; now using ${b.url}`]);
  assert.equal(client.baseUrl.href, `${b.url}/`);

  await a.reopen();
  await client.get('/x', Ok, 'x');
  await client.post('/y', { n: 3 }, Ok, 'y');
  assert.deepEqual(a.seen, ['GET /x', 'POST /y'], 'the first, back, is not asked again');
  assert.equal(b.seen.length, 4);
  assert.equal(moves.length, 1);
  await a.close();
  await b.close();
});

test('an opened GET (a download, an event stream) moves past a dead URL to one that answers; a refusal does not move it', async () => {
  const dead = await deadUrl();
  const b = await testServer((req, _body, res) => {
    if (req.url === '/missing') return json(res, 404, { error: 'no such file', code: 'not_found' });
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    res.end(`range ${req.headers.range ?? 'none'}`);
  });
  const client = new JsonClient([dead, b.url], 5_000, 'the orchestrator');
  const res = await client.open('/file', { range: 'bytes=3-' });
  assert.equal(await res.text(), 'range bytes=3-');
  assert.equal(client.baseUrl.href, `${b.url}/`);
  // the server's refusal is its NimbleError, and the client stays where it is
  const c = await testServer();
  const staying = new JsonClient([b.url, c.url], 5_000, 'the orchestrator');
  await assert.rejects(staying.open('/missing'), (e: unknown) => e instanceof NimbleError && e.code === 'not_found' && e.status === 404);
  assert.deepEqual(c.seen, []);
  await b.close();
  await c.close();
});

test("a 503 'unreachable' (no leader) moves on; a 503 with another code and a 500 are the caller's", async () => {
  const a = await testServer((_req, _body, res) => json(res, 503, { error: 'no orchestrator leads this network right now', code: 'unreachable' }));
  const b = await testServer();
  const moves: string[] = [];
  const failover = new Failover([a.url, b.url], (from, to, why) => moves.push(`${from} ${why}; now ${to}`));
  const client = new JsonClient(failover);
  await client.post('/y', {}, Ok, 'y');
  assert.deepEqual([a.seen, b.seen], [['POST /y'], ['POST /y']]);
  assert.deepEqual(moves, [`${a.url} has no leader (503 unreachable); now ${b.url}`]);

  for (const [status, code] of [[503, 'overloaded'], [503, 'unavailable'], [500, 'internal']] as const) {
    const c = await testServer((_req, _body, res) => json(res, status, { error: 'busy', code }));
    const d = await testServer();
    for (const method of ['GET', 'POST'] as const) {
      const only = new JsonClient([c.url, d.url]);
      await assert.rejects(
        () => (method === 'GET' ? only.get('/x', Ok, 'x') : only.post('/x', {}, Ok, 'x')),
        (err: unknown) => err instanceof NimbleError && err.status === status && err.code === code,
      );
    }
    assert.deepEqual([c.seen.length, d.seen.length], [2, 0], `${status} ${code} is not sent elsewhere`);
    await c.close();
    await d.close();
  }
  await a.close();
  await b.close();
});

test('a POST whose connection was reset after its body was sent is not sent again; a GET is', async () => {
  const a = await testServer((_req, _body, res) => res.socket?.resetAndDestroy());
  const b = await testServer();
  const client = new JsonClient([a.url, b.url]);
  await assert.rejects(() => client.post('/y', { n: 1 }, Ok, 'y'), (err: unknown) => err instanceof NimbleError && err.code === 'unreachable');
  assert.deepEqual([a.seen, b.seen], [['POST /y'], []], 'the second server never saw the POST');

  const signed = new SignedClient([a.url, b.url], new RequestSigner(generatePrivateKey(), { domain: 'nimble:test' }));
  await assert.rejects(() => signed.request('DELETE', '/z'), (err: unknown) => err instanceof NimbleError && err.code === 'unreachable');
  assert.deepEqual(b.seen, [], 'nor a signed DELETE');

  await client.get('/x', Ok, 'x');
  assert.deepEqual(b.seen, ['GET /x'], 'a GET that got no answer goes to the next');
  await a.close();
  await b.close();
});

test('a POST that timed out is not sent again; a GET that timed out is', async () => {
  const a = await testServer(() => {}); // never answers
  const b = await testServer();
  const client = new JsonClient([a.url, b.url], 300);
  await assert.rejects(() => client.post('/y', {}, Ok, 'y'), (err: unknown) => err instanceof NimbleError && /no whole answer in 300 ms/.test(err.message));
  assert.deepEqual([a.seen, b.seen], [['POST /y'], []]);
  await client.get('/x', Ok, 'x');
  assert.deepEqual(b.seen, ['GET /x']);
  await a.close();
  await b.close();
});

test('with every URL down the error names the last one tried', async () => {
  const [a, b] = [await deadUrl(), await deadUrl()];
  const client = new JsonClient([a, b], 5_000, 'the orchestrator');
  for (const send of [() => client.get('/x', Ok, 'x'), () => client.post('/y', {}, Ok, 'y')]) {
    await assert.rejects(send, (err: unknown) => err instanceof NimbleError && err.code === 'unreachable' && err.message.includes(`the orchestrator at ${b}`) && !err.message.includes(a));
  }
  assert.equal(client.baseUrl.href, `${a}/`, 'no answer: the current URL stays');
});

test('a signed request sent to the second server is signed afresh and verifies there', async () => {
  const key = generatePrivateKey();
  const domain = 'nimble:test';
  // both answer for one leader: one verifier, so a nonce seen by the first would be refused by the second
  const verifier = new RequestVerifier({ domain });
  const nonces: string[] = [];
  const verify = async (req: IncomingMessage, body: Buffer): Promise<string> => {
    nonces.push(String(req.headers['x-nimble-nonce']));
    return verifier.verify({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: new Uint8Array(body) });
  };
  const a = await testServer((req, body, res) => void verify(req, body).then(() => json(res, 503, { error: 'no orchestrator leads this network right now', code: 'unreachable' })));
  const b = await testServer(
    (req, body, res) =>
      void verify(req, body).then(
        (signer) => json(res, 200, { ok: true, signer }),
        (err: NimbleError) => json(res, err.status, { error: err.message, code: err.code }),
      ),
  );
  const client = new SignedClient([a.url, b.url], new RequestSigner(key, { domain }));
  const reply = JSON.parse(new TextDecoder().decode(await client.request('POST', '/runs?x=1', new TextEncoder().encode('{"n":1}'), 'application/json'))) as { signer: string };
  assert.equal(reply.signer, privateKeyToAccount(key).address);
  assert.deepEqual([a.seen, b.seen], [['POST /runs?x=1'], ['POST /runs?x=1']]);
  assert.equal(new Set(nonces).size, 2, 'a new nonce for the second server');

  // a signed GET opened as a stream moves on too
  const gone = await deadUrl();
  const streaming = new SignedClient([gone, b.url], new RequestSigner(key, { domain }));
  const res = await streaming.open('/blob');
  assert.equal(((await res.json()) as { signer: string }).signer, privateKeyToAccount(key).address);
  assert.equal(streaming.baseUrl, `${b.url}/`);

  // a whole URL (a peer's) is sent there alone
  await assert.rejects(() => streaming.request('POST', `${gone}/forward`, new Uint8Array(1)), (err: unknown) => err instanceof NimbleError && err.code === 'unreachable');
  assert.equal(b.seen.length, 2);
  await a.close();
  await b.close();
});

test('what a failure means when the transport cannot tell whether it connected (fetch)', () => {
  const fetchFailure = (code: string): NimbleError => {
    const cause = Object.assign(new Error(`connect ${code}`), { code });
    return new NimbleError('unreachable', 'cannot reach', 502, { cause: new TransportError('fetch failed', false, { cause: new TypeError('fetch failed', { cause }) }) });
  };
  assert.equal(verdictOf('POST', fetchFailure('ECONNREFUSED')), 'move');
  assert.equal(verdictOf('POST', fetchFailure('ECONNRESET')), 'stay');
  assert.equal(verdictOf('GET', fetchFailure('ECONNRESET')), 'move');
  assert.equal(verdictOf('GET', new NimbleError('unreachable', 'cut off', 502, { cause: new TransportError('aborted', true) })), 'stay');
  assert.equal(verdictOf('POST', new NimbleError('unreachable', 'no leader', 503)), 'move');
  assert.equal(verdictOf('POST', new NimbleError('unavailable', 'the lease is lost', 503)), 'answered');
  assert.equal(verdictOf('POST', new NimbleError('not_found', 'no', 404)), 'answered');
  assert.throws(() => new Failover(['http://a', 'http://a/']), /given twice/);
  assert.throws(() => new Failover([]), /no base URL/);
});
