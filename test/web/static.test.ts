// The dashboard's routes without a browser (src/orchestrator/routes/dashboard.ts):
// the built files served with their content types and caching headers, names
// that could leave the build folder refused, the API's routes not shadowed,
// the operator's login (token → HttpOnly SameSite=Strict cookie, never in the
// URL it sends the browser on to; the token good once and for a short while),
// a Host that is not this server's refused (DNS rebinding), reading open to
// loopback only (not to an outside client a follower on this machine forwards,
// nor to a loopback peer naming a client without a forwarder's proof), actions
// refused without the cookie or from another origin, the snapshot of
// GET /events against its contracts; the loss curves' bounds; NIM for people.
import { zeroAddress } from 'viem';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { DashboardSections, LossHistory, SECTION_NAMES } from '../../src/api/dashboard.ts';
import { displayNim } from '../../src/chain/nim-display.ts';
import { createHttpServer, type HttpServer } from '../../src/http/server.ts';
import { FsBlobStore } from '../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../src/orchestrator/training/coordinator.ts';
import { FORWARDED_FOR, FORWARDED_PROOF, LOGIN_TOKEN_MS, OperatorAuth, clientAddressOf, forwardedProof, hostAllowed, isLocalClient, isLoopback, sessionIdOf } from '../../src/orchestrator/dashboard/auth.ts';
import { LossHistories } from '../../src/orchestrator/dashboard/loss-history.ts';
import { StaticFiles } from '../../src/orchestrator/dashboard/static-files.ts';
import { buildApi } from '../../src/orchestrator/http.ts';
import { dashboardRoutes } from '../../src/orchestrator/routes/dashboard.ts';
import { OrchestratorState } from '../../src/orchestrator/state/index.ts';

const TOKEN = 'a'.repeat(20) + 'B'.repeat(20) + '0123456789_-';
let dir: string;
let web: string;
let state: OrchestratorState;
let app: HttpServer;
let full: HttpServer;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-web-'));
  web = join(dir, 'web');
  mkdirSync(join(web, 'assets'), { recursive: true });
  writeFileSync(join(web, 'index.html'), '<!doctype html><title>t</title><script type="module" src="/assets/app-1a2b.js"></script>');
  writeFileSync(join(web, 'assets', 'app-1a2b.js'), 'console.log(1)');
  writeFileSync(join(web, 'assets', 'app-1a2b.css'), 'body{}');
  writeFileSync(join(web, 'assets', 'notes.txt'), 'not a type the dashboard serves');
  writeFileSync(join(dir, 'secret.js'), 'the secret');
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  const coordinator = new Coordinator(state, await FsBlobStore.open(join(dir, 'blobs')), { spotChecks: { rate: 0 } });
  app = createHttpServer({ bodyLimit: 1 << 20 });
  dashboardRoutes(app, coordinator, { jobs: null, paid: false, webRoot: web, auth: new OperatorAuth(TOKEN), operatorAddress: zeroAddress });
  await app.ready();
  full = buildApi(coordinator);
  await full.ready();
});

after(async () => {
  await app.close();
  await full.close();
  state.close();
  rmSync(dir, { recursive: true, force: true });
});

test('the page and its assets: content types, caching, a policy that runs only its own scripts', async () => {
  const page = await app.inject({ method: 'GET', url: '/' });
  assert.equal(page.statusCode, 200);
  assert.equal(page.headers['content-type'], 'text/html; charset=utf-8');
  assert.equal(page.headers['cache-control'], 'no-cache');
  assert.match(String(page.headers['content-security-policy']), /script-src 'self';/);
  assert.equal(page.headers['x-content-type-options'], 'nosniff');
  assert.match(page.body, /app-1a2b\.js/);
  const js = await app.inject({ method: 'GET', url: '/assets/app-1a2b.js' });
  assert.equal(js.statusCode, 200);
  assert.equal(js.headers['content-type'], 'text/javascript; charset=utf-8');
  assert.equal(js.headers['cache-control'], 'public, max-age=31536000, immutable');
  assert.equal(js.body, 'console.log(1)');
  const css = await app.inject({ method: 'GET', url: '/assets/app-1a2b.css' });
  assert.equal(css.headers['content-type'], 'text/css; charset=utf-8');
  const head = await app.inject({ method: 'HEAD', url: '/assets/app-1a2b.js' });
  assert.equal(head.statusCode, 200);
});

