// The miner's peer API in process (fastify inject, no child processes): every
// refusal is a 4xx with the error contract's code, is counted, and reports
// its verified sender; good frames are queued.
import assert from 'node:assert/strict';
import { after, before, beforeEach, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Engine } from '../../src/engine/engine.ts';
import type { HttpServer } from '../../src/http/server.ts';
import { buildPeerApi, MAX_QUEUE, Refusals, type MinerStats, type PeerWork } from '../../src/miner/peer-api.ts';
import type { Job } from '../../src/miner/pipeline.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/gpt.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import type { StageAssignment } from '../../src/protocol/messages.ts';
import { RequestSigner, RequestVerifier } from '../../src/protocol/signing.ts';

const model = 'gpt-micro';
const B = 2, T = 16, C = 16;
const MAX_FRAME = 1 << 16;
const peer = new RequestSigner(generatePrivateKey());
const prevHop = { id: peer.address, url: 'http://127.0.0.1:9' };

let engine: Engine;
let runner: StageRunner;
let app: HttpServer;
let held: StageRunner | null;
let jobs: Job[];
let queuedOverride: number | null;
let refusals: Refusals;
let stats: MinerStats;

before(async () => {
  engine = await Engine.create({ threads: 1 });
  const range = splitEvenly(gptConfig(model), 3)[1];
  const a: StageAssignment = {
    runId: 'run-1', stage: 1, stageCount: 3, from: range.from, to: range.to, model, data: 'moby-dick',
    batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2,
  };
  runner = new StageRunner(engine, a, 2); // a middle stage: no corpus
  const work: PeerWork = {
    get runner() {
      return held;
    },
    get queued() {
      return queuedOverride ?? jobs.length;
    },
    push: (job) => void jobs.push(job),
  };
  refusals = new Refusals();
  stats = { forward: 0, backward: 0, merges: 0, bytesSent: 0, rejected: 0 };
  app = buildPeerApi({
    verifier: new RequestVerifier(),
    work,
    refusals,
    stats,
    health: () => ({ ok: true, address: peer.address, stage: { runId: 'run-1', stage: 1, round: 0 }, stats }),
    log: () => {},
    maxFrameBytes: MAX_FRAME,
  });
  await app.ready();
});

after(async () => {
  await app.close();
  runner.dispose();
  await engine.close();
});

beforeEach(() => {
  held = runner;
  jobs = [];
  queuedOverride = null;
  refusals.take();
});

const forwardMeta = { runId: 'run-1', microbatch: 7, shard: 3, step: 0, stage: 1, route: [prevHop] };
const activation = (meta: object = forwardMeta, rows = B * T): Uint8Array => encodeFrame(new Float32Array(rows * C).fill(0.5), [rows, C], 'f16', meta as never);

async function post(path: string, body: Uint8Array, opts: { signed?: boolean; contentType?: string } = {}): Promise<{ status: number; error: string; code: string; body: Record<string, unknown> }> {
  const headers: Record<string, string> = { 'content-type': opts.contentType ?? 'application/octet-stream' };
  if (opts.signed !== false) Object.assign(headers, await peer.sign('POST', path, body));
  const res = await app.inject({ method: 'POST', url: path, headers, payload: Buffer.from(body) });
  const json = res.json() as Record<string, unknown>;
  return { status: res.statusCode, error: String(json.error ?? ''), code: String(json.code ?? ''), body: json };
}

test('a good signed forward is queued (202)', async () => {
  const frame = activation();
  const r = await post('/forward', frame);
  assert.equal(r.status, 202, r.error);
  assert.deepEqual(r.body, { queued: 1 });
  assert.equal(jobs.length, 1);
  const job = jobs[0];
  assert.equal(job.kind, 'forward');
  if (job.kind !== 'forward') return;
  assert.deepEqual(job.meta, forwardMeta);
  assert.equal(job.data.length, B * T * C);
  assert.deepEqual(job.frame, frame);
  assert.match(job.sha, /^[0-9a-f]{64}$/);
  assert.equal(stats.rejected, 0);
  assert.deepEqual(refusals.take(), []);
});

test('a gradient for a held microbatch is queued (202)', async () => {
  runner.forwardMiddle(11, new Float32Array(B * T * C).fill(0.1));
  try {
    const r = await post('/backward', activation({ runId: 'run-1', microbatch: 11, stage: 1 }));
    assert.equal(r.status, 202, r.error);
    assert.equal(jobs.length, 1);
    assert.equal(jobs[0].kind, 'backward');
  } finally {
    runner.release(11);
  }
});

