// Several orchestrators on one PostgreSQL database, one S3 bucket and one
// chain (real servers, started here): one leads, the others answer by
// forwarding to it. The leader is killed with SIGKILL mid-run, between the
// chain taking an epoch's rewards and its recording them; the follower takes
// over within seconds on its own port and finishes that settlement. A miner
// that talked to the leader moves to the follower's URL (its second); one
// that talked to the follower sees a pause. The run completes with every
// microbatch credited once per hop and each epoch paid once. Then the new
// leader is frozen (SIGSTOP) until a third orchestrator takes over, and
// woken: its lease is gone, so it stops (that none of its writes can land is
// test/orchestrator/cluster/lease.test.ts).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { localNodePaths } from '../../src/chain/node.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { queryDatabase, startPostgres, type PostgresServer } from '../helpers/postgres-server.ts';
import { startS3, type TestS3 } from '../helpers/s3-server.ts';
import { Cluster, type Proc } from './helpers.ts';
import { assertEachEpochPaidOnce } from './paid-once.ts';

const cluster = new Cluster();
let server: PostgresServer;
let db: string;
let s3: TestS3;
const PASSWORD = 'pw-orchestrators';
before(async () => {
  [server, s3] = await Promise.all([startPostgres(), startS3('nimble-orchestrators')]);
  db = await server.createDatabase();
  process.env.AWS_ACCESS_KEY_ID = 'S3RVER';
  process.env.AWS_SECRET_ACCESS_KEY = 'S3RVER';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  process.env.NIMBLE_CHAIN_RPC = '';
});
after(async () => {
  // the chain node outlives the leader that started it (the next ones used it): stop it too, found before the folder goes
  const node = localNodePid(home());
  await cluster.stop();
  if (node !== null) {
    try {
      process.kill(node, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  await Promise.all([server?.close(), s3?.close()]);
});

function localNodePid(dataDir: string): number | null {
  try {
    return (JSON.parse(readFileSync(localNodePaths(dataDir).node, 'utf8')) as { pid: number }).pid;
  } catch {
    return null;
  }
}

const query = <T extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<T[]> => queryDatabase<T>(db, text, values);

/** The data dir the orchestrators share on this machine: the local chain node (the first one runs it, the others use it) and the wallets. */
const home = (): string => join(cluster.dir, 'orch');

/** Starts one orchestrator of the cluster; resolves with its process and its `listening` event. */
async function startMember(args: string[]): Promise<{ proc: Proc; listening: Record<string, unknown> }> {
  const blobs = `s3://${s3.bucket}/net?endpoint=${encodeURIComponent(s3.endpoint)}&region=us-east-1`;
  const proc = cluster.spawnNbcli(['orchestrator', 'start', '--port', '0', '--db', db, '--blobs', blobs, '--lease-ttl', '2s', ...args], home());
  const listening = await proc.waitFor((v) => v.event === 'listening');
  return { proc, listening };
}

function exited(p: Proc): Promise<number | null> {
  return new Promise((r) => (p.child.exitCode !== null || p.child.signalCode !== null ? r(p.child.exitCode) : p.child.once('exit', (code) => r(code))));
}

test('two orchestrators share one database, bucket and chain: the leader is killed mid-run in the middle of a settlement, the follower takes over within seconds, nothing is lost, counted or paid twice; a frozen leader woken after a takeover stops', async (t) => {
  const args = ['--min-stake', '0', '--epoch-rounds', '1', '--emission', '10', '--check-rate', '0'];
  // the first leader pauses between the chain taking an epoch and recording it (a test-only hook): it is killed there
  process.env.NIMBLE_TEST_SETTLE_PAUSE_MS = '60000';
  let a;
  try {
    a = await startMember(args);
  } finally {
    delete process.env.NIMBLE_TEST_SETTLE_PAUSE_MS;
  }
  assert.equal(a.listening.role, 'leader');
  assert.match(String(a.listening.login), /^http:\/\/127\.0\.0\.1:\d+\//, 'a leader from the start prints its login URL with `listening`');
  const b = await startMember(args);
  assert.equal(b.listening.role, 'follower');
  assert.notEqual(a.listening.url, b.listening.url);
  // the dashboard through the follower: a client of this machine is local to the leader (the follower proves whom it forwards
  // for with the lease term's key); straight to the leader, a process that names a client itself is believed by nobody
  assert.equal((await fetch(`${b.listening.url}/wallets`)).status, 200);
  assert.equal((await fetch(`${a.listening.url}/wallets`, { headers: { 'x-nimble-forwarded-for': '127.0.0.1' } })).status, 403);

  // m1 talks to the leader first, with the follower as its second URL; m2 and the developer talk to the follower
  const wallets = ['m1', 'm2'].map((n) => saveWallet(join(cluster.dir, n), `w-${n}`, generatePrivateKey(), PASSWORD, 'light'));
  cluster.url = b.listening.url as string;
  const m1 = cluster.spawnNbcli(['miner', 'start', '--orchestrator', `${a.listening.url},${b.listening.url}`, '--name', 'm1', '--threads', '1', '--wallet.name', 'w-m1'], join(cluster.dir, 'm1'));
  await Promise.all([m1.waitFor((v) => v.event === 'started'), cluster.startMiner('m2', ['--wallet.name', 'w-m2'])]);
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 40, stages: 2, mergeEvery: 5, batchSize: 8, minMiners: 2 });

  const paused = await a.proc.waitFor((v) => v.event === 'log' && /pausing .* before recording it/.test(String(v.message)), 120_000);
  const chainEpoch = BigInt(/as epoch (\d+)/.exec(String(paused.message))![1]);
  const killedAt = Date.now();
  a.proc.child.kill('SIGKILL');
  const leading = await b.proc.waitFor((v) => v.event === 'leading', 30_000);
  const takeoverMs = Date.now() - killedAt;
  assert.equal(leading.url, b.listening.url, 'it leads on the port it answered on');
  assert.ok(!a.proc.lines.some((l) => l.includes('"event":"leading"')), '`leading` is only for a takeover');
  assert.ok(takeoverMs < 10_000, `took over in ${takeoverMs} ms`);
  t.diagnostic(`takeover after kill -9 of the leader: ${takeoverMs} ms (lease ttl 2 s)`);
  // m1 moved to the URL that answers
  await m1.waitFor((v) => typeof v.message === 'string' && v.message.includes(`now using ${b.listening.url}`), 30_000);
  // a third one follows the new leader
  const c = await startMember(args);
  assert.equal(c.listening.role, 'follower');

  const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 180_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.ok(done.mergesDone >= 2, `${done.mergesDone} merges`);
  // each completed microbatch is one forward and one backward per stage, across both leaders
  const work = await cluster.api.work();
  const total = (kind: string): number => work.filter((w) => w.kind === kind).reduce((s, w) => s + w.units, 0);
  assert.equal(total('forward'), 2 * done.microbatchesDone);
  assert.equal(total('backward'), 2 * done.microbatchesDone);
  // the epoch the killed leader was settling is settled once, by the new leader, and every epoch is paid once
  await assertEachEpochPaidOnce(() => cluster.epochs(), home(), wallets, chainEpoch);
  const [lease] = await query<{ holder: string; term: string }>('SELECT holder, term FROM nimble_lease');
  assert.equal(Number(lease.term), 2);
  assert.equal(lease.holder, b.listening.holder);

  // freeze the leader: the third takes over once the lease expires; woken, the old leader finds its lease gone and stops
  b.proc.child.kill('SIGSTOP');
  const cLeads = await c.proc.waitFor((v) => v.event === 'leading', 30_000);
  b.proc.child.kill('SIGCONT');
  assert.equal(await exited(b.proc), 3, b.proc.lines.slice(-10).join('\n'));
  assert.ok(b.proc.lines.some((l) => /stopped leading/.test(l)), b.proc.lines.slice(-10).join('\n'));
  // the network answers through its new leader
  assert.equal(cLeads.url, c.listening.url);
  assert.equal((await new OrchestratorClient(cLeads.url as string).run(run.id)).status, 'completed');
});