test('no directory traversal: names that could leave the build folder, unknown types and files are refused', async () => {
  for (const url of ['/assets/..%2Fsecret.js', '/assets/%2e%2e%2fsecret.js', '/assets/..%2F..%2Fsecret.js', '/assets/.hidden.js', '/assets/a%5C..%5Csecret.js', '/assets/%2Fetc%2Fpasswd', '/assets/']) {
    const r = await app.inject({ method: 'GET', url });
    assert.ok(r.statusCode === 400 || r.statusCode === 404, `${url}: ${r.statusCode}`);
    assert.doesNotMatch(r.body, /the secret/);
    assert.equal(r.headers['content-type'], 'application/json; charset=utf-8');
    assert.ok(['invalid', 'not_found'].includes(JSON.parse(r.body).code), r.body);
  }
  for (const url of ['/assets/../secret.js', '/secret.js', '/assets/notes.txt', '/assets/missing.js', '/index.html']) {
    const r = await app.inject({ method: 'GET', url });
    assert.equal(r.statusCode, 404, url);
    assert.doesNotMatch(r.body, /the secret|not a type/);
  }
  const files = new StaticFiles(web);
  for (const name of ['..', '../secret.js', '..%2Fsecret.js', 'a/../../secret.js', '', 'app-1a2b.js/']) assert.equal(await files.asset(name), null, name);
  assert.ok(await files.asset('app-1a2b.js'));
  // not built: a 404 that says how to build it, not a crash
  const none = await new StaticFiles(join(dir, 'nowhere')).page();
  assert.equal(none, null);
});

test('/ does not shadow the API: every route of the full server still answers JSON', async () => {
  const miners = await full.inject({ method: 'GET', url: '/miners' });
  assert.equal(miners.statusCode, 200);
  assert.deepEqual(JSON.parse(miners.body), []);
  assert.equal((await full.inject({ method: 'GET', url: '/health' })).body, '{"ok":true}');
  const unknown = await full.inject({ method: 'GET', url: '/no-such-route' });
  assert.equal(unknown.statusCode, 404);
  assert.equal(JSON.parse(unknown.body).code, 'not_found');
});

