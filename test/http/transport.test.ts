// The request transport (src/http/transport.ts) on a real loopback server: an
// answer slower than the pool's idle-socket timeout still arrives whole; a
// pooled connection is reused after being idle; a connection cut mid-answer
// says the answer had started; a server that is gone says it had not.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { IDLE_SOCKET_MS, send, TransportError } from '../../src/http/transport.ts';

const sockets = new Set<unknown>();
const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    if (req.url === '/slow') setTimeout(() => res.end('late'), IDLE_SOCKET_MS + 500);
    else if (req.url === '/cut') {
      res.writeHead(200, { 'content-length': '100' });
      res.write('half');
      setTimeout(() => res.destroy(), 50);
    } else res.end(`echo ${req.headers['content-length']}`);
  });
});
server.on('connection', (s) => sockets.add(s));
server.keepAliveTimeout = 10_000;
await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
after(() => {
  server.closeAllConnections();
  server.close();
});

test('answers arrive whole, slow ones too, over reused connections; a cut answer and a gone server are told apart', { timeout: 30_000 }, async () => {
  const echo = await send(new URL(`${base}/echo`), 'POST', {}, new Uint8Array(10), 5_000);
  assert.deepEqual([echo.status, new TextDecoder().decode(echo.bytes)], [200, 'echo 10']);
  const again = await send(new URL(`${base}/echo`), 'POST', {}, new Uint8Array(3), 5_000);
  assert.equal(new TextDecoder().decode(again.bytes), 'echo 3');
  assert.equal(sockets.size, 1, 'the second request reused the first connection');

  const slow = await send(new URL(`${base}/slow`), 'POST', {}, new Uint8Array(1), 15_000);
  assert.equal(new TextDecoder().decode(slow.bytes), 'late', 'an answer slower than the idle-socket timeout');

  await assert.rejects(send(new URL(`${base}/cut`), 'GET', {}, undefined, 5_000), (e: unknown) => e instanceof TransportError && e.started);
  await assert.rejects(send(new URL(`${base}/slow`), 'POST', {}, new Uint8Array(1), 200), (e: unknown) => e instanceof TransportError && !e.started && /no whole answer in 200 ms/.test(e.message));
  await assert.rejects(send(new URL('http://127.0.0.1:1/'), 'GET', {}, undefined, 5_000), (e: unknown) => e instanceof TransportError && !e.started);
});
