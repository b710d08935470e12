// The miner's peer API in process (fastify inject, no child processes): only
// the right parties get through (neighbours the orchestrator named, signing
// with their session keys; activations with the orchestrator's ticket;
// gradients from the replica the activation went to), every refusal is a 4xx
// with the error contract's code and is counted, and an accepted frame is
// answered with this miner's receipt of it.
import assert from 'node:assert/strict';
import { after, before, beforeEach, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Engine } from '../../src/engine/engine.ts';
import type { HttpServer } from '../../src/http/server.ts';
import { buildPeerApi, MAX_QUEUE, type MinerStats, type PeerWork } from '../../src/miner/peer-api.ts';
import type { Job } from '../../src/miner/pipeline.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { signTicket, verifyReceipt } from '../../src/protocol/evidence.ts';
import type { Peer, StageAssignment } from '../../src/protocol/messages.ts';
import { bodySha256, RequestSigner, RequestVerifier } from '../../src/protocol/signing.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { readFrameHeader } from '../../src/protocol/frame.ts';

const model = 'gpt-micro';
const B = 2, T = 16, C = 16;
const MAX_FRAME = 1 << 16;
const DOMAIN = 'nimble:test';
const orchestrator = SessionKey.generate();
const mine = SessionKey.generate();

/** A neighbouring replica: its wallet address, session key and the signer of its requests. */
function neighbour(): { peer: Peer & { id: `0x${string}` }; signer: RequestSigner } {
  const address = new RequestSigner(generatePrivateKey()).address;
  const session = SessionKey.generate();
  return { peer: { id: address, url: 'http://127.0.0.1:9', sessionKey: session.publicKey, weight: 1 }, signer: new RequestSigner({ session, address }, { domain: DOMAIN }) };
}
const upstream = neighbour();
const downstream = neighbour();
/** a miner the orchestrator never named: a valid session signature, an unknown key */
const stranger = neighbour();

let engine: Engine;
let runner: StageRunner;
let app: HttpServer;
let held: StageRunner | null;
let jobs: Job[];
let queuedOverride: number | null;
let expected: { microbatch: number; attempt: number; sender: string } | null;
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
    expectsGradient: (microbatch, attempt, sender) => expected?.microbatch === microbatch && expected.attempt === attempt && expected.sender === sender,
    push: (job) => void jobs.push(job),
  };
  stats = { forward: 0, backward: 0, merges: 0, bytesSent: 0, rejected: 0 };
  const neighbours = [upstream.peer, downstream.peer];
  app = buildPeerApi({
    verifier: new RequestVerifier({ domain: DOMAIN, sessionKeyOf: (a) => neighbours.find((p) => p.id === a)?.sessionKey }),
    network: { domain: DOMAIN, orchestratorKey: orchestrator.publicKey, sessionKey: mine, previousStage: () => [upstream.peer], nextStage: () => [downstream.peer] },
    work,
    stats,
    health: () => ({ ok: true, address: upstream.peer.id, stage: { runId: 'run-1', stage: 1, round: 0 }, stats }),
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
  expected = null;
});

const issued = { runId: 'run-1', microbatch: 7, attempt: 2, shard: 3, step: 0 };
const forwardMeta = { ...issued, stage: 1, ticket: signTicket(orchestrator, DOMAIN, issued) };
const frameOf = (meta: object, rows = B * T, fill = 0.5): Uint8Array => encodeFrame(new Float32Array(rows * C).fill(fill), [rows, C], 'f16', meta as never);
const activation = (meta: object = forwardMeta, rows = B * T): Uint8Array => frameOf(meta, rows);

async function post(path: string, body: Uint8Array, opts: { signer?: RequestSigner | null; contentType?: string } = {}): Promise<{ status: number; error: string; code: string; body: Record<string, unknown> }> {
  const headers: Record<string, string> = { 'content-type': opts.contentType ?? 'application/octet-stream' };
  const signer = opts.signer === undefined ? (path === '/forward' ? upstream.signer : downstream.signer) : opts.signer;
  if (signer) Object.assign(headers, await signer.sign('POST', path, body));
  const res = await app.inject({ method: 'POST', url: path, headers, payload: Buffer.from(body) });
  const json = res.json() as Record<string, unknown>;
  return { status: res.statusCode, error: String(json.error ?? ''), code: String(json.code ?? ''), body: json };
}

