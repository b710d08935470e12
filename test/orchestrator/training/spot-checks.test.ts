import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadCorpus } from '../../../src/data/corpus.ts';
import { batchForShard } from '../../../src/data/batches.ts';
import { Engine } from '../../../src/engine/engine.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { partParams, splitEvenly } from '../../../src/model/parts.ts';
import { ParamLayout } from '../../../src/model/params.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { decodeCheckBundle, encodeCheckBundle, type CheckMeta } from '../../../src/protocol/check-bundle.ts';
import { FrameError } from '../../../src/protocol/errors.ts';
import { encodeFrame, readFrameHeader } from '../../../src/protocol/frame.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { reach } from '../../../src/model/adamw.ts';
import { compare, verifyForward, type CheckContext } from '../../../src/orchestrator/training/spot-check-verify.ts';
import { Offences } from '../../../src/orchestrator/rewards/offences.ts';
import { SpotChecks } from '../../../src/orchestrator/training/spot-checks.ts';
import { StageStates } from '../../../src/orchestrator/training/stage-states.ts';
import { stateTarget } from '../helpers.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const config = gptConfig('gpt-micro');
const B = 2;
const T = config.contextLength;
const C = config.channels;
const corpus = loadCorpus('moby-dick');
const [first, second] = splitEvenly(config, 2);
const seed = 5;
const shard = 17;
/** floats of the first stage's parameters that take weight decay */
const decaySize = new ParamLayout(Array.from({ length: first.to - first.from }, (_, k) => partParams(config, first.from + k)).flat()).decaySize;

/** A forward as an honest first-stage miner does it: weights moved a little since the merge, fp16 output frame. */
function honestFirst(samples = 3, lr = 1e-3): { meta: CheckMeta; weights: Float32Array; theta: Float32Array; out: Float32Array; frame: Uint8Array } {
  const stage = new GptStage(engine, config, first, { batchSize: B, seed });
  const theta = stage.params.flat.data.slice();
  const rand = mulberry32(9);
  const w = stage.params.flat.data;
  for (let i = 0; i < w.length; i++) w[i] += (rand() * 2 - 1) * lr * samples; // within what AdamW could do
  const weights = w.slice();
  const out = (stage.forward(batchForShard(corpus.train, seed, shard, B, T).inputs, B, T) as Float32Array).slice();
  stage.release();
  const meta: CheckMeta = { runId: 'r1', microbatch: 4, stage: 0, round: 0, samples, shard };
  return { meta, weights, theta, out, frame: encodeFrame(out, [B * T, C], 'f16', { microbatch: 4 }) };
}

function contextFor(frame: Uint8Array, theta: Float32Array | null, over: Partial<CheckContext> = {}): CheckContext {
  return {
    config, range: first, batchSize: B, seed, corpus, shard, codec: 'f16', lr: 1e-3, thetaStart: theta, decaySize, maxSamples: 464,
    outputSha: readFrameHeader(frame).header.sha256, inputSha: null, loss: null, upstreamShas: null, ...over,
  };
}

const expectFirst = (paramCount: number) => ({ paramCount, activationShape: [B * T, C], hasInput: false, hasOutput: true, maxBytes: 1 << 26 });

test('a check bundle round-trips, and a malformed one is refused with a FrameError', () => {
  const h = honestFirst();
  const bytes = encodeCheckBundle({ meta: h.meta, weights: h.weights, input: null, output: h.frame });
  const d = decodeCheckBundle(bytes, expectFirst(h.weights.length));
  assert.deepEqual(d.meta, h.meta);
  assert.deepEqual(d.weights, h.weights);
  assert.equal(d.outputSha, readFrameHeader(h.frame).header.sha256);
  assert.equal(d.input, null);
  const bad: [string, Uint8Array, Partial<ReturnType<typeof expectFirst>>][] = [
    ['truncated', bytes.subarray(0, bytes.length - 1), {}],
    ['magic', Uint8Array.from(bytes, (b, i) => (i === 0 ? 0 : b)), {}],
    ['missing input', bytes, { hasInput: true }],
    ['wrong param count', bytes, { paramCount: h.weights.length - 1 }],
    ['too large', bytes, { maxBytes: 100 }],
  ];
  for (const [what, b, over] of bad) {
    assert.throws(() => decodeCheckBundle(b, { ...expectFirst(h.weights.length), ...over }), FrameError, what);
  }
  // a flipped payload byte breaks the output frame's sha256
  const flipped = bytes.slice();
  flipped[flipped.length - 3] ^= 0xff;
  assert.throws(() => decodeCheckBundle(flipped, expectFirst(h.weights.length)), FrameError);
});

