// LoRA adapters' gradients (src/model/lora-linear.ts through GptStage's
// options.lora) against finite differences of the loss: every A and B of
// every target kind, Llama-shaped (fused q/k/v and gate/up column blocks) and
// GPT-2-shaped (c_attn, both c_proj, c_fc), without and with dropout (the
// same dropout seed for every forward, so the masks are the same); and a
// model cut into stages gives the whole model's adapter gradients bitwise.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { GptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { loraTargets, type LoraSpec } from '../../src/model/lora.ts';
import { partCount, type StageRange } from '../../src/model/parts.ts';
import { randomValues, TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG } from '../helpers/hf-folder.ts';

const llama = gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, vocab_size: 64, hidden_size: 32, intermediate_size: 48, max_position_embeddings: 8, head_dim: 8 }));
const gpt2 = gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_GPT2_CONFIG, vocab_size: 64, n_embd: 32, n_positions: 8 }));
const B = 2, T = 8;
const DROPOUT_SEED = 4242;
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

/** LoRA stages over the same base (seed 7), every B set to random values so that A's gradients are not zero. */
function loraStages(config: GptConfig, spec: LoraSpec, ranges: StageRange[]): GptStage[] {
  return ranges.map((r) => {
    const s = new GptStage(engine, config, r, { batchSize: B, seed: 7, lora: spec });
    for (const name of s.params.names()) if (name.endsWith('.B')) s.params.get(name).data.set(randomValues(s.params.get(name).size, name.length * 131 + 7, 0.2));
    return s;
  });
}

function run(stages: GptStage[], config: GptConfig): { loss: number; grads: Map<string, Float32Array> } {
  const { inputs, targets } = batch(config.vocabSize);
  let x: Int32Array | Float32Array = inputs;
  let loss = NaN;
  for (const s of stages) {
    s.zeroGrad();
    const out = s.forward(x, B, T, s.isLast ? targets : undefined, 0, DROPOUT_SEED);
    if (typeof out === 'number') loss = out;
    else x = out.slice();
  }
  let g: Float32Array | undefined;
  for (let i = stages.length - 1; i >= 0; i--) g = stages[i].backward(g)?.slice();
  const grads = new Map<string, Float32Array>();
  for (const s of stages) for (const name of s.grads.names()) grads.set(name, s.grads.get(name).data.slice());
  return { loss, grads };
}

const CASES: [string, GptConfig][] = [['llama', llama], ['gpt2', gpt2]];
for (const [label, config] of CASES) {
  for (const dropout of [0, 0.25]) {
    const spec: LoraSpec = { rank: 4, alpha: 8, dropout, targets: [...loraTargets(config.arch!)] };
    test(`${label}, every target, dropout ${dropout}: the adapters' gradients agree with finite differences of the loss`, () => {
      const [stage] = loraStages(config, spec, [{ from: 0, to: partCount(config) }]);
      try {
        const { grads } = run([stage], config);
        const { inputs, targets } = batch(config.vocabSize);
        const lossAt = (): number => stage.forward(inputs, B, T, targets, 0, DROPOUT_SEED) as number;
        const h = 1e-2;
        let checked = 0;
        for (const name of stage.params.names()) {
          const p = stage.params.get(name).data;
          const g = grads.get(name)!;
          const order = [...g.keys()].sort((a, b) => Math.abs(g[b]) - Math.abs(g[a]));
          assert.ok(Math.abs(g[order[0]]) > 1e-4, `${name}: every gradient is zero`);
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
        // A and B of each module of each of the 2 blocks (gpt2's c_proj adapts two modules)
        const modules = label === 'gpt2' ? 4 : 7;
        assert.equal(checked, 3 * 2 * modules * config.layers);
      } finally {
        stage.release();
      }
    });
  }

  test(`${label}: LoRA stages cut [embedding | block | block + head] give the whole model's loss and adapter gradients bitwise`, () => {
    const spec: LoraSpec = { rank: 2, alpha: 4, dropout: 0.1, targets: [...loraTargets(config.arch!)].slice(0, 2) };
    const whole = loraStages(config, spec, [{ from: 0, to: partCount(config) }]);
    const split = loraStages(config, spec, [{ from: 0, to: 1 }, { from: 1, to: 2 }, { from: 2, to: partCount(config) }]);
    try {
      const a = run(whole, config), b = run(split, config);
      assert.equal(b.loss, a.loss);
      assert.equal(b.grads.size, a.grads.size);
      for (const [name, g] of a.grads) assert.deepEqual(b.grads.get(name), g, name);
    } finally {
      for (const s of [...whole, ...split]) s.release();
    }
  });
}
