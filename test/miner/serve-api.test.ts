// The miner's POST /infer (src/miner/serve-api.ts) with several sessions in
// one frame: the rows of a batch give what each session's rows give alone,
// bit for bit, on a middle stage and on the last (logits of each session's
// last row); an f16 answer when asked; and everything in the meta is checked
// before anything changes: row counts against the frame, a session twice,
// more sessions than the stage holds, a session without `reset` that is not
// on the stage (409), sessions that do not fit (503), fields it does not know.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { SignedClient } from '../../src/http/client.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import type { StageInference } from '../../src/inference/stage-inference.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { decodeFrame, encodeFrame, type FrameMeta } from '../../src/protocol/frame.ts';
import { domainOf, orchestratorAddress } from '../../src/protocol/network.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';
import { startStageServer, type StageServer } from '../helpers/stage-server.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';

const config = gptConfig('gpt-micro');
const C = config.channels;
const V = config.vocabSize;
const checkpoint = wholeModelBytes(3, 9);
const cuts = splitEvenly(config, 2);
const key = SessionKey.generate();
const domain = domainOf(key.publicKey);
const client = new SignedClient('http://127.0.0.1', new RequestSigner({ session: key, address: orchestratorAddress(key.publicKey) }, { domain }));
let engine: Engine;
const held: StageInference[] = [];
const servers: StageServer[] = [];

before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  for (const s of servers) s.kill();
  for (const s of held) s.release();
  await engine.close();
});

function stage(i: number, maxSessions = 4): StageInference {
  const s = inferenceFromCheckpoint(engine, checkpoint, cuts[i], { maxSessions });
  held.push(s);
  return s;
}

async function server(i: number, inference: StageInference): Promise<StageServer> {
  const s = await startStageServer({ orchestratorKey: key.publicKey, domain, deploymentId: 'dep-9', stage: i, stageCount: 2, inference, id: `0x${'9'.repeat(40)}` });
  servers.push(s);
  return s;
}

const rows = (n: number, seed: number): Float32Array => Float32Array.from({ length: n * C }, (_, j) => Math.sin(seed * 31 + j) * 0.5);

async function infer(s: StageServer, data: Float32Array, shape: number[], meta: FrameMeta): Promise<{ data: Float32Array; codec: string }> {
  const answer = await client.request('POST', `${s.peer.url}/infer`, encodeFrame(data, shape, 'f32', { deploymentId: 'dep-9', ...meta }));
  const f = decodeFrame(answer);
  return { data: f.data, codec: f.codec };
}

test('a batch of sessions gives each session what its rows give alone, bit for bit (middle stage, and the last stage\'s logits)', async () => {
  const first = await server(0, stage(0));
  const last = await server(1, stage(1));
  const alone0 = stage(0);
  const alone1 = stage(1);
  // stage 0: a prefill of 5 tokens next to a prefill of 3, then a decode row of each next to a newcomer's 2
  const a = [1, 2, 3, 4, 5], b = [9, 8, 7], c = [100, 101];
  let out = await infer(first, Float32Array.from([...a, ...b]), [8], { stage: 0, sessions: [{ id: 'a', rows: 5, reset: true }, { id: 'b', rows: 3, reset: true }] });
  alone0.join('a');
  alone0.join('b');
  const want = new Float32Array([...alone0.prefill('a', Int32Array.from(a)), ...alone0.prefill('b', Int32Array.from(b))]);
  assert.deepEqual(out.data, want);
  out = await infer(first, Float32Array.from([6, 6, ...c]), [4], { stage: 0, sessions: [{ id: 'a', rows: 1 }, { id: 'b', rows: 1 }, { id: 'c', rows: 2, reset: true }] });
  alone0.join('c');
  const want2 = new Float32Array([...alone0.prefill('a', Int32Array.of(6)), ...alone0.prefill('b', Int32Array.of(6)), ...alone0.prefill('c', Int32Array.from(c))]);
  assert.deepEqual(out.data, want2);
  // the last stage: one logits row per session, its last row's; f16 when asked
  const x = rows(3, 1), y = rows(2, 2);
  out = await infer(last, new Float32Array([...x, ...y]), [5, C], { stage: 1, sessions: [{ id: 'x', rows: 3, reset: true }, { id: 'y', rows: 2, reset: true }], codec: 'f16' });
  assert.equal(out.codec, 'f16');
  alone1.join('x');
  alone1.join('y');
  const lx = alone1.prefill('x', x), ly = alone1.prefill('y', y);
  assert.equal(out.data.length, 2 * V);
  const next = await infer(last, rows(1, 3), [1, C], { stage: 1, sessions: [{ id: 'x', rows: 1 }] });
  assert.equal(next.codec, 'f32');
  assert.deepEqual(next.data, alone1.prefill('x', rows(1, 3)), 'the next step of x on the cache its batch built');
  assert.ok(out.data.every((v, i) => Math.abs(v - (i < V ? lx[i] : ly[i - V])) <= Math.abs(v) * 1e-3 + 1e-4), 'the f16 logits are the rounded logits');
});

test('the meta is checked before anything changes: counts, duplicates, capacity, unknown sessions, unknown fields', async () => {
  const inf = stage(0, 2);
  const s = await server(0, inf);
  const refused = async (data: number[], meta: FrameMeta, status: number, message: RegExp): Promise<void> => {
    await assert.rejects(infer(s, Float32Array.from(data), [data.length], meta), (e: unknown) => e instanceof NimbleError && e.status === status && message.test(e.message));
    assert.deepEqual(inf.sessionIds(), before, 'nothing changed');
  };
  let before: string[] = [];
  await refused([1, 2, 3], { stage: 0, sessions: [{ id: 'p', rows: 2, reset: true }] }, 400, /sum to 2, the frame holds 3/);
  await refused([1, 2], { stage: 0, sessions: [{ id: 'p', rows: 1, reset: true }, { id: 'p', rows: 1, reset: true }] }, 400, /twice/);
  await refused([1, 2, 3], { stage: 0, sessions: ['p', 'q', 'r'].map((id) => ({ id, rows: 1, reset: true })) }, 400, /at most 2/);
  await refused([1], { stage: 0, sessions: [{ id: 'p', rows: 1 }] }, 409, /not on this stage/);
  await refused([1], { stage: 0, sessions: [{ id: 'p', rows: 1, reset: true, extra: 1 }] }, 400, /infer meta/);
  await refused([1], { stage: 0, sessions: [{ id: 'p', rows: 1, reset: true }], session: 'p' }, 400, /infer meta/);
  await refused([1], { stage: 0, sessions: [{ id: 'p', rows: 0, reset: true }] }, 400, /infer meta/);
  await refused([300], { stage: 0, sessions: [{ id: 'p', rows: 1, reset: true }] }, 400, /outside the vocabulary/);
  await refused([1], { stage: 1, sessions: [{ id: 'p', rows: 1, reset: true }] }, 409, /serves stage 0/);
  await infer(s, Float32Array.of(1, 2), [2], { stage: 0, sessions: [{ id: 'p', rows: 1, reset: true }, { id: 'q', rows: 1, reset: true }] });
  before = ['p', 'q'];
  await refused([1], { stage: 0, sessions: [{ id: 'r', rows: 1, reset: true }] }, 503, /./ /* a 5xx's message stays on the miner */);
  // a reset of a session held takes no new room
  await infer(s, Float32Array.of(4), [1], { stage: 0, sessions: [{ id: 'q', rows: 1, reset: true }] });
  assert.equal(inf.position('q'), 1);
  assert.equal(inf.position('p'), 1);
});