test('an honest fp16 forward passes; a tampered one fails on cosine and norm', () => {
  const h = honestFirst();
  const bundle = (frame: Uint8Array) => decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: h.weights, input: null, output: frame }), expectFirst(h.weights.length));
  const ok = verifyForward(engine, contextFor(h.frame, h.theta), bundle(h.frame));
  assert.ok(ok.passed, ok.detail);
  assert.ok(ok.cosine! > 0.99999, `cosine ${ok.cosine}`);

  // 3% noise on every value: the cheat a threshold must catch
  const rand = mulberry32(3);
  const noisy = h.out.map((x) => x * (1 + 0.03 * (rand() * 2 - 1)) + 0.03 * (rand() * 2 - 1));
  const noisyFrame = encodeFrame(noisy, [B * T, C], 'f16', {});
  const bad = verifyForward(engine, contextFor(noisyFrame, h.theta), bundle(noisyFrame));
  assert.equal(bad.passed, false);
  assert.match(bad.detail, /cosine/);

  // scaled output: the cosine is perfect, the norm ratio is not
  const scaledFrame = encodeFrame(h.out.map((x) => x * 1.05), [B * T, C], 'f16', {});
  const scaled = verifyForward(engine, contextFor(scaledFrame, h.theta), bundle(scaledFrame));
  assert.equal(scaled.passed, false);
  assert.ok(scaled.cosine! > 0.9999);
  assert.match(scaled.detail, /norm ratio/);
});

test('the output must be the committed frame, and the weights within reach of the merged state', () => {
  const h = honestFirst();
  const bytes = encodeCheckBundle({ meta: h.meta, weights: h.weights, input: null, output: h.frame });
  const b = decodeCheckBundle(bytes, expectFirst(h.weights.length));
  const other = encodeFrame(h.out, [B * T, C], 'f32', {});
  const r1 = verifyForward(engine, contextFor(other, h.theta), b);
  assert.equal(r1.passed, false);
  assert.match(r1.detail, /not the one the miner reported sending/);

  // weights far from the merged state: made up to fit a made-up output
  const far = h.weights.slice();
  far[10] += 1;
  const b2 = decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: far, input: null, output: h.frame }), expectFirst(h.weights.length));
  const r2 = verifyForward(engine, contextFor(h.frame, h.theta), b2);
  assert.equal(r2.passed, false);
  assert.match(r2.detail, /moved .* from the merged state/);
  // the bound scales with the steps claimed; claiming more than possible fails too
  const r3 = verifyForward(engine, contextFor(h.frame, h.theta, { maxSamples: 2 }), b);
  assert.match(r3.detail, /inner steps/);
  // a weight just past its reach fails, one just inside passes
  const edge = h.weights.slice();
  const i = 3;
  edge[i] = h.theta[i] + reach(h.theta[i], i < decaySize, h.meta.samples, 1e-3) * 1.001;
  const rEdge = verifyForward(engine, contextFor(h.frame, h.theta), decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: edge, input: null, output: h.frame }), expectFirst(h.weights.length)));
  assert.match(rEdge.detail, new RegExp(`weight ${i} moved`));

  // a lazy miner: zero weights (the blocks pass their input through) fail the bound whatever output they reproduce
  const lazy = new Float32Array(h.weights.length);
  const rLazy = verifyForward(engine, contextFor(h.frame, h.theta), decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: lazy, input: null, output: h.frame }), expectFirst(h.weights.length)));
  assert.equal(rLazy.passed, false);
  assert.match(rLazy.detail, /moved .* from the merged state/);

  // the wrong shard
  const r4 = verifyForward(engine, contextFor(h.frame, h.theta, { shard: shard + 1 }), b);
  assert.match(r4.detail, /shard/);
});

test('a last stage is checked by its loss, and its input against what the previous stage sent', () => {
  const h = honestFirst();
  const last = new GptStage(engine, config, second, { batchSize: B, seed });
  const weights = last.params.flat.data.slice();
  const input = h.frame;
  // the receiver sees the fp16-rounded activation
  const decoded = decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: h.weights, input: null, output: h.frame }), expectFirst(h.weights.length)).output!.data;
  const loss = last.forward(decoded, B, T, batchForShard(corpus.train, seed, shard, B, T).targets) as number;
  last.release();
  const sha = readFrameHeader(input).header.sha256;
  const meta: CheckMeta = { ...h.meta, stage: 1 };
  const b = decodeCheckBundle(encodeCheckBundle({ meta, weights, input, output: null }), { paramCount: weights.length, activationShape: [B * T, C], hasInput: true, hasOutput: false, maxBytes: 1 << 26 });
  const ctx = (over: Partial<CheckContext>): CheckContext => ({ ...contextFor(h.frame, weights), range: second, outputSha: null, inputSha: sha, loss, upstreamShas: [sha], ...over });
  const ok = verifyForward(engine, ctx({}), b);
  assert.ok(ok.passed, ok.detail);
  assert.equal(verifyForward(engine, ctx({ loss: loss * 0.99 }), b).passed, false);
  assert.match(verifyForward(engine, ctx({ upstreamShas: ['0'.repeat(64)] }), b).detail, /previous stage/);
  assert.match(verifyForward(engine, ctx({ inputSha: '1'.repeat(64) }), b).detail, /reported receiving/);
});

