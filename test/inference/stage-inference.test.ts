// The cached inference path gives the logits of the full recompute
// (GptStage.forward on the whole prefix), bit for bit: for a prompt prefilled
// in one pass then decoded token by token, for a batch of sessions at
// different positions that join and leave between steps, and for a model cut
// into two stages. Measured bound: 0 (every float identical), on random
// weights and on weights after a few training steps, gpt-micro and gpt-tiny.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { splitCorpus } from '../../src/data/corpus.ts';
import { encodeStage } from '../../src/model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { partCount, splitEvenly } from '../../src/model/parts.ts';
import { trainLocal } from '../../src/train/local.ts';
import { ContextOverflowError, type StageInference } from '../../src/inference/stage-inference.ts';
import { inferenceFromCheckpoint, inferenceFromStage } from '../../src/inference/load.ts';
import { mulberry32 } from '../../src/model/init.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

const text = new TextEncoder().encode('Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse. '.repeat(30));

/** Models to check: random weights (both inits) and a few training steps. */
function models(name: 'gpt-micro' | 'gpt-tiny'): { label: string; stage: GptStage }[] {
  const config = gptConfig(name);
  const whole = { from: 0, to: partCount(config) };
  const steps = name === 'gpt-micro' ? 30 : 8;
  return [
    { label: `${name} random (torch init)`, stage: new GptStage(engine, config, whole, { batchSize: 1, seed: 5 }) },
    { label: `${name} random (gpt2 init)`, stage: new GptStage(engine, { ...config, init: 'gpt2' }, whole, { batchSize: 1, seed: 6 }) },
    { label: `${name} after ${steps} steps`, stage: trainLocal(engine, { model: name, corpus: splitCorpus('t', text), steps, batchSize: 4, evalBatches: 1, seed: 3 }).stage },
  ];
}

function randomTokens(n: number, seed: number, V = 256): Int32Array {
  const rng = mulberry32(seed);
  return Int32Array.from({ length: n }, () => Math.floor(rng() * V));
}

/** Logits of every position of `tokens` by the full recompute. */
function reference(model: GptStage, tokens: Int32Array): Float32Array {
  const ref = new GptStage(engine, model.config, model.range, { batchSize: 1 });
  ref.params.flat.data.set(model.params.flat.data);
  const out = (ref.forward(tokens, 1, tokens.length) as Float32Array).slice();
  ref.release();
  return out;
}

/** Asserts two rows are the same floats, bit for bit, naming the largest difference otherwise. */
function assertSameBits(got: Float32Array, want: Float32Array, what: string): void {
  assert.equal(got.length, want.length, `${what}: length`);
  const a = new Uint32Array(got.buffer, got.byteOffset, got.length);
  const b = new Uint32Array(want.buffer, want.byteOffset, want.length);
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      let worst = 0;
      for (let j = 0; j < got.length; j++) worst = Math.max(worst, Math.abs(got[j] - want[j]));
      assert.fail(`${what}: differs at ${i} (${got[i]} vs ${want[i]}), largest difference ${worst}`);
    }
  }
}

function row(all: Float32Array, i: number, V: number): Float32Array {
  return all.subarray(i * V, (i + 1) * V);
}

/** Prefill `prefix` tokens, then decode the rest one by one: each row's logits against the recompute. */
function checkPrefillThenDecode(inf: StageInference, model: GptStage, tokens: Int32Array, prefix: number, label: string): void {
  const V = model.config.vocabSize;
  const want = reference(model, tokens);
  inf.join('s');
  assertSameBits(inf.prefill('s', tokens.subarray(0, prefix)), row(want, prefix - 1, V), `${label}: prefill of ${prefix}`);
  for (let t = prefix; t < tokens.length; t++) {
    const got = inf.decode([{ session: 's', input: tokens.subarray(t, t + 1) }]);
    assertSameBits(got, row(want, t, V), `${label}: decode at position ${t}`);
  }
  assert.equal(inf.position('s'), tokens.length);
  inf.leave('s');
}