test("a previous-stage replica's forward with the orchestrator's ticket is queued (202) and receipted", async () => {
  const frame = activation();
  const r = await post('/forward', frame);
  assert.equal(r.status, 202, r.error);
  assert.equal(r.body.queued, 1);
  const sha = readFrameHeader(frame).header.sha256;
  assert.ok(verifyReceipt(mine.publicKey, DOMAIN, { runId: 'run-1', microbatch: 7, attempt: 2, stage: 1, phase: 'forward', frameSha: sha }, String(r.body.receipt)), 'the receipt is this miner\'s signature of the frame');
  assert.equal(jobs.length, 1);
  const job = jobs[0];
  assert.equal(job.kind, 'forward');
  if (job.kind !== 'forward') return;
  assert.deepEqual(job.meta, forwardMeta);
  assert.equal(job.sender, upstream.peer.id, 'the gradient goes back to the verified sender');
  assert.equal(job.data.length, B * T * C);
  assert.deepEqual(job.frame, frame);
  assert.equal(job.sha, sha);
  assert.equal(stats.rejected, 0);
});

test('a gradient from the replica the activation went to, for the attempt held, is queued (202) and receipted', async () => {
  expected = { microbatch: 11, attempt: 1, sender: downstream.peer.id };
  const frame = activation({ runId: 'run-1', microbatch: 11, attempt: 1, stage: 1 });
  const r = await post('/backward', frame);
  assert.equal(r.status, 202, r.error);
  assert.equal(jobs.length, 1);
  assert.equal(jobs[0].kind, 'backward');
  assert.ok(verifyReceipt(mine.publicKey, DOMAIN, { runId: 'run-1', microbatch: 11, attempt: 1, stage: 1, phase: 'backward', frameSha: readFrameHeader(frame).header.sha256 }, String(r.body.receipt)));
});

test('refusals: 4xx with the contract code, counted, nothing queued', async () => {
  expected = { microbatch: 11, attempt: 1, sender: downstream.peer.id };
  const good = activation();
  const corrupt = good.slice();
  corrupt[corrupt.length - 1] ^= 0xff;
  const otherIssue = { ...issued, microbatch: 8 };
  const cases: [string, string, Uint8Array, number, string, RegExp, RequestSigner?][] = [
    ['bad frame (checksum)', '/forward', corrupt, 400, 'checksum', /checksum/],
    ['bad frame (garbage)', '/forward', new TextEncoder().encode('NIMF garbage'), 400, 'bad_version', /version/],
    ['bad frame (magic)', '/forward', Uint8Array.from([0x58, 0x58, 0x58, 0x58, ...good.subarray(4)]), 400, 'bad_magic', /NIMF|magic/],
    ['wrong shape', '/forward', activation(forwardMeta, 8), 400, 'shape_mismatch', /shape/],
    ['values out of range', '/forward', encodeFrame(new Float32Array(B * T * C).fill(5e4), [B * T, C], 'f32', forwardMeta as never), 400, 'invalid', /out of range/],
    ['bad meta', '/forward', activation({ runId: 'run-1', microbatch: 0 }), 400, 'invalid', /invalid forward meta/],
    ['stage not held', '/forward', activation({ ...forwardMeta, stage: 2 }), 409, 'conflict', /holds stage 1 of run-1/],
    ['stage 0', '/forward', activation({ ...forwardMeta, stage: 0 }), 409, 'conflict', /holds stage 1/],
    ['another run', '/forward', activation({ ...forwardMeta, runId: 'run-other' }), 409, 'conflict', /run-other/],
    ['no ticket for it', '/forward', activation({ ...forwardMeta, microbatch: 8 }), 403, 'forbidden', /no valid ticket/],
    ["another network's ticket", '/forward', activation({ ...otherIssue, stage: 1, ticket: signTicket(orchestrator, 'nimble:other', otherIssue) }), 403, 'forbidden', /no valid ticket/],
    ['a ticket signed by someone else', '/forward', activation({ ...otherIssue, stage: 1, ticket: signTicket(mine, DOMAIN, otherIssue) }), 403, 'forbidden', /no valid ticket/],
    ['a forward from the next stage', '/forward', activation(), 403, 'forbidden', /not a replica of the previous stage/, downstream.signer],
    ['a gradient from the previous stage', '/backward', activation({ runId: 'run-1', microbatch: 11, attempt: 1, stage: 1 }), 403, 'forbidden', /not a replica of the next stage/, upstream.signer],
    ['gradient not held', '/backward', activation({ runId: 'run-1', microbatch: 424242, attempt: 1, stage: 1 }), 409, 'conflict', /microbatch 424242 attempt 1 is not held here/],
    ['gradient for another attempt', '/backward', activation({ runId: 'run-1', microbatch: 11, attempt: 2, stage: 1 }), 409, 'conflict', /attempt 2 is not held/],
    ['gradient for another stage', '/backward', activation({ runId: 'run-1', microbatch: 1, attempt: 1, stage: 0 }), 409, 'conflict', /gradient for run run-1 stage 0/],
    ['a JSON body', '/forward', new TextEncoder().encode('{"a":1}'), 400, 'invalid', /body/],
  ];
  for (const [label, path, body, status, code, pattern, signer] of cases) {
    const r = await post(path, body, { contentType: label === 'a JSON body' ? 'application/json' : undefined, signer });
    assert.equal(r.status, status, `${label}: ${r.error}`);
    assert.equal(r.code, code, label);
    assert.match(r.error, pattern, label);
  }
  assert.equal(jobs.length, 0, 'nothing refused is queued');
  assert.equal(stats.rejected, cases.length);
});