test('compare: cosine and norm ratio', () => {
  const a = Float32Array.from([1, 2, 3]);
  assert.deepEqual(compare(a, a), { cosine: 1, normRatio: 1 });
  const c = compare(a, Float32Array.from([2, 4, 6]));
  assert.ok(Math.abs(c.cosine - 1) < 1e-12 && Math.abs(c.normRatio - 2) < 1e-12);
  assert.equal(compare(a, new Float32Array(3)).cosine, 0);
});

test('a stage before the last is recomputed on a few sequences: honest passes, a corrupted sequence fails when drawn', () => {
  const h = honestFirst();
  const bundle = (frame: Uint8Array) => decodeCheckBundle(encodeCheckBundle({ meta: h.meta, weights: h.weights, input: null, output: frame }), expectFirst(h.weights.length));
  const ok = verifyForward(engine, contextFor(h.frame, h.theta, { rows: [1] }), bundle(h.frame));
  assert.ok(ok.passed, ok.detail);
  // sequence 0 made up, sequence 1 honest
  const bad = h.out.slice();
  for (let i = 0; i < T * C; i++) bad[i] = 0.5;
  const badFrame = encodeFrame(bad, [B * T, C], 'f16', {});
  assert.equal(verifyForward(engine, contextFor(badFrame, h.theta, { rows: [0] }), bundle(badFrame)).passed, false);
  assert.equal(verifyForward(engine, contextFor(badFrame, h.theta, { rows: [1] }), bundle(badFrame)).passed, true, 'only drawn sequences are compared');
  assert.throws(() => verifyForward(engine, contextFor(h.frame, h.theta, { rows: [B] }), bundle(h.frame)), RangeError);
});

test('selection follows the rate; a check left unanswered fails and costs the miner a failed_check unit', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-checks-'));
  const db = OrchestratorState.open(await stateTarget(dir));
  try {
    const options = { lr: 1e-3, codec: 'f16', aggregator: 'mean', minMiners: 2, outerLr: 0.7, outerMomentum: 0.9, requestedStages: 2 } as const;
    db.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 10, batchSize: 2, mergeEvery: 5, seed: 1, options }, 1);
    const run = db.runs.get('r1')!;
    let now = 1_000_000;
    const blobs = await FsBlobStore.open(join(dir, 'blobs'));
    const states = new StageStates(db, blobs);
    const offences = new Offences(db, { enabled: true, fraction: 0.1 });
    const never = new SpotChecks(db, states, async () => engine, offences, { rate: 0 }, () => now);
    const always = new SpotChecks(db, states, async () => engine, offences, { rate: 1, timeoutMs: 5000 }, () => now);
    const claim = { microbatch: 3, attempt: 1, stage: 0, phase: 'forward' as const, minerId: '0xminer', nextId: null, inputSha: null, outputSha: 'a'.repeat(64), loss: null, round: 0, at: now, bytes: 0 };
    assert.equal(never.onForward(run, claim), false);
    assert.equal(always.onForward(run, claim), true);
    assert.deepEqual(always.deliver('0xminer'), [3], 'the next heartbeat reply names it');
    always.expire();
    assert.equal(db.spotChecks.list()[0].status, 'asked');
    now += 6000;
    always.expire();
    const [c] = db.spotChecks.list();
    assert.equal(c.status, 'failed');
    assert.match(c.detail!, /not answered/);
    assert.deepEqual(db.ledger.workTotals('r1'), [{ minerId: '0xminer', kind: 'failed_check', units: 1 }]);
    // on a paid network, an offence: one pending slash, named after the check
    assert.deepEqual(db.ledger.slashes().map((x) => [x.miner, x.checkId, x.fraction, x.status]), [['0xminer', c.id, 0.1, 'pending']]);
    assert.match(db.ledger.slashes()[0].reason, /^nimble spot check r1\/\d+: microbatch 3 stage 0$/);
    await assert.rejects(() => always.submit('0xminer', 'r1', 3, new Uint8Array(10)), /no open spot check/);
    assert.throws(() => new SpotChecks(db, states, async () => engine, offences, { rate: 2 }), RangeError);
    assert.throws(() => new Offences(db, { fraction: 1.5 }), RangeError);
    always.close();
  } finally {
    db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