for (const name of ['gpt-micro', 'gpt-tiny'] as const) {
  test(`${name}: prefill then decode gives the recompute's logits bit for bit, at several prompt lengths`, () => {
    const T = gptConfig(name).contextLength;
    for (const { label, stage } of models(name)) {
      const inf = inferenceFromStage(engine, stage);
      const prefixes = name === 'gpt-micro' ? [1, 3, 8, 15, 16] : [1, 5, 20, 43, 64];
      for (const prefix of prefixes) {
        // gpt-tiny: 20 decode steps after each prefix (as far as the context allows); gpt-micro: to its context of 16
        const length = Math.min(T, prefix + 20);
        checkPrefillThenDecode(inf, stage, randomTokens(length, prefix * 7 + 1), prefix, `${label}, prefix ${prefix}`);
      }
      inf.release();
      stage.release();
    }
  });

  test(`${name}: a batch of 3 sessions at different positions, joining and leaving between steps`, () => {
    const config = gptConfig(name);
    const V = config.vocabSize;
    const T = config.contextLength;
    for (const { label, stage } of models(name)) {
      const inf = inferenceFromStage(engine, stage, { maxSessions: 4 });
      const seqs = new Map<string, Int32Array>();
      const want = new Map<string, Float32Array>();
      const start = (id: string, length: number, prefix: number, seed: number): void => {
        const tokens = randomTokens(length, seed);
        seqs.set(id, tokens);
        want.set(id, reference(stage, tokens));
        inf.join(id);
        assertSameBits(inf.prefill(id, tokens.subarray(0, prefix)), row(want.get(id)!, prefix - 1, V), `${label}: ${id} prefill`);
      };
      start('a', T, 1, 11);
      start('b', T, Math.floor(T / 3), 12);
      start('c', T, T - 6, 13);
      for (let step = 0; step < 20; step++) {
        const ids = inf.sessionIds();
        if (ids.length === 0) break;
        const batch = ids.map((id) => ({ session: id, input: seqs.get(id)!.subarray(inf.position(id), inf.position(id) + 1) }));
        const positions = ids.map((id) => inf.position(id));
        const out = inf.decode(batch);
        ids.forEach((id, i) => assertSameBits(row(out, i, V), row(want.get(id)!, positions[i], V), `${label}: step ${step}, ${id} at ${positions[i]}`));
        // c reaches the end of its context and leaves; d joins mid-run
        for (const id of inf.sessionIds()) if (inf.position(id) === T) inf.leave(id);
        if (step === 3) start('d', T, 9, 14);
      }
      assert.ok(!inf.has('c'), 'c left when its context was full');
      inf.release();
      stage.release();
    }
  });

  test(`${name}: a model cut into 2 stages gives the whole model's logits bit for bit`, () => {
    const config = gptConfig(name);
    const V = config.vocabSize;
    for (const { label, stage } of models(name)) {
      const bytes = encodeStage(stage);
      const [r0, r1] = splitEvenly(config, 2);
      const s0 = inferenceFromCheckpoint(engine, bytes, r0);
      const s1 = inferenceFromCheckpoint(engine, bytes, r1);
      assert.ok(s0.isFirst && !s0.isLast && !s1.isFirst && s1.isLast);
      const tokens = randomTokens(config.contextLength, 21);
      const want = reference(stage, tokens);
      const prefix = Math.min(7, config.contextLength - 1);
      for (const s of [s0, s1]) s.join('x');
      const act = s0.prefill('x', tokens.subarray(0, prefix));
      assert.equal(act.length, prefix * config.channels);
      assertSameBits(s1.prefill('x', act), row(want, prefix - 1, V), `${label}: 2-stage prefill`);
      for (let t = prefix; t < tokens.length; t++) {
        const a = s0.decode([{ session: 'x', input: tokens.subarray(t, t + 1) }]);
        assertSameBits(s1.decode([{ session: 'x', input: a }]), row(want, t, V), `${label}: 2-stage decode at ${t}`);
      }
      s0.release();
      s1.release();
      stage.release();
    }
  });
}

