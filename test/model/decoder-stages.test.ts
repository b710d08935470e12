// Llama- and Qwen2-shaped stages (src/model/arch.ts) on the training path:
// the whole model's gradients agree with finite differences of its loss, for
// a sample of every parameter tensor (RMSNorm, rotary q/k, grouped-query
// attention, SwiGLU, q/k/v biases, the head), and cutting the model into
// stages gives the whole model's loss and gradients bitwise.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { GptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { partCount, partParams, splitEvenly, type StageRange } from '../../src/model/parts.ts';
import { TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG } from '../helpers/hf-folder.ts';

const small = (hf: Record<string, unknown>): GptConfig =>
  gptConfigOfDecoder(decoderConfigFromHf({ ...hf, vocab_size: 64, hidden_size: 32, intermediate_size: 48, max_position_embeddings: 8, head_dim: 8 }));
const CONFIGS: [string, GptConfig][] = [
  ['llama (4 query heads on 2 key/value heads)', small(TINY_LLAMA_CONFIG)],
  ['qwen2 (q/k/v biases, 1 key/value head)', small(TINY_QWEN2_CONFIG)],
  ['llama with heads · headDim ≠ channels', small({ ...TINY_LLAMA_CONFIG, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 12 })],
];
const B = 2, T = 8;
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

function batch(V: number): { inputs: Int32Array; targets: Int32Array } {
  const inputs = new Int32Array(B * T), targets = new Int32Array(B * T);
  for (let i = 0; i < B * T; i++) {
    inputs[i] = (i * 7 + 3) % V;
    targets[i] = (i * 5 + 1) % V;
  }
  return { inputs, targets };
}

function chain(config: GptConfig, ranges: StageRange[]): { loss: number; grads: Map<string, Float32Array>; stages: GptStage[] } {
  const stages = ranges.map((r) => new GptStage(engine, config, r, { batchSize: B, seed: 7 }));
  const { inputs, targets } = batch(config.vocabSize);
  let x: Int32Array | Float32Array = inputs;
  let loss = NaN;
  for (const s of stages) {
    s.zeroGrad();
    const out = s.forward(x, B, T, s.isLast ? targets : undefined);
    if (typeof out === 'number') loss = out;
    else x = out.slice();
  }
  let g: Float32Array | undefined;
  for (let i = stages.length - 1; i >= 0; i--) g = stages[i].backward(g)?.slice();
  const grads = new Map<string, Float32Array>();
  for (const s of stages) for (const name of s.grads.names()) grads.set(name, s.grads.get(name).data.slice());
  return { loss, grads, stages };
}

for (const [label, config] of CONFIGS) {
  test(`${label}: gradients agree with finite differences of the loss`, () => {
    const whole = chain(config, [{ from: 0, to: partCount(config) }]);
    const [stage] = whole.stages;
    try {
      const { inputs, targets } = batch(config.vocabSize);
      const lossAt = (): number => stage.forward(inputs, B, T, targets) as number;
      const h = 1e-2;
      let checked = 0;
      for (const name of stage.params.names()) {
        const p = stage.params.get(name).data;
        const g = whole.grads.get(name)!;
        // the largest gradients of the tensor, and one at random: a sample that cannot be all zeros
        const order = [...g.keys()].sort((a, b) => Math.abs(g[b]) - Math.abs(g[a]));
        for (const i of [order[0], order[1], order[Math.floor(order.length / 2)]]) {
          const keep = p[i];
          p[i] = keep + h;
          const up = lossAt();
          p[i] = keep - h;
          const down = lossAt();
          p[i] = keep;
          const fd = (up - down) / (2 * h);
          assert.ok(Math.abs(fd - g[i]) <= 2e-3 + 0.05 * Math.abs(g[i]), `${name}[${i}]: analytic ${g[i]}, finite difference ${fd}`);
          checked++;
        }
      }
      assert.ok(checked >= 3 * partParams(config, 1).length, `checked ${checked} values`);
    } finally {
      stage.release();
    }
  });

  test(`${label}: stages give the whole model's loss and gradients bitwise`, () => {
    const whole = chain(config, [{ from: 0, to: partCount(config) }]);
    for (const ranges of [splitEvenly(config, 2), Array.from({ length: partCount(config) }, (_, p) => ({ from: p, to: p + 1 }))]) {
      const split = chain(config, ranges);
      assert.equal(split.loss, whole.loss);
      for (const [name, g] of whole.grads) assert.deepEqual(split.grads.get(name), g, name);
      for (const s of split.stages) s.release();
    }
    for (const s of whole.stages) s.release();
  });
}

test('an arch the kernels cannot run is refused with the reason', () => {
  const base = small(TINY_LLAMA_CONFIG);
  assert.throws(() => new GptStage(engine, { ...base, arch: { ...base.arch!, headDim: 6 } }, { from: 0, to: 1 }, { batchSize: 1 }), /head width 6 must be a multiple of 4/);
  assert.throws(() => new GptStage(engine, { ...base, heads: 3 }, { from: 0, to: 1 }, { batchSize: 1 }), /3 query heads are not a multiple of 2 key\/value heads/);
});
