// Who may read what, on a real paid network (an orchestrator on its local
// chain, two miner processes, nbcli): the attacks of issue 33's first section,
// each refused.
//   - A throwaway-key miner and an outsider try to read a developer's blobs of
//     every kind (dataset, checkpoint, a run's initial state, an unpublished
//     model, a stage's merged state, a merge round's slice and merged
//     partition) over every route that serves blob bytes: all refused, while
//     the miners that train the job read what their work names (the job's
//     grouped run merges) and the owner reads its own; the model's file is
//     public once it is published.
//   - An anonymous reader of a job gets its public part only (counts and
//     states), its owner the whole (nbcli job status and list too); the list
//     is paginated.
//   - One client cannot take every event stream: the slots are bounded per
//     address and per signer, and a forged x-nimble-forwarded-for does not
//     make a loopback client another client.
//   - A DNS-rebinding page (a Host that is not this server's) reads nothing
//     of the dashboard; a login URL works once (a replayed one is refused) and
//     the next one printed works.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { request, type ClientRequest, type IncomingMessage } from 'node:http';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { saveWallet } from '../../src/chain/wallets.ts';
import { findNetwork } from '../../src/api/network.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';
import { attemptBlobReads, buildBlobWorld, getStatus, joinAttackers, type Attackers, type BlobWorld } from '../helpers/blob-reads.ts';
import { MAX_EVENT_STREAMS, MAX_EVENT_STREAMS_PER_CLIENT, MAX_EVENT_STREAMS_PER_SIGNER } from '../../src/orchestrator/routes/jobs.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let world: BlobWorld;
let attackers: Attackers;
const PASSWORD = 'reads-test';

before(async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--miner-timeout-ms', '4000'], { chain: true });
  await Promise.all(['m1', 'm2'].map((n) => cluster.startMiner(n)));
  const t0 = performance.now();
  world = await buildBlobWorld(cluster, (line) => console.log(`# ${line}`));
  console.log(`# the world of private blobs built in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  attackers = await joinAttackers(cluster.url);
  // the developer's wallet in the orchestrator's data dir (its chain), for nbcli
  saveWallet(join(cluster.dir, 'orch'), 'dev', world.devKey, PASSWORD, 'light');
});
after(() => cluster.stopGracefully());

test('a throwaway-key miner and an outsider read none of a developer’s blobs, of any kind, over any route; the miners at work and the owner do', async () => {
  const attempts = await attemptBlobReads(cluster.url, world, attackers);
  const read = attempts.filter((a) => a.status >= 200 && a.status < 300);
  assert.deepEqual(read.map((a) => `${a.who} read ${a.kind} by ${a.route}: ${a.status}, ${a.bytes} bytes`), [], 'every attempt is refused');
  // the refusals say why, in the error contract (a miner's and an outsider's 403; a wallet at a miners' route 401; no such model 404)
  assert.ok(attempts.every((a) => [401, 403, 404].includes(a.status)), JSON.stringify(attempts.filter((a) => ![401, 403, 404].includes(a.status))));
  assert.ok(attempts.filter((a) => a.route.startsWith('GET /blobs/:id (miner')).every((a) => a.status === 403));
  console.log(`# ${attempts.length} reads tried, ${attempts.length - read.length} refused`);

  // the miners that train it read what their work names: the grouped run (from the job's checkpoint, on its dataset) merges on
  const before = await cluster.run(world.runId);
  const later = await cluster.waitRun(world.runId, (v) => v.mergesDone > before.mergesDone && v.microbatchesDone > before.microbatchesDone, 120_000);
  assert.ok(later.mergesDone > before.mergesDone);

  // the owner reads its own: the checkpoint and the unpublished model
  const { domain } = await findNetwork(cluster.url);
  const owner = new RequestSigner(world.devKey, { domain });
  assert.equal((await getStatus(cluster.url, `/jobs/${world.jobId}/checkpoints/${world.step}`, owner)).status, 200);
  const file = await getStatus(cluster.url, `/models/${world.modelSha}/file`, owner);
  assert.deepEqual(file, { status: 200, bytes: world.modelBytes.length });

  // once published (nbcli model publish, from the developer's wallet), the model's file is anyone's
  const home = join(cluster.dir, 'orch');
  const modelFile = join(cluster.dir, 'draft.safetensors');
  writeFileSync(modelFile, world.modelBytes);
  const published = await cluster.nbcli(['model', 'publish', '--file', modelFile, '--name', 'draft', '--wallet.name', 'dev', '--orchestrator', cluster.url], home);
  assert.equal(published.code, 0, published.stderr);
  const end = Date.now() + 15_000;
  let anonymous = await getStatus(cluster.url, `/models/${world.modelSha}/file`, null);
  while (anonymous.status !== 200 && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 500));
    anonymous = await getStatus(cluster.url, `/models/${world.modelSha}/file`, null);
  }
  assert.deepEqual(anonymous, { status: 200, bytes: world.modelBytes.length }, 'a published model is public');
});