test('login: the token becomes an HttpOnly SameSite=Strict cookie and the browser is sent on to a URL without it', async () => {
  const wrong = await app.inject({ method: 'GET', url: `/login?token=${'x'.repeat(52)}` });
  assert.equal(wrong.statusCode, 403);
  assert.equal(wrong.headers['set-cookie'], undefined);
  const r = await app.inject({ method: 'GET', url: `/login?token=${TOKEN}` });
  assert.equal(r.statusCode, 303);
  assert.equal(r.headers.location, '/');
  const cookie = String(r.headers['set-cookie']);
  assert.match(cookie, /^nimble_operator=[A-Za-z0-9_-]{43}; Path=\/; HttpOnly; SameSite=Strict; Max-Age=\d+$/);
  assert.ok(!cookie.includes(TOKEN), 'the cookie holds a session id, not the token');
  const session = cookie.split(';')[0];
  // the token was good once: the same URL again (from a browser's history, a log) logs nobody in
  const again = await app.inject({ method: 'GET', url: `/login?token=${TOKEN}` });
  assert.equal(again.statusCode, 403, again.body);
  assert.equal(JSON.parse(again.body).code, 'token_spent');
  assert.equal(again.headers['set-cookie'], undefined);
  assert.deepEqual(JSON.parse((await app.inject({ method: 'GET', url: '/session', headers: { cookie: session } })).body), { operator: true, paid: false, operatorAddress: zeroAddress });
  assert.deepEqual(JSON.parse((await app.inject({ method: 'GET', url: '/session' })).body), { operator: false, paid: false, operatorAddress: zeroAddress });
  assert.equal(sessionIdOf(`a=b; ${session}`), session.split('=')[1]);

  // actions: refused without the cookie (401), from another origin (403); with both, they reach the state (an unknown run: 404)
  const cancel = (headers: Record<string, string>) => app.inject({ method: 'POST', url: '/operator/runs/r-nope/cancel', headers });
  assert.equal((await cancel({ origin: 'http://localhost:80' })).statusCode, 401);
  assert.equal((await cancel({ cookie: session, origin: 'http://evil.example' })).statusCode, 403);
  assert.equal((await cancel({ cookie: session })).statusCode, 403);
  const host = 'localhost:80';
  const ok = await cancel({ cookie: session, origin: `http://${host}`, host });
  assert.equal(ok.statusCode, 404, ok.body);
  assert.equal((await cancel({ cookie: session, 'sec-fetch-site': 'same-origin' })).statusCode, 404);
  assert.equal((await cancel({ cookie: session, 'sec-fetch-site': 'cross-site' })).statusCode, 403);
  // the upgrade of a job: the same gate
  const upgrade = (headers: Record<string, string>) => app.inject({ method: 'POST', url: '/operator/jobs/job-00000000000000ab/upgrade', headers });
  assert.equal((await upgrade({ origin: 'http://localhost:80' })).statusCode, 401);
  assert.equal((await upgrade({ cookie: session, origin: 'http://evil.example' })).statusCode, 403);
  assert.equal((await upgrade({ cookie: session, 'sec-fetch-site': 'same-origin' })).statusCode, 404);
  // submitting a job, deploying and undeploying a model: the same gate (this server takes no jobs and deploys nothing: 404 past it)
  const spec = { name: 'op-job', model: 'gpt-micro', data: 'moby-dick', training: { steps: 4 } };
  const model = `/operator/models/${'ab'.repeat(32)}`;
  for (const [url, payload] of [['/operator/jobs', { spec }], [`${model}/deploy`, {}], [`${model}/undeploy`, undefined]] as const) {
    const act = (headers: Record<string, string>) => app.inject({ method: 'POST', url, headers, ...(payload ? { payload } : {}) });
    assert.equal((await act({ origin: 'http://localhost:80' })).statusCode, 401, url);
    assert.equal((await act({ cookie: session, origin: 'http://evil.example' })).statusCode, 403, url);
    assert.equal((await act({ cookie: session, 'sec-fetch-site': 'cross-site' })).statusCode, 403, url);
    const past = await act({ cookie: session, 'sec-fetch-site': 'same-origin' });
    assert.equal(past.statusCode, 404, `${url}: ${past.body}`);
  }
  const badSpec = await app.inject({ method: 'POST', url: '/operator/jobs', headers: { cookie: session, 'sec-fetch-site': 'same-origin' }, payload: { spec: { name: '<script>', model: 'gpt-micro' } } });
  assert.equal(badSpec.statusCode, 400, badSpec.body);

  // reading: open to loopback; from elsewhere only with the cookie
  assert.equal((await app.inject({ method: 'GET', url: '/', remoteAddress: '10.1.2.3' })).statusCode, 403);
  assert.equal((await app.inject({ method: 'GET', url: '/', remoteAddress: '10.1.2.3', headers: { cookie: session } })).statusCode, 200);
  assert.ok(isLoopback('127.0.0.1') && isLoopback('::1') && isLoopback('::ffff:127.0.0.1') && !isLoopback('10.0.0.1') && !isLoopback(undefined));
  // a follower on this machine forwards an outside client over loopback: that client is not local; nor is a loopback peer
  // that names a client without a forwarder's proof (this server believes none)
  assert.equal((await app.inject({ method: 'GET', url: '/', remoteAddress: '127.0.0.1', headers: { [FORWARDED_FOR]: '10.1.2.3' } })).statusCode, 403);
  assert.equal((await app.inject({ method: 'GET', url: '/', remoteAddress: '127.0.0.1', headers: { [FORWARDED_FOR]: '10.1.2.3', cookie: session } })).statusCode, 200);
  assert.equal((await app.inject({ method: 'GET', url: '/', remoteAddress: '127.0.0.1', headers: { [FORWARDED_FOR]: '::1' } })).statusCode, 403);
  // a page of another site whose name was pointed at this machine (DNS rebinding): refused for its Host, reading and acting
  for (const url of ['/', '/events', '/wallets', '/assets/app-1a2b.js', `/login?token=${'x'.repeat(52)}`]) {
    const r = await app.inject({ method: 'GET', url, headers: { host: 'attacker.example:80' } });
    assert.equal(r.statusCode, 403, `${url}: ${r.body}`);
    assert.equal(JSON.parse(r.body).code, 'bad_host', url);
  }
  assert.equal((await cancel({ cookie: session, origin: 'http://attacker.example', host: 'attacker.example' })).statusCode, 403);
  for (const host of ['127.0.0.1:7070', '[::1]:7070', 'localhost:7070', 'localhost', 'dash.localhost:1', '10.0.0.5']) assert.ok(hostAllowed(host), host);
  for (const host of ['attacker.example', 'attacker.example:7070', '127.0.0.1.nip.io:80', '', '[::1', 'a b', 'localhost.attacker.example']) assert.ok(!hostAllowed(host), host);
  assert.ok(hostAllowed('Orch.Internal:7070', ['orch.internal']) && !hostAllowed('orch.internal', []));

  // logging out ends the session
  await app.inject({ method: 'POST', url: '/logout', headers: { cookie: session } });
  assert.deepEqual(JSON.parse((await app.inject({ method: 'GET', url: '/session', headers: { cookie: session } })).body), { operator: false, paid: false, operatorAddress: zeroAddress });
});

