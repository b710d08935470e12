// A follower's forwarder (src/orchestrator/cluster/forwarder.ts) between real
// servers on 127.0.0.1: bodies both ways byte for byte, statuses and headers
// passed, hop-by-hop headers kept on their hop, the client's address in
// x-nimble-forwarded-for with its proof under the term's key (a forged one
// replaced, one without the proof not believed), server-sent events passed as
// they come, the errors without a leader or with one down (OpenAI's shape
// under /v1/), a switch of leader, aborts both ways, the headers timeout, and
// malformed requests answered without harm.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, request, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
import { after, before, test } from 'node:test';
import { FORWARDED_FOR, startForwarder, type Forwarder, type ForwarderOptions } from '../../../src/orchestrator/cluster/forwarder.ts';
import { clientAddressOf, FORWARDED_PROOF, forwardedProof, isLocalClient } from '../../../src/orchestrator/dashboard/auth.ts';

/** The key of the leader's term, as the lease gives it to the members. */
const KEY = randomBytes(32).toString('hex');

interface Upstream {
  server: Server;
  url: string;
  /** the last request's headers, whether the leader took it as from this machine, and for which client */
  seen: { headers: IncomingHttpHeaders; local: boolean; client: string } | null;
}

/** Signals the tests give the upstream, and what it tells them. */
let releaseSse: () => void = () => {};
let sseReleased: Promise<void> = Promise.resolve();
let streamClosed: (v: string) => void = () => {};
let slowArrived: () => void = () => {};

function handler(name: string, up: Upstream) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    up.seen = { headers: req.headers, local: isLocalClient(req, KEY), client: clientAddressOf(req, KEY) };
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (path === '/echo') {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => {
        res.writeHead(201, { 'content-type': 'application/octet-stream', 'x-custom': `from ${name}`, 'x-method': req.method ?? '' });
        res.end(Buffer.concat(parts));
      });
      return;
    }
    if (path === '/hop') {
      res.writeHead(200, { connection: 'x-hop-secret', 'x-hop-secret': '1', 'keep-alive': 'timeout=30', 'proxy-authenticate': 'Basic', 'x-kept': 'yes', 'content-type': 'text/plain' });
      res.end('hop');
      return;
    }
    if (path.startsWith('/status/')) {
      const status = Number(path.slice(8));
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(status === 204 || status === 304 ? undefined : JSON.stringify({ status }));
      return;
    }
    if (path === '/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write('data: 1\n\n');
      void sseReleased.then(() => res.end('data: 2\n\n'));
      return;
    }
    if (path === '/sse-head') {
      // the head alone, the events only once the client has seen it
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      void sseReleased.then(() => res.end('data: late\n\n'));
      return;
    }
    if (path === '/hold') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: held\n\n');
      res.on('close', () => streamClosed(res.writableFinished ? 'finished' : 'closed'));
      return;
    }
    if (path === '/die') {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '1000000' });
      res.write(Buffer.alloc(1000));
      setTimeout(() => res.socket?.destroy(), 50);
      return;
    }
    if (path === '/slow') {
      slowArrived();
      res.on('close', () => streamClosed('slow closed'));
      return; // never answers
    }
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.end(name);
  };
}

async function startUpstream(name: string): Promise<Upstream> {
  const up: Upstream = { server: createServer(), url: '', seen: null };
  up.server.on('request', handler(name, up));
  await new Promise<void>((resolve) => up.server.listen(0, '127.0.0.1', resolve));
  up.url = `http://127.0.0.1:${(up.server.address() as AddressInfo).port}`;
  return up;
}

async function stop(server: Server): Promise<void> {
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeAllConnections();
  await closed;
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** One request on a new connection; `localAddress` picks the client's address. */
function call(base: string, path: string, options: { method?: string; headers?: OutgoingHttpHeaders; body?: Buffer; localAddress?: string } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const u = new URL(base);
    const req = request({ hostname: u.hostname, port: u.port, path, method: options.method ?? 'GET', headers: options.headers, agent: false, localAddress: options.localAddress }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('error', reject);
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }));
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms)));
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

