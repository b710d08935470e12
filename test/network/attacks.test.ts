// Attacks on a running network from outside it, on real processes: an
// orchestrator and two honest miners, each a child process, training one run,
// and an attacker in this process with keys of its own. Runs are the owner's:
// creating one is signed, one owner's runs and the runs waiting are capped, a
// run is cancelled (its miners freed) and its checkpoint read only by its
// owner. A request signed before the orchestrator restarted is not taken
// after it. A miner takes frames only from the neighbours the orchestrator
// named it. Through all of it the honest miners keep training and are
// charged nothing. (Cheating miners: ./byzantine.test.ts; malformed input:
// ./fuzz.test.ts.)
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { findNetwork } from '../../src/api/network.ts';
import type { RunView } from '../../src/api/schemas.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';
import { MAX_ACTIVE_RUNS_PER_OWNER, MAX_WAITING_RUNS } from '../../src/orchestrator/training/run-planner.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let run: RunView;

before(async () => {
  await cluster.startOrchestrator();
  await Promise.all(['a', 'b'].map((n) => cluster.startMiner(n)));
  run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 1_000_000, stages: 2, batchSize: 4, mergeEvery: 50, minMiners: 2 });
  await cluster.waitRun(run.id, (v) => v.microbatchesDone >= 3);
});
after(() => cluster.stop());

/** Resolves once the honest run has done `more` microbatches beyond now. */
async function progresses(more = 5): Promise<void> {
  const from = (await cluster.run(run.id)).microbatchesDone;
  await cluster.waitRun(run.id, (v) => v.microbatchesDone >= from + more, 60_000);
}

const refused = (status: number, code?: string) => (err: unknown): boolean => err instanceof NimbleError && err.status === status && (code === undefined || err.code === code);

test('runs are their owner\'s: creating is signed, an owner holds at most 4 runs and the network 64 waiting ones, only the owner cancels or reads the checkpoint', async () => {
  // unsigned: 401, and nothing recorded
  const before = (await cluster.api.runs()).length;
  const unsigned = await fetch(`${cluster.url}/runs`, { method: 'POST', body: JSON.stringify({ model: 'gpt-micro', data: 'moby-dick', steps: 10 }), headers: { 'content-type': 'application/json' } });
  assert.equal(unsigned.status, 401);
  assert.equal((await cluster.api.runs()).length, before);

  // another key can neither cancel the honest run nor read its checkpoint
  const stranger = new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() });
  await assert.rejects(() => stranger.cancelRun(run.id), refused(403, 'forbidden'));
  await assert.rejects(() => stranger.checkpoint(run.id), refused(403, 'forbidden'));

  // one owner: 4 runs that have not ended (they wait: every miner is busy), the 5th refused
  const greedy = new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() });
  const mine: RunView[] = [];
  for (let i = 0; i < MAX_ACTIVE_RUNS_PER_OWNER; i++) mine.push(await greedy.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 10 }));
  assert.ok(mine.every((r) => r.status === 'waiting'));
  await assert.rejects(() => greedy.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 10 }), refused(429, 'too_many_runs'));

  // many owners: the network's waiting runs are capped (503), and the honest run trains on meanwhile
  const owners = Array.from({ length: Math.ceil(MAX_WAITING_RUNS / MAX_ACTIVE_RUNS_PER_OWNER) + 1 }, () => new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }));
  const attempts = owners.flatMap((owner) => Array.from({ length: MAX_ACTIVE_RUNS_PER_OWNER }, () => ({ owner, result: owner.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 10 }) })));
  const outcomes = await Promise.allSettled(attempts.map((a) => a.result));
  const created = outcomes.flatMap((o, i) => (o.status === 'fulfilled' ? [{ owner: attempts[i].owner, run: o.value }] : []));
  const overloaded = outcomes.filter((o) => o.status === 'rejected' && refused(503, 'overloaded')(o.reason));
  assert.equal(created.length + mine.length, MAX_WAITING_RUNS, 'waiting runs stop at the cap');
  assert.equal(overloaded.length, outcomes.length - created.length, 'the rest are refused as overloaded, nothing else');
  await progresses();

  // each owner cancels its own; a cancelled run is final and its slot is free again
  const cancelled = await greedy.cancelRun(mine[0].id);
  assert.equal(cancelled.status, 'cancelled');
  await assert.rejects(() => greedy.cancelRun(mine[0].id), refused(409, 'conflict'));
  await assert.rejects(() => stranger.cancelRun(mine[1].id), refused(403, 'forbidden'));
  const again = await greedy.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 10 });
  assert.equal(again.status, 'waiting');
  await Promise.all([...mine.slice(1), again].map((r) => greedy.cancelRun(r.id)));
  await Promise.all(created.map((c) => c.owner.cancelRun(c.run.id)));
  assert.equal((await cluster.api.runs()).filter((r) => r.status === 'waiting').length, 0);
  await progresses();
});