test('an anonymous reader of a job gets its public part (counts and states), its owner the whole; the list is paginated', async () => {
  const job = (await (await fetch(`${cluster.url}/jobs/${world.jobId}`)).json()) as Record<string, unknown>;
  assert.deepEqual(Object.keys(job).sort(), ['checkpoints', 'createdAt', 'endedAt', 'id', 'startedAt', 'status', 'step', 'steps', 'tokens', 'tokensPerSecond']);
  assert.equal(typeof job.checkpoints, 'number', 'a count, not the checkpoints and their hashes');
  for (const secret of [world.dev, world.dev.toLowerCase(), 'private', world.blobs[0].id, world.blobs[1].id]) assert.ok(!JSON.stringify(job).includes(secret), `the public view shows ${secret}`);
  const events = (await (await fetch(`${cluster.url}/jobs/${world.jobId}/events`)).json()) as { kind: string; message: string }[];
  assert.ok(events.length >= 2);
  assert.ok(events.every((e) => e.kind === 'status' && e.message === ''), JSON.stringify(events));
  assert.equal((await fetch(`${cluster.url}/jobs/${world.jobId}/checkpoints`)).status, 403);
  assert.equal((await fetch(`${cluster.url}/jobs/${world.jobId}/checkpoints/keep?days=2`)).status, 403);
  // a stranger's signature is no better
  const stranger = await getStatus(cluster.url, `/jobs/${world.jobId}/checkpoints`, attackers.outsider);
  assert.equal(stranger.status, 403);

  // the list: newest first, a page at a time, public parts only
  // (the miners train the first job: these wait)
  const submitted = [await world.jobs.submit({ name: 'second', model: 'gpt-micro', data: 'moby-dick', training: { steps: 5 } }), await world.jobs.submit({ name: 'third', model: 'gpt-micro', data: 'moby-dick', training: { steps: 5 } })];
  const ids: string[] = [];
  let cursor: string | null = null;
  for (let pages = 0; pages < 10; pages++) {
    const page = (await (await fetch(`${cluster.url}/jobs?limit=1${cursor ? `&cursor=${cursor}` : ''}`)).json()) as { jobs: Record<string, unknown>[]; next: string | null };
    assert.equal(page.jobs.length, 1);
    assert.equal(page.jobs[0].spec, undefined);
    ids.push(page.jobs[0].id as string);
    cursor = page.next;
    if (!cursor) break;
  }
  assert.deepEqual(ids, [submitted[1].id, submitted[0].id, world.jobId]);
  assert.equal((await fetch(`${cluster.url}/jobs?limit=100000`)).status, 400, 'a page has a cap');

  // its owner sees the whole, signed: through the API and nbcli
  const whole = await world.jobs.get(world.jobId);
  assert.equal(whole.owner, world.dev);
  assert.ok(Array.isArray(whole.checkpoints) && whole.checkpoints.length >= 1);
  const home = join(cluster.dir, 'orch');
  const status = await cluster.nbcli(['job', 'status', world.jobId, '--wallet.name', 'dev', '--orchestrator', cluster.url], home);
  assert.equal(status.code, 0, status.stderr);
  assert.equal((status.out[0] as Record<string, unknown>).owner, world.dev);
  const mine = await cluster.nbcli(['job', 'list', '--mine', '--wallet.name', 'dev', '--orchestrator', cluster.url], home);
  assert.equal(mine.code, 0, mine.stderr);
  assert.deepEqual((mine.out[0] as unknown as { id: string; spec: unknown }[]).map((j) => [j.id, typeof j.spec]), [[submitted[1].id, 'object'], [submitted[0].id, 'object'], [world.jobId, 'object']]);
  // and anyone else, the public part
  const others = await cluster.nbcli(['job', 'status', world.jobId, '--orchestrator', cluster.url], join(cluster.dir, 'someone'));
  assert.equal(others.code, 0, others.stderr);
  assert.equal((others.out[0] as Record<string, unknown>).owner, undefined);
  for (const j of submitted) await world.jobs.cancel(j.id);
});

