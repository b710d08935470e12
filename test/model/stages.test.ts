// Cutting the GPT into stages and chaining forward / backward by hand gives
// the same loss and gradients as the whole model, bit for bit: each stage runs
// exactly the kernels the whole model runs, on the same values.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { GptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { headPart, partCount, partName, partParamCount, rangeParamCount, splitEvenly, type StageRange } from '../../src/model/parts.ts';
import { batchForShard } from '../../src/data/batches.ts';

const config: GptConfig = { vocabSize: 256, contextLength: 16, channels: 32, layers: 3, heads: 4, mlpRatio: 4 };
const B = 3, T = 16;
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

function corpus(): Uint8Array {
  return new TextEncoder().encode('It was the best of times, it was the worst of times, it was the age of wisdom. '.repeat(20));
}

/** Runs forward then backward through `ranges`; returns the loss and every gradient by name. */
function runChain(ranges: StageRange[]): { loss: number; grads: Map<string, Float32Array>; stages: GptStage[] } {
  const stages = ranges.map((r) => new GptStage(engine, config, r, { batchSize: B, seed: 42 }));
  const batch = batchForShard(corpus(), 5, 3, B, T);
  let x: Int32Array | Float32Array = batch.inputs;
  let loss = NaN;
  for (const s of stages) {
    s.zeroGrad();
    const out = s.forward(x, B, T, s.isLast ? batch.targets : undefined);
    if (typeof out === 'number') loss = out;
    else x = out.slice(); // what the network would carry
  }
  let g: Float32Array | undefined;
  for (let i = stages.length - 1; i >= 0; i--) {
    const d = stages[i].backward(g);
    g = d ? d.slice() : undefined;
  }
  const grads = new Map<string, Float32Array>();
  for (const s of stages) for (const name of s.grads.names()) grads.set(name, s.grads.get(name).data.slice());
  return { loss, grads, stages };
}

test('1, 2, 3 and L+2 stages give the whole model\'s loss and gradients bitwise', () => {
  const parts = partCount(config);
  const whole = runChain([{ from: 0, to: parts }]);
  assert.ok(whole.loss > 4 && whole.loss < 7, `initial loss ${whole.loss} near ln 256`);
  const cuts: StageRange[][] = [
    splitEvenly(config, 2),
    splitEvenly(config, 3),
    Array.from({ length: parts }, (_, p) => ({ from: p, to: p + 1 })),
    [{ from: 0, to: 2 }, { from: 2, to: parts }],
  ];
  for (const ranges of cuts) {
    const split = runChain(ranges);
    const label = ranges.map((r) => `[${r.from},${r.to})`).join(' ');
    assert.equal(split.loss, whole.loss, `loss with ${label}`);
    assert.equal(split.grads.size, whole.grads.size);
    for (const [name, g] of whole.grads) {
      assert.deepEqual(split.grads.get(name), g, `gradient of ${name} with ${label}`);
    }
    for (const s of split.stages) s.release();
  }
  for (const s of whole.stages) s.release();
});

test('splitEvenly covers every part once and balances parameters', () => {
  const tiny: GptConfig = { vocabSize: 256, contextLength: 64, channels: 128, layers: 4, heads: 4, mlpRatio: 4 };
  for (let s = 1; s <= partCount(tiny); s++) {
    const ranges = splitEvenly(tiny, s);
    assert.equal(ranges.length, s);
    assert.equal(ranges[0].from, 0);
    assert.equal(ranges[s - 1].to, partCount(tiny));
    for (let i = 1; i < s; i++) assert.equal(ranges[i].from, ranges[i - 1].to);
    for (const r of ranges) assert.ok(r.to > r.from);
  }
  assert.throws(() => splitEvenly(tiny, 0), RangeError);
  assert.throws(() => splitEvenly(tiny, partCount(tiny) + 1), RangeError);
});

test('part counts: L + 2 parts, the head last, and parameter counts equal what a stage allocates', () => {
  assert.equal(partCount(config), config.layers + 2);
  assert.equal(headPart(config), config.layers + 1);
  assert.deepEqual(Array.from({ length: partCount(config) }, (_, p) => partName(config, p)), ['embedding', 'block 0', 'block 1', 'block 2', 'head']);
  let total = 0;
  for (let p = 0; p < partCount(config); p++) {
    const stage = new GptStage(engine, config, { from: p, to: p + 1 }, { batchSize: 1 });
    assert.equal(partParamCount(config, p), stage.paramCount, `part ${p}`);
    assert.equal(rangeParamCount(config, { from: p, to: p + 1 }), stage.paramCount);
    total += stage.paramCount;
    stage.release();
  }
  assert.equal(rangeParamCount(config, { from: 0, to: partCount(config) }), total);
  assert.throws(() => partParamCount(config, partCount(config)), RangeError);
  assert.throws(() => partParamCount(config, -1), RangeError);
});

test('bad stage inputs are refused with clear errors', () => {
  const parts = partCount(config);
  assert.throws(() => new GptStage(engine, config, { from: 2, to: 2 }, { batchSize: 1 }), /bad stage range/);
  assert.throws(() => new GptStage(engine, config, { from: 0, to: parts + 1 }, { batchSize: 1 }), /bad stage range/);
  const first = new GptStage(engine, config, { from: 0, to: 2 }, { batchSize: 2 });
  assert.throws(() => first.forward(new Int32Array(2 * T).fill(300), 2, T), /outside the vocabulary/);
  assert.throws(() => first.forward(new Int32Array(5), 2, T), /token ids/);
  assert.throws(() => first.forward(new Int32Array(3 * T), 3, T), /exceeds/);
  const middle = new GptStage(engine, config, { from: 2, to: 3 }, { batchSize: 2 });
  assert.throws(() => middle.forward(new Float32Array(7), 2, T), /activation/);
  middle.forward(new Float32Array(2 * T * config.channels), 2, T);
  assert.throws(() => middle.backward(new Float32Array(3)), /gradient/);
  first.release();
  middle.release();
});

test('two microbatches in flight in separate slots give the same gradients as one after the other', () => {
  const parts = partCount(config);
  const a = batchForShard(corpus(), 5, 1, B, T);
  const b = batchForShard(corpus(), 5, 2, B, T);
  const seq = new GptStage(engine, config, { from: 0, to: parts }, { batchSize: B, seed: 42 });
  seq.zeroGrad();
  const la = seq.forward(a.inputs, B, T, a.targets) as number;
  seq.backward();
  const lb = seq.forward(b.inputs, B, T, b.targets) as number;
  seq.backward();
  const piped = new GptStage(engine, config, { from: 0, to: parts }, { batchSize: B, seed: 42, slots: 2 });
  assert.equal(piped.slotCount, 2);
  piped.zeroGrad();
  assert.equal(piped.forward(a.inputs, B, T, a.targets, 0), la);
  assert.equal(piped.forward(b.inputs, B, T, b.targets, 1), lb);
  piped.backward(undefined, 0);
  piped.backward(undefined, 1);
  assert.deepEqual(piped.grads.flat.data.slice(), seq.grads.flat.data.slice());
  assert.throws(() => piped.forward(a.inputs, B, T, a.targets, 2), /slot 2/);
  seq.release();
  piped.release();
});