test('a request signed before the orchestrator restarted is refused after it; the honest miners re-attach and train on', async () => {
  const { domain } = await findNetwork(cluster.url);
  const signer = new RequestSigner(generatePrivateKey(), { domain });
  const body = new Uint8Array(1024);
  const headers = { ...(await signer.sign('POST', '/bandwidth', body)), 'content-type': 'application/octet-stream' };
  assert.equal((await fetch(`${cluster.url}/bandwidth`, { method: 'POST', body, headers })).status, 200);
  // replayed at once: its nonce is spent
  assert.equal((await fetch(`${cluster.url}/bandwidth`, { method: 'POST', body, headers })).status, 401);
  cluster.orchestrator!.child.kill('SIGKILL');
  await new Promise((r) => cluster.orchestrator!.child.once('exit', r));
  await cluster.startOrchestrator(); // same port, same data dir: the nonces it had seen are gone
  const replay = await fetch(`${cluster.url}/bandwidth`, { method: 'POST', body, headers });
  assert.equal(replay.status, 401);
  assert.match(((await replay.json()) as { error: string }).error, /before this server started|too old/);
  // a fresh signature is taken
  assert.equal((await fetch(`${cluster.url}/bandwidth`, { method: 'POST', body, headers: { ...(await signer.sign('POST', '/bandwidth', body)), 'content-type': 'application/octet-stream' } })).status, 200);
  await progresses();
});

test('a joined miner that is nobody\'s neighbour cannot make a real miner compute, and the honest miners were charged nothing', async () => {
  const { domain } = await findNetwork(cluster.url);
  const wallet = new RequestSigner(generatePrivateKey(), { domain });
  const session = SessionKey.generate();
  const joinBody = new TextEncoder().encode(JSON.stringify({ name: 'stranger', url: 'http://127.0.0.1:9', hardware: { gflops: 0.001, threads: 1, memoryBytes: 1 }, bandwidthMbps: 1, sessionKey: session.publicKey }));
  const joined = await fetch(`${cluster.url}/miners/join`, { method: 'POST', body: joinBody, headers: { ...(await wallet.sign('POST', '/miners/join', joinBody)), 'content-type': 'application/json' } });
  assert.equal(joined.status, 200);
  const sessionSigner = new RequestSigner({ session, address: wallet.address }, { domain });
  const view = await cluster.run(run.id);
  const miners = await cluster.api.miners();
  const stage1 = miners.find((m) => m.id === view.stages[1].replicas[0].id)!;
  const frame = encodeFrame(new Float32Array(4 * 16 * 16).fill(0.5), [4 * 16, 16], 'f16', { runId: run.id, microbatch: 1, attempt: 1, shard: 0, step: 0, stage: 1, ticket: 'A'.repeat(86) });
  for (const signer of [sessionSigner, wallet]) {
    const res = await fetch(`${stage1.url}/forward`, { method: 'POST', body: frame as BodyInit, headers: { ...(await signer.sign('POST', '/forward', frame)), 'content-type': 'application/octet-stream' } });
    assert.equal(res.status, 401, 'not a neighbour the orchestrator named');
  }
  await progresses();
  const work = await cluster.api.work();
  const honest = new Set(miners.filter((m) => m.name === 'a' || m.name === 'b').map((m) => m.id));
  const charged = work.filter((w) => honest.has(w.miner) && ['dropped', 'invalid', 'failed_check'].includes(w.kind));
  assert.deepEqual(charged, [], 'no honest miner was charged for anything');
});