test('no stage held: 409', async () => {
  held = null;
  const r = await post('/forward', activation());
  assert.equal(r.status, 409);
  assert.equal(r.error, 'this miner holds no stage');
});

test('unsigned, signed by a key the orchestrator never named, or for another network: 401 before the body is read', async () => {
  const before = stats.rejected;
  const frame = activation();
  const unsigned = await post('/forward', frame, { signer: null });
  assert.deepEqual([unsigned.status, unsigned.code], [401, 'missing']);
  const unknown = await post('/forward', frame, { signer: stranger.signer });
  assert.deepEqual([unknown.status, unknown.code], [401, 'unknown_signer']);
  const session = SessionKey.generate();
  const foreign = new RequestSigner({ session, address: upstream.peer.id }, { domain: 'nimble:other' });
  assert.deepEqual([(await post('/forward', frame, { signer: foreign })).status], [401]);
  // the body must be the one signed
  const headers = { 'content-type': 'application/octet-stream', ...(await upstream.signer.sign('POST', '/forward', frame)) };
  const swapped = await app.inject({ method: 'POST', url: '/forward', headers, payload: Buffer.from(activation({ ...forwardMeta, shard: 9 })) });
  assert.equal(swapped.statusCode, 401);
  assert.match(swapped.body, /does not match the signed sha256/);
  assert.equal(headers['x-nimble-content-sha256'], bodySha256(frame));
  const huge = await post('/forward', new Uint8Array(MAX_FRAME + 1));
  assert.deepEqual([huge.status, huge.code], [413, 'too_large']);
  assert.equal(stats.rejected, before + 5);
  assert.equal(jobs.length, 0);
});

test('a full queue answers 503 (try another replica), not counted as a refusal', async () => {
  queuedOverride = MAX_QUEUE;
  const before = stats.rejected;
  const r = await post('/forward', activation());
  assert.equal(r.status, 503);
  assert.equal(r.code, 'overloaded');
  assert.equal(stats.rejected, before);
});

test('GET /health answers within its schema', async () => {
  const res = await app.inject({ method: 'GET', url: '/health' });
  assert.equal(res.statusCode, 200);
  assert.deepEqual(res.json(), { ok: true, address: upstream.peer.id, stage: { runId: 'run-1', stage: 1, round: 0 }, stats });
  assert.equal((await app.inject({ method: 'GET', url: '/nope' })).statusCode, 404);
});