for (const serialRows of [0, 64]) {
  test(`one call can mix a prefill and other sessions' decode steps (same logits; serialRows ${serialRows})`, () => {
    const config: GptConfig = gptConfig('gpt-micro');
    const V = config.vocabSize;
    const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 8 });
    const inf = inferenceFromStage(engine, stage, { serialRows });
    const a = randomTokens(12, 1), b = randomTokens(12, 2);
    const wa = reference(stage, a), wb = reference(stage, b);
    inf.join('a');
    inf.prefill('a', a.subarray(0, 4));
    inf.join('b');
    const out = inf.run([{ session: 'a', input: a.subarray(4, 5) }, { session: 'b', input: b.subarray(0, 6) }]);
    assertSameBits(row(out, 0, V), row(wa, 4, V), 'a decoded next to b\'s prefill');
    assertSameBits(row(out, 1, V), row(wb, 5, V), 'b prefilled next to a\'s decode');
    // chunked prefill: b's next 3 tokens in one call
    assertSameBits(inf.prefill('b', b.subarray(6, 9)), row(wb, 8, V), 'b\'s second chunk');
    inf.release();
    stage.release();
  });
}

test('past the context length a call is refused and changes nothing; leaving frees the cache', () => {
  const config = gptConfig('gpt-micro');
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 8 });
  const inf = inferenceFromStage(engine, stage, { maxSessions: 2 });
  const tokens = randomTokens(config.contextLength, 3);
  inf.join('a');
  inf.join('b');
  assert.throws(() => inf.join('c'), /holds 2 sessions already/);
  assert.throws(() => inf.join('a'), /already on this stage/);
  inf.prefill('a', tokens);
  inf.prefill('b', tokens.subarray(0, 2));
  assert.throws(
    () => inf.decode([{ session: 'b', input: tokens.subarray(2, 3) }, { session: 'a', input: tokens.subarray(0, 1) }]),
    (err: unknown) => err instanceof ContextOverflowError && /session a is at position 16: 1 more token would pass the context length 16/.test(err.message),
  );
  assert.equal(inf.position('b'), 2, 'the refused call did not advance b');
  assert.throws(() => inf.prefill('b', tokens), ContextOverflowError);
  assert.throws(() => inf.decode([{ session: 'b', input: tokens.subarray(0, 2) }]), /one row per session/);
  assert.throws(() => inf.decode([{ session: 'b', input: Int32Array.of(256) }]), /outside the vocabulary/);
  assert.throws(() => inf.decode([{ session: 'zz', input: Int32Array.of(1) }]), /not on this stage/);
  assert.throws(() => inf.run([{ session: 'b', input: Int32Array.of(1) }, { session: 'b', input: Int32Array.of(1) }]), /appears twice/);
  const before = engine.heap.stats().inUse;
  inf.leave('a');
  assert.ok(engine.heap.stats().inUse < before, 'the cache went back to the engine');
  inf.join('c');
  inf.prefill('c', tokens.subarray(0, 1));
  inf.release();
  stage.release();
});

test('a later stage checks the activation rows it is sent', () => {
  const config = gptConfig('gpt-micro');
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 8 });
  const s1 = inferenceFromCheckpoint(engine, encodeStage(stage), { from: 2, to: partCount(config) });
  s1.join('x');
  assert.throws(() => s1.prefill('x', new Float32Array(config.channels + 1)), /activation rows of 16 floats/);
  assert.throws(() => s1.prefill('x', new Float32Array(config.channels).fill(NaN)), /non-finite/);
  assert.throws(() => s1.prefill('x', Int32Array.of(1)), /activation rows/);
  assert.equal(s1.prefill('x', new Float32Array(2 * config.channels)).length, config.vocabSize);
  s1.release();
  stage.release();
});

test('on the plain SIMD build (no fused multiply-add) and one thread, the bound is 0 too', async () => {
  const plain = await Engine.create({ threads: 1, simd: 'plain' });
  try {
    assert.equal(plain.relaxedSimd, false);
    const config = gptConfig('gpt-tiny');
    const V = config.vocabSize;
    const stage = new GptStage(plain, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 5 });
    const tokens = randomTokens(40, 9);
    const want = (stage.forward(tokens, 1, tokens.length) as Float32Array).slice();
    const inf = inferenceFromStage(plain, stage);
    inf.join('s');
    assertSameBits(inf.prefill('s', tokens.subarray(0, 20)), row(want, 19, V), 'plain prefill');
    for (let t = 20; t < tokens.length; t++) assertSameBits(inf.decode([{ session: 's', input: tokens.subarray(t, t + 1) }]), row(want, t, V), `plain decode at ${t}`);
    inf.release();
    stage.release();
  } finally {
    await plain.close();
  }
});