test('refusals: 4xx with the contract code, counted, reported with the verified sender', async () => {
  const good = activation();
  const corrupt = good.slice();
  corrupt[corrupt.length - 1] ^= 0xff;
  const cases: [string, string, Uint8Array, number, string, RegExp][] = [
    ['bad frame (checksum)', '/forward', corrupt, 400, 'checksum', /checksum/],
    ['bad frame (garbage)', '/forward', new TextEncoder().encode('NIMF garbage'), 400, 'bad_version', /version/],
    ['bad frame (magic)', '/forward', Uint8Array.from([0x58, 0x58, 0x58, 0x58, ...good.subarray(4)]), 400, 'bad_magic', /NIMF|magic/],
    ['wrong shape', '/forward', activation(forwardMeta, 8), 400, 'shape_mismatch', /shape/],
    ['bad meta', '/forward', activation({ runId: 'run-1', microbatch: 0 }), 400, 'invalid', /invalid forward meta/],
    ['stage not held', '/forward', activation({ ...forwardMeta, stage: 2, route: [prevHop, prevHop] }), 409, 'conflict', /holds stage 1 of run-1/],
    ['stage 0', '/forward', activation({ ...forwardMeta, stage: 0, route: [] }), 409, 'conflict', /holds stage 1/],
    ['another run', '/forward', activation({ ...forwardMeta, runId: 'run-other' }), 409, 'conflict', /run-other/],
    ['bad route', '/forward', activation({ ...forwardMeta, route: [prevHop, prevHop] }), 400, 'invalid', /route has 2 hops for stage 1/],
    ['gradient not held', '/backward', activation({ runId: 'run-1', microbatch: 424242, stage: 1 }), 409, 'conflict', /microbatch 424242 is not held here/],
    ['gradient for another stage', '/backward', activation({ runId: 'run-1', microbatch: 1, stage: 0 }), 409, 'conflict', /gradient for run run-1 stage 0/],
    ['a JSON body', '/forward', new TextEncoder().encode('{"a":1}'), 400, 'invalid', /body/],
  ];
  for (const [label, path, body, status, code, pattern] of cases) {
    const r = await post(path, body, { contentType: label === 'a JSON body' ? 'application/json' : undefined });
    assert.equal(r.status, status, `${label}: ${r.error}`);
    assert.equal(r.code, code, label);
    assert.match(r.error, pattern, label);
  }
  assert.equal(jobs.length, 0, 'nothing refused is queued');
  assert.equal(stats.rejected, cases.length);
  const reported = refusals.take();
  assert.equal(reported.length, cases.length);
  for (const [i, r] of reported.entries()) {
    assert.equal(r.sender, peer.address, cases[i][0]);
    assert.match(r.reason, cases[i][5], cases[i][0]);
  }
});

test('no stage held: 409', async () => {
  held = null;
  const r = await post('/forward', activation());
  assert.equal(r.status, 409);
  assert.equal(r.error, 'this miner holds no stage');
  assert.equal(refusals.take()[0].sender, peer.address);
});

test('unsigned: 401; oversized: 413; neither has a verified sender to report', async () => {
  const before = stats.rejected;
  const unsigned = await post('/forward', activation(), { signed: false });
  assert.equal(unsigned.status, 401);
  assert.equal(unsigned.code, 'missing');
  const huge = await post('/forward', new Uint8Array(MAX_FRAME + 1));
  assert.equal(huge.status, 413);
  assert.equal(huge.code, 'too_large');
  assert.equal(stats.rejected, before + 2);
  assert.deepEqual(refusals.take(), []);
  assert.equal(jobs.length, 0);
});

test('a full queue answers 503 (try another replica), not counted against the sender', async () => {
  queuedOverride = MAX_QUEUE;
  const before = stats.rejected;
  const r = await post('/forward', activation());
  assert.equal(r.status, 503);
  assert.equal(r.code, 'overloaded');
  assert.equal(stats.rejected, before);
  assert.deepEqual(refusals.take(), []);
});

test('GET /health answers within its schema', async () => {
  const res = await app.inject({ method: 'GET', url: '/health' });
  assert.equal(res.statusCode, 200);
  assert.deepEqual(res.json(), { ok: true, address: peer.address, stage: { runId: 'run-1', stage: 1, round: 0 }, stats });
  assert.equal((await app.inject({ method: 'GET', url: '/nope' })).statusCode, 404);
});