/** Opens a job's event stream from `localAddress` (a loopback address of its own), signed or not; resolves with its status once the head arrives. */
function openStream(path: string, localAddress: string, headers: Record<string, string>, open: ClientRequest[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const u = new URL(cluster.url);
    const req = request({ hostname: u.hostname, port: u.port, path, localAddress, agent: false, headers: { accept: 'text/event-stream', ...headers } }, (res: IncomingMessage) => {
      res.on('data', () => {});
      res.on('error', () => {});
      if (res.statusCode !== 200) res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', reject);
    open.push(req);
    req.end();
  });
}

test('one client cannot take every event stream: slots are bounded per address and per signer; a forged x-nimble-forwarded-for makes no other client', async () => {
  // the job still runs: its streams stay open
  assert.equal((await world.jobs.get(world.jobId)).status, 'executing');
  const path = `/jobs/${world.jobId}/events`;
  const open: ClientRequest[] = [];
  try {
    // one address: its MAX_EVENT_STREAMS_PER_CLIENT (16) streams, then 429 (a forged forwarded-for, without a forwarder's proof, is still this address)
    const mine = [];
    for (let i = 0; i < MAX_EVENT_STREAMS_PER_CLIENT; i++) mine.push(await openStream(path, '127.0.0.1', {}, open));
    assert.deepEqual(mine, Array(MAX_EVENT_STREAMS_PER_CLIENT).fill(200));
    assert.equal(await openStream(path, '127.0.0.1', {}, open), 429);
    for (const forged of ['10.0.0.1', '10.0.0.2', '127.0.0.9']) assert.equal(await openStream(path, '127.0.0.1', { 'x-nimble-forwarded-for': forged }, open), 429, `forged ${forged}`);
    assert.equal(await openStream(path, '127.0.0.1', { 'x-nimble-forwarded-for': '10.0.0.3', 'x-nimble-forwarded-proof': 'a'.repeat(64) }, open), 429);
    // another client still gets one
    assert.equal(await openStream(path, '127.0.0.2', {}, open), 200);
    // one signer from many addresses: MAX_EVENT_STREAMS_PER_SIGNER (8), then 429
    const signed = [];
    for (let i = 0; i <= MAX_EVENT_STREAMS_PER_SIGNER; i++) signed.push(await openStream(path, `127.0.1.${i + 1}`, await attackers.outsider.sign('GET', path), open));
    assert.deepEqual(signed, [...Array(MAX_EVENT_STREAMS_PER_SIGNER).fill(200), 429]);
    // and in all: MAX_EVENT_STREAMS, however many clients (16 + 1 + 8 are open; 231 more from many addresses fill it)
    const fill = [];
    for (let i = 0; i < MAX_EVENT_STREAMS - 25; i++) fill.push(openStream(path, `127.0.2.${Math.floor(i / MAX_EVENT_STREAMS_PER_CLIENT) + 1}`, {}, open));
    assert.ok((await Promise.all(fill)).every((x) => x === 200));
    assert.equal(await openStream(path, '127.0.3.1', {}, open), 503);
  } finally {
    for (const r of open) r.destroy();
  }
  // closed streams free their slots
  await new Promise((r) => setTimeout(r, 1000));
  const again: ClientRequest[] = [];
  try {
    assert.equal(await openStream(path, '127.0.0.1', {}, again), 200);
  } finally {
    for (const r of again) r.destroy();
  }
});

test("a DNS-rebinding page (another site's name in Host) reads nothing of the dashboard; this server's addresses do", async () => {
  const port = new URL(cluster.url).port;
  for (const path of ['/', '/wallets', '/events', `/jobs/${world.jobId}/loss`]) {
    const rebound = await getStatus(cluster.url, path, null, { host: `attacker.example:${port}` });
    assert.equal(rebound.status, 403, `${path} for attacker.example`);
    const own = await getStatus(cluster.url, path, null, { host: `127.0.0.1:${port}` });
    assert.notEqual(own.status, 403, `${path} for 127.0.0.1`);
  }
  assert.equal((await getStatus(cluster.url, '/wallets', null, { host: `localhost:${port}` })).status, 200);
});

test('a login URL logs in once: replayed, it is refused; the next one the orchestrator printed works once', async () => {
  const login = async (url: string): Promise<{ status: number; cookie: string | null }> => {
    const res = await fetch(url, { redirect: 'manual' });
    await res.arrayBuffer();
    return { status: res.status, cookie: res.headers.get('set-cookie') };
  };
  const first = await login(cluster.loginUrl);
  assert.equal(first.status, 303);
  assert.match(first.cookie ?? '', /^nimble_operator=/);
  const replayed = await login(cluster.loginUrl);
  assert.deepEqual(replayed, { status: 403, cookie: null }, 'the same URL again (a browser history, a log) logs nobody in');
  const next = await cluster.orchestrator!.waitFor((v) => v.event === 'login' && typeof v.login === 'string' && v.login !== cluster.loginUrl, 10_000);
  assert.equal((await login(next.login as string)).status, 303);
  assert.equal((await login(next.login as string)).status, 403);
});