test("isLocalClient: loopback, and when forwarded, for a loopback client; the header believed only from this machine with the cluster key's proof", () => {
  const KEY = 'k'.repeat(64);
  const req = (remoteAddress: string | undefined, forwarded?: string | string[], proof: string | null | 'valid' = 'valid') => ({
    socket: { remoteAddress },
    method: 'GET',
    url: '/wallets',
    headers: {
      ...(forwarded === undefined ? {} : { [FORWARDED_FOR]: forwarded }),
      ...(forwarded !== undefined && proof !== null ? { [FORWARDED_PROOF]: proof === 'valid' ? forwardedProof(KEY, 'GET', '/wallets', String(forwarded)) : proof } : {}),
    },
  });
  assert.equal(FORWARDED_FOR, 'x-nimble-forwarded-for');
  assert.equal(isLocalClient(req('127.0.0.1'), KEY), true);
  assert.equal(isLocalClient(req('::1', '127.0.0.1'), KEY), true);
  assert.equal(isLocalClient(req('::ffff:127.0.0.1', '::ffff:127.0.0.2'), KEY), true);
  for (const [peer, forwarded] of [
    ['127.0.0.1', '10.1.2.3'],
    ['127.0.0.1', ''],
    ['127.0.0.1', '127.0.0.1, 10.1.2.3'],
    ['127.0.0.1', ['127.0.0.1', '127.0.0.1']],
    ['10.1.2.3', undefined],
    ['10.1.2.3', '127.0.0.1'],
    [undefined, undefined],
    [undefined, '127.0.0.1'],
  ] as const) assert.equal(isLocalClient(req(peer, forwarded as string | string[] | undefined), KEY), false, `${peer} for ${String(forwarded)}`);
  // without the proof, with a wrong one, or without a key to check it with: not believed (and not local)
  assert.equal(isLocalClient(req('127.0.0.1', '127.0.0.1', null), KEY), false);
  assert.equal(isLocalClient(req('127.0.0.1', '127.0.0.1', forwardedProof('x'.repeat(64), 'GET', '/wallets', '127.0.0.1')), KEY), false);
  assert.equal(isLocalClient(req('127.0.0.1', '127.0.0.1', forwardedProof(KEY, 'POST', '/wallets', '127.0.0.1')), KEY), false);
  assert.equal(isLocalClient(req('127.0.0.1', '127.0.0.1')), false);
  // the client's address: the header from a loopback peer with the proof only; else the peer
  assert.equal(clientAddressOf(req('127.0.0.1', '10.1.2.3'), KEY), '10.1.2.3');
  assert.equal(clientAddressOf(req('127.0.0.1', '10.1.2.3', null), KEY), '127.0.0.1');
  assert.equal(clientAddressOf(req('127.0.0.1', '10.1.2.3')), '127.0.0.1');
  assert.equal(clientAddressOf(req('10.9.9.9', '127.0.0.1'), KEY), '10.9.9.9');
  assert.equal(clientAddressOf(req(undefined)), '');
});