let a: Upstream;
let b: Upstream;
let leader: string | null;
let fwd: Forwarder;
const extra: Forwarder[] = [];
const logged: string[] = [];

async function forwarder(options: Partial<ForwarderOptions> = {}): Promise<Forwarder> {
  const f = await startForwarder({ host: '127.0.0.1', port: 0, leader: () => leader, forwardKey: () => KEY, log: (l) => logged.push(l), ...options });
  extra.push(f);
  return f;
}

before(async () => {
  a = await startUpstream('A');
  b = await startUpstream('B');
  leader = a.url;
  fwd = await startForwarder({ host: '127.0.0.1', port: 0, leader: () => leader, forwardKey: () => KEY, log: (l) => logged.push(l) });
});

after(async () => {
  releaseSse();
  await fwd.close();
  for (const f of extra) await f.close();
  await stop(a.server);
  await stop(b.server);
});

test('GET and POST pass through: multi-MB bodies byte for byte (sized and chunked), statuses, headers, host', async () => {
  leader = a.url;
  assert.match(fwd.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const got = await call(fwd.url, '/anything?x=1');
  assert.equal(got.status, 200);
  assert.equal(got.body.toString(), 'A');
  assert.equal(a.seen?.headers.host, new URL(fwd.url).host, "the client's Host, which the dashboard's same-origin check compares Origin with");

  const body = randomBytes(5 * 1024 * 1024 + 7);
  for (const headers of [{ 'content-length': body.length, 'content-type': 'application/octet-stream' }, { 'transfer-encoding': 'chunked' }]) {
    const echo = await call(fwd.url, '/echo', { method: 'POST', headers, body });
    assert.equal(echo.status, 201);
    assert.equal(echo.headers['content-type'], 'application/octet-stream');
    assert.equal(echo.headers['x-custom'], 'from A');
    assert.equal(echo.headers['x-method'], 'POST');
    assert.ok(echo.body.equals(body), 'the body comes back byte for byte');
  }
  const put = await call(fwd.url, '/echo', { method: 'PUT', body: Buffer.from('') });
  assert.equal(put.headers['x-method'], 'PUT');
  assert.equal(put.body.length, 0);

  for (const status of [204, 304, 404, 418, 500, 503]) {
    const r = await call(fwd.url, `/status/${status}`);
    assert.equal(r.status, status);
    if (status !== 204 && status !== 304) assert.deepEqual(JSON.parse(r.body.toString()), { status });
  }
  const head = await call(fwd.url, '/status/200', { method: 'HEAD' });
  assert.equal(head.status, 200);
  assert.equal(head.body.length, 0);
});

test('hop-by-hop headers stay on their hop, both ways', async () => {
  leader = a.url;
  const r = await call(fwd.url, '/hop', { headers: { connection: 'keep-alive, x-client-hop', 'x-client-hop': 'secret', 'keep-alive': 'timeout=5', te: 'trailers', 'proxy-authorization': 'Basic eA==', 'x-end-to-end': 'kept' } });
  const sent = a.seen!.headers;
  for (const h of ['x-client-hop', 'keep-alive', 'te', 'proxy-authorization', 'upgrade']) assert.equal(sent[h], undefined, h);
  assert.notEqual(sent.connection, 'keep-alive, x-client-hop');
  assert.equal(sent['x-end-to-end'], 'kept');
  assert.equal(r.headers['x-kept'], 'yes');
  for (const h of ['x-hop-secret', 'proxy-authenticate']) assert.equal(r.headers[h], undefined, h);
  assert.notEqual(r.headers['keep-alive'], 'timeout=30');
  assert.equal(r.body.toString(), 'hop');
});

test('x-nimble-forwarded-for names the client, proven with the term key: a loopback client is local to the leader, forged values are replaced or not believed', async (t) => {
  assert.equal(FORWARDED_FOR, 'x-nimble-forwarded-for');
  leader = a.url;
  await call(fwd.url, '/');
  assert.equal(a.seen?.headers[FORWARDED_FOR], '127.0.0.1');
  assert.equal(a.seen?.headers[FORWARDED_PROOF], forwardedProof(KEY, 'GET', '/', '127.0.0.1'));
  assert.equal(a.seen?.local, true);
  // a client of this machine naming another client without a proof is not believed: the follower names the client it sees
  await call(fwd.url, '/', { headers: { [FORWARDED_FOR]: '10.6.6.6', [FORWARDED_PROOF]: 'f'.repeat(64) } });
  assert.equal(a.seen?.headers[FORWARDED_FOR], '127.0.0.1');
  assert.equal(a.seen?.client, '127.0.0.1');
  // nor, straight to the leader: a loopback process that writes the header is counted as itself, and is not local
  for (const proof of [undefined, 'f'.repeat(64), forwardedProof('e'.repeat(64), 'GET', '/', '10.6.6.6'), forwardedProof(KEY, 'GET', '/other', '10.6.6.6')]) {
    await call(a.url, '/', { headers: { [FORWARDED_FOR]: '10.6.6.6', ...(proof ? { [FORWARDED_PROOF]: proof } : {}) } });
    assert.equal(a.seen?.client, '127.0.0.1', `proof ${proof}`);
    assert.equal(a.seen?.local, false);
  }
  // with the term's key (a follower): believed
  await call(a.url, '/', { headers: { [FORWARDED_FOR]: '10.6.6.6', [FORWARDED_PROOF]: forwardedProof(KEY, 'GET', '/', '10.6.6.6') } });
  assert.equal(a.seen?.client, '10.6.6.6');
  assert.equal(a.seen?.local, false);
  // a follower that has no key yet sends the header unproven: never believed as local
  const keyless = await forwarder({ forwardKey: () => null });
  await call(keyless.url, '/');
  assert.equal(a.seen?.headers[FORWARDED_PROOF], undefined);
  assert.equal(a.seen?.local, false);

  // a client from another address (this machine's own non-loopback one, if it has one)
  const outside = Object.values(networkInterfaces()).flat().find((i) => i && !i.internal && i.family === 'IPv4')?.address;
  if (!outside) return t.diagnostic('no non-loopback IPv4 address here: forged headers from elsewhere not tried');
  const open = await forwarder({ host: outside });
  for (const forged of [undefined, '127.0.0.1', '::1']) {
    await call(open.url, '/', { localAddress: outside, headers: forged ? { [FORWARDED_FOR]: forged } : {} });
    assert.equal(a.seen?.headers[FORWARDED_FOR], outside, `forged ${forged}`);
    assert.equal(a.seen?.local, false);
  }
  // through two followers on this machine (outside → follower → follower over loopback → leader): still the outside client
  const inner = await forwarder();
  const outer = await forwarder({ host: outside, leader: () => inner.url });
  await call(outer.url, '/', { localAddress: outside, headers: { [FORWARDED_FOR]: '127.0.0.1' } });
  assert.equal(a.seen?.headers[FORWARDED_FOR], outside);
  assert.equal(a.seen?.local, false);
});

test('server-sent events reach the client as they come: the head, then event 1, while the leader has not ended', async () => {
  leader = a.url;
  const u = new URL(fwd.url);
  const stream = (path: string, release: (all: string) => boolean): Promise<string> =>
    within(
      new Promise<string>((resolve, reject) => {
        const req = request({ hostname: u.hostname, port: u.port, path, agent: false }, (res) => {
          assert.equal(res.headers['content-type'], 'text/event-stream');
          let all = '';
          if (release(all)) releaseSse();
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            all += chunk;
            if (release(all)) releaseSse();
          });
          res.on('end', () => resolve(all));
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end();
      }),
      5_000,
      path,
    );
  // the leader ends only once the client saw event 1
  sseReleased = new Promise((resolve) => (releaseSse = resolve));
  assert.equal(await stream('/sse', (all) => all.includes('data: 1\n\n')), 'data: 1\n\ndata: 2\n\n');
  // the leader sends its first event only once the client saw the head
  sseReleased = new Promise((resolve) => (releaseSse = resolve));
  assert.equal(await stream('/sse-head', () => true), 'data: late\n\n');
});

test('no leader, or a leader down: 503 in the error contract, in OpenAI\'s shape under /v1/', async () => {
  leader = null;
  const none = await call(fwd.url, '/network');
  assert.equal(none.status, 503);
  assert.equal(none.headers['content-type'], 'application/json');
  const body = JSON.parse(none.body.toString()) as { error: string; code: string };
  assert.equal(body.code, 'unreachable');
  assert.match(body.error, /no orchestrator leads this network right now/);

  const v1 = await call(fwd.url, '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from('{"model":"m","prompt":"hi"}') });
  assert.equal(v1.status, 503);
  const e = JSON.parse(v1.body.toString()) as { error: { message: string; type: string; param: null; code: string } };
  assert.deepEqual(Object.keys(e.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(e.error.type, 'server_error');
  assert.equal(e.error.param, null);

  // a closed port
  const gone = createServer();
  await new Promise<void>((resolve) => gone.listen(0, '127.0.0.1', resolve));
  const port = (gone.address() as AddressInfo).port;
  await stop(gone);
  leader = `http://127.0.0.1:${port}`;
  const down = await call(fwd.url, '/echo', { method: 'POST', body: randomBytes(3 * 1024 * 1024) });
  assert.equal(down.status, 503);
  const d = JSON.parse(down.body.toString()) as { error: string; code: string };
  assert.equal(d.code, 'unreachable');
  assert.match(d.error, new RegExp(`the leading orchestrator at http://127\\.0\\.0\\.1:${port} could not be reached`));
  assert.equal((await call(fwd.url, '/v1/models')).status, 503);

  leader = 'not a url';
  assert.equal((await call(fwd.url, '/')).status, 503);
  leader = 'https://127.0.0.1:1';
  assert.equal((await call(fwd.url, '/')).status, 503);
});

test('a switch of leader takes effect on the next request', async () => {
  leader = a.url;
  assert.equal((await call(fwd.url, '/')).body.toString(), 'A');
  leader = b.url;
  assert.equal((await call(fwd.url, '/')).body.toString(), 'B');
  leader = a.url;
  assert.equal((await call(fwd.url, '/')).body.toString(), 'A');
});

test('a client going away closes the request to the leader: mid-stream, and before the leader answered', async () => {
  leader = a.url;
  const u = new URL(fwd.url);
  let closed = new Promise<string>((resolve) => (streamClosed = resolve));
  const req = request({ hostname: u.hostname, port: u.port, path: '/hold', agent: false }, (res) => {
    res.once('data', () => req.destroy());
  });
  req.on('error', () => {});
  req.end();
  assert.equal(await within(closed, 5_000, 'the leader seeing the close'), 'closed');

  closed = new Promise<string>((resolve) => (streamClosed = resolve));
  const arrived = new Promise<void>((resolve) => (slowArrived = resolve));
  const early = request({ hostname: u.hostname, port: u.port, path: '/slow', agent: false });
  early.on('error', () => {});
  early.end();
  await within(arrived, 5_000, 'the request reaching the leader');
  early.destroy();
  assert.equal(await within(closed, 5_000, 'the leader seeing the close'), 'slow closed');
});

test('the leader failing mid-answer cuts the client\'s answer; a leader silent past the timeout gives 504', async () => {
  leader = a.url;
  await assert.rejects(within(call(fwd.url, '/die'), 5_000, 'a cut answer'), (err: Error) => !/nothing within/.test(err.message));

  const quick = await forwarder({ headersTimeoutMs: 200 });
  const closed = new Promise<string>((resolve) => (streamClosed = resolve));
  const slow = await within(call(quick.url, '/slow'), 5_000, 'the timeout');
  assert.equal(slow.status, 504);
  assert.equal((JSON.parse(slow.body.toString()) as { code: string }).code, 'timeout');
  assert.equal(await within(closed, 5_000, 'the leader seeing the close'), 'slow closed');
});

test('a kept-alive connection the leader drops: a request without a body goes again on a new one, one with a body gets 502 (it may have been acted on: never the 503 clients resend elsewhere)', async () => {
  // a leader that serves one request per connection and drops the connection at the next one, unanswered
  const served = new WeakSet<object>();
  const flaky = createServer((req, res) => {
    if (served.has(req.socket)) return void req.socket.destroy();
    served.add(req.socket);
    req.resume();
    req.on('end', () => res.end(`fresh ${req.method}`));
  });
  flaky.keepAliveTimeout = 0;
  await new Promise<void>((resolve) => flaky.listen(0, '127.0.0.1', resolve));
  try {
    leader = `http://127.0.0.1:${(flaky.address() as AddressInfo).port}`;
    const f = await forwarder();
    assert.equal((await call(f.url, '/')).body.toString(), 'fresh GET');
    assert.equal((await call(f.url, '/')).body.toString(), 'fresh GET', 'sent again');
    const post = await call(f.url, '/', { method: 'POST', body: Buffer.from('once') });
    assert.equal(post.status, 502);
    assert.equal((JSON.parse(post.body.toString()) as { code: string }).code, 'leader_failed');
  } finally {
    await stop(flaky);
  }
});

test('malformed requests get a 4xx or a closed connection, and the forwarder goes on', async () => {
  leader = a.url;
  const u = new URL(fwd.url);
  const raw = (bytes: string | Buffer): Promise<string> =>
    within(
      new Promise<string>((resolve) => {
        const s = connect(Number(u.port), u.hostname);
        let got = '';
        s.on('data', (c: Buffer) => (got += c.toString('latin1')));
        s.on('error', () => resolve(got));
        s.on('close', () => resolve(got));
        s.end(bytes);
      }),
      5_000,
      'a raw request',
    );
  const cases: (string | Buffer)[] = [
    'GARBAGE\r\n\r\n',
    'GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n',
    'GET / HTTP/1.1\r\nHost: x\r\nx-a: \x01\r\n\r\n',
    'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
    'POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
    'GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n',
    'OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n',
    `GET / HTTP/1.1\r\nHost: x\r\nx-big: ${'a'.repeat(100_000)}\r\n\r\n`,
    'CONNECT a:1 HTTP/1.1\r\nHost: a:1\r\n\r\n',
    'GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n',
    Buffer.from([0, 1, 2, 255, 13, 10, 13, 10]),
  ];
  for (const c of cases) {
    const answer = await raw(c);
    const status = /^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1];
    assert.ok(status === undefined || (Number(status) >= 400 && Number(status) < 500), `${JSON.stringify(c.slice(0, 60))} → ${answer.slice(0, 80)}`);
  }
  // a POST whose client goes away mid-body
  const s = connect(Number(u.port), u.hostname);
  s.on('error', () => {});
  s.write('POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc');
  await new Promise((resolve) => setTimeout(resolve, 50));
  s.destroy();
  assert.equal((await call(fwd.url, '/')).body.toString(), 'A');
});

test('close() stops listening and cuts the streams open', async () => {
  leader = a.url;
  const f = await forwarder();
  const closed = new Promise<string>((resolve) => (streamClosed = resolve));
  const u = new URL(f.url);
  const cut = new Promise<void>((resolve) => {
    const req = request({ hostname: u.hostname, port: u.port, path: '/hold', agent: false }, (res) => {
      res.once('data', () => void f.close());
      res.on('error', () => resolve());
      res.on('close', () => resolve());
    });
    req.on('error', () => resolve());
    req.end();
  });
  await within(cut, 5_000, 'the stream cut');
  // a connection with half a request head does not hold close() up
  const g = await forwarder();
  const half = connect(g.port, '127.0.0.1');
  half.on('error', () => {});
  await new Promise((resolve) => half.once('connect', resolve));
  half.write('GET / HTTP/1.1\r\nHost: x\r\n');
  await new Promise((resolve) => setTimeout(resolve, 50));
  await within(g.close(), 1_000, 'closing with a half-sent request');
  assert.equal(await within(closed, 5_000, 'the leader seeing the close'), 'closed');
  await assert.rejects(call(f.url, '/'), /ECONNREFUSED/);
});