test('a login token is good once and for LOGIN_TOKEN_MS; a spent or expired one tells the next URL, which works once', () => {
  let now = 1_000_000;
  const told: string[] = [];
  const auth = new OperatorAuth(TOKEN, () => now, { onLoginPath: (path) => told.push(path) });
  assert.equal(auth.loginPath, `/login?token=${TOKEN}`);
  now += LOGIN_TOKEN_MS + 1;
  // expired unused: refused as spent, and a new URL is told
  assert.deepEqual(auth.login(TOKEN), { refused: 'spent' });
  assert.equal(told.length, 1);
  const next = told[0].split('token=')[1];
  assert.notEqual(next, TOKEN);
  assert.equal(auth.loginPath, told[0]);
  const ok = auth.login(next);
  assert.ok('session' in ok);
  assert.ok(auth.isOperator(`nimble_operator=${ok.session}`));
  // used: the next one is told at once; the used one is refused, the new one works (once)
  assert.equal(told.length, 2);
  assert.deepEqual(auth.login(next), { refused: 'spent' });
  assert.deepEqual(auth.login('y'.repeat(43)), { refused: 'wrong' });
  const third = told[1].split('token=')[1];
  assert.ok('session' in auth.login(third));
  assert.deepEqual(auth.login(third), { refused: 'spent' });
});

test('GET /events without a stream: every section now, each matching its contract; a curve of an unknown run is a 404', async () => {
  const r = await app.inject({ method: 'GET', url: '/events' });
  assert.equal(r.statusCode, 200);
  const body = JSON.parse(r.body) as Record<string, unknown>;
  for (const name of SECTION_NAMES) assert.ok(TypeCompiler.Compile(DashboardSections[name]).Check(body[name]), name);
  assert.equal((await app.inject({ method: 'GET', url: '/runs/r-nope/loss' })).statusCode, 404);
});

test('loss curves: steps only move forward, thinned past the limit (newest kept whole), drained once', () => {
  const h = new LossHistories({ maxPoints: 100, maxSeries: 2 });
  for (let step = 1; step <= 250; step++) h.record('run:a', step, 5 - step / 100, 1000, step);
  assert.equal(h.record('run:a', 250, 1, 1, 1), false, 'a repeated step is ignored');
  assert.equal(h.record('run:a', 10, 1, 1, 1), false, 'an older step is ignored');
  const curve = h.get('run:a');
  assert.ok(TypeCompiler.Compile(LossHistory).Check(curve));
  assert.ok(curve.points.length <= 100 && curve.points.length >= 50, String(curve.points.length));
  assert.equal(curve.points[curve.points.length - 1][0], 250);
  assert.deepEqual(curve.points.map((p) => p[0]), [...curve.points.map((p) => p[0])].sort((a, b) => a - b));
  const drained = h.drain();
  assert.equal(drained.length, 1);
  assert.equal(drained[0].points.length, 100, 'what was not yet sent stays whole up to the limit');
  assert.deepEqual(h.drain(), []);
  h.status('run:a', 'executing', 1);
  h.status('run:a', 'executing', 2);
  h.status('run:a', 'completed', 3);
  assert.deepEqual(h.get('run:a').statuses.map((s) => s.status), ['executing', 'completed']);
  h.record('run:b', 1, 1, 0, 1);
  h.record('run:c', 1, 1, 0, 1);
  assert.equal(h.size, 2);
  assert.deepEqual(h.get('run:a').points, [], 'the least recently updated curve is forgotten');
  assert.equal(h.record('run:b', 2, Number.NaN, 0, 1), false);
});

test('NIM for people: rounded half up to 4 decimals (4 significant digits below 1), exact strings untouched elsewhere', () => {
  assert.equal(displayNim('99.999999999999999997'), '100');
  assert.equal(displayNim('1.23456'), '1.2346');
  assert.equal(displayNim('0.000012345'), '0.00001235');
  assert.equal(displayNim('0'), '0');
  assert.equal(displayNim('-2.50005'), '-2.5001');
  assert.equal(displayNim('12.5'), '12.5');
  assert.equal(displayNim('not a number'), 'not a number');
});
