// LoRA's spec and what a LoRA stage trains (src/model/lora.ts, GptStage's
// options.lora): targets checked against the family, adapters laid out on
// the fused linears' column blocks with PEFT's init, only the adapters in
// params/grads (and so in AdamW's state), the frozen base untouched, B = 0
// giving exactly the base model's logits, dropout drawn from its seed, and
// adapters merged into the base (StageInference's lora option) serving what
// the unmerged training forward computes, within f32 rounding.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { StageInference } from '../../src/inference/stage-inference.ts';
import { AdamW } from '../../src/model/adamw.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../src/model/hf/decoder-config.ts';
import { loraLayout, loraSites, validateLoraSpec, type LoraSpec } from '../../src/model/lora.ts';
import { partCount } from '../../src/model/parts.ts';
import { randomValues, TINY_GPT2_CONFIG, TINY_QWEN2_CONFIG } from '../helpers/hf-folder.ts';

const qwen2 = gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_QWEN2_CONFIG, vocab_size: 64, hidden_size: 32, intermediate_size: 48, max_position_embeddings: 8, head_dim: 8 }));
const gpt2 = gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_GPT2_CONFIG, vocab_size: 64, n_embd: 32, n_positions: 8 }));
const whole = { from: 0, to: partCount(qwen2) };
const B = 2, T = 8;
let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const tokens = (V: number): Int32Array => Int32Array.from({ length: B * T }, (_, i) => (i * 7 + 3) % V);
const targets = (V: number): Int32Array => Int32Array.from({ length: B * T }, (_, i) => (i * 5 + 1) % V);

test('a spec is checked: its schema, and its targets against the family', () => {
  const ok = validateLoraSpec({ rank: 8, alpha: 16, dropout: 0.05, targets: ['v_proj', 'q_proj'] }, qwen2);
  assert.deepEqual(ok.targets, ['q_proj', 'v_proj'], 'layout order');
  assert.throws(() => validateLoraSpec({ rank: 0, alpha: 16, dropout: 0, targets: ['q_proj'] }, qwen2), /lora spec: \/rank/);
  assert.throws(() => validateLoraSpec({ rank: 8, alpha: 16, dropout: 1, targets: ['q_proj'] }, qwen2), /lora spec: \/dropout/);
  assert.throws(() => validateLoraSpec({ rank: 8, alpha: 16, dropout: 0, targets: [] }, qwen2), /lora spec: \/targets/);
  assert.throws(() => validateLoraSpec({ rank: 8, alpha: 16, dropout: 0, targets: ['c_attn'] }, qwen2), /target "c_attn" is not a module of a qwen2 block/);
  assert.throws(() => validateLoraSpec({ rank: 8, alpha: 16, dropout: 0, targets: ['q_proj'] }, gpt2), /not a module of a gpt2 block \(one of c_attn, c_proj, c_fc\)/);
  assert.throws(() => validateLoraSpec({ rank: 8, alpha: 16, dropout: 0, targets: ['q_proj', 'q_proj'] }, qwen2), /named twice/);
  assert.throws(() => validateLoraSpec(null, qwen2), /lora spec/);
  assert.throws(() => new GptStage(engine, qwen2, whole, { batchSize: 1, lora: { rank: 2, alpha: 2, dropout: 0, targets: ['c_fc'] } }), /c_fc/);
});

test('adapters sit on the fused linears\' column blocks, with PEFT\'s shapes and init', () => {
  const spec = validateLoraSpec({ rank: 4, alpha: 8, dropout: 0, targets: ['q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj', 'down_proj', 'o_proj'] }, qwen2);
  const sites = loraSites(qwen2, spec);
  const q = 4 * 8, kv = 1 * 8;
  assert.deepEqual(sites.map((s) => [s.module, s.linear, s.col, s.width, s.inFeatures]), [
    ['self_attn.q_proj', 'attn.qkv', 0, q, 32], ['self_attn.k_proj', 'attn.qkv', q, kv, 32], ['self_attn.v_proj', 'attn.qkv', q + kv, kv, 32],
    ['self_attn.o_proj', 'attn.proj', 0, 32, q], ['mlp.gate_proj', 'mlp.fc', 0, 48, 32], ['mlp.up_proj', 'mlp.fc', 48, 48, 32], ['mlp.down_proj', 'mlp.proj', 0, 32, 48],
  ]);
  const g = loraSites(gpt2, validateLoraSpec({ rank: 4, alpha: 8, dropout: 0, targets: ['c_proj'] }, gpt2));
  assert.deepEqual(g.map((s) => s.module), ['attn.c_proj', 'mlp.c_proj'], "gpt2's c_proj adapts attention's and the MLP's, as PEFT's suffix match does");
  const stage = new GptStage(engine, qwen2, whole, { batchSize: 1, seed: 3, lora: spec });
  try {
    const a = stage.params.get('h.1.lora.mlp.down_proj.A'), b = stage.params.get('h.1.lora.mlp.down_proj.B');
    assert.deepEqual([a.shape, b.shape], [[4, 48], [32, 4]]);
    const bound = 1 / Math.sqrt(48);
    assert.ok(a.data.every((v) => Math.abs(v) <= bound) && a.data.some((v) => Math.abs(v) > bound / 2), 'A is uniform ±1/√in');
    assert.ok(b.data.every((v) => v === 0), 'B is zeros');
  } finally {
    stage.release();
  }
});

test('a LoRA stage trains only its adapters: params, grads and AdamW hold them alone; the base is not touched; B = 0 gives the base model\'s logits exactly', (t) => {
  const spec: LoraSpec = { rank: 4, alpha: 8, dropout: 0.1, targets: ['q_proj', 'v_proj', 'down_proj'] };
  const full = new GptStage(engine, qwen2, whole, { batchSize: B, seed: 5 });
  const lora = new GptStage(engine, qwen2, whole, { batchSize: B, seed: 5, lora: spec });
  try {
    assert.equal(lora.layout.size, loraLayout(qwen2, validateLoraSpec(spec, qwen2), whole).size);
    assert.equal(lora.layout.size, 2 * (4 * 32 + 32 * 4 + 4 * 32 + 8 * 4 + 4 * 48 + 32 * 4));
    assert.ok(lora.grads.names().every((n) => n.includes('.lora.')), 'no base tensor has a gradient');
    assert.equal(lora.grads.flat.size, lora.layout.size);
    assert.deepEqual(lora.base!.flat.data, full.params.flat.data, 'the same seed gives the same base');
    const baseBefore = lora.base!.flat.data.slice();
    const V = qwen2.vocabSize;
    lora.training = false;
    assert.deepEqual(lora.forward(tokens(V), B, T) as Float32Array, full.forward(tokens(V), B, T) as Float32Array, 'B = 0: the base model, bit for bit');
    lora.training = true;
    const opt = new AdamW(engine, lora.params, lora.grads);
    t.after(() => opt.release());
    assert.equal(opt.m.size, lora.layout.size, 'AdamW state for the adapters alone');
    const first = lora.forward(tokens(V), B, T, targets(V)) as number;
    lora.zeroGrad();
    lora.backward();
    const bGrads = lora.grads.names().filter((n) => n.endsWith('.B')).map((n) => lora.grads.get(n).data);
    assert.ok(bGrads.every((g) => g.some((v) => v !== 0)), 'every B has a gradient');
    for (let i = 0; i < 5; i++) {
      lora.zeroGrad();
      lora.forward(tokens(V), B, T, targets(V));
      lora.backward();
      opt.update(1e-2);
    }
    assert.deepEqual(lora.base!.flat.data, baseBefore, 'the frozen base did not move');
    lora.training = false;
    const after = lora.forward(tokens(V), B, T, targets(V)) as number;
    assert.ok(after < first, `training the adapters lowers the loss: ${first} → ${after}`);
  } finally {
    full.release();
    lora.release();
  }
});

test('dropout masks come from their seed: the same seed, the same loss; another seed, another; none when not training', () => {
  const spec: LoraSpec = { rank: 4, alpha: 8, dropout: 0.5, targets: ['c_attn', 'c_fc'] };
  const stage = new GptStage(engine, gpt2, { from: 0, to: partCount(gpt2) }, { batchSize: B, seed: 9, lora: spec });
  const plain = new GptStage(engine, gpt2, { from: 0, to: partCount(gpt2) }, { batchSize: B, seed: 9, lora: { ...spec, dropout: 0 } });
  try {
    for (const n of stage.params.names()) if (n.endsWith('.B')) stage.params.get(n).data.set(randomValues(stage.params.get(n).size, 3, 0.3));
    plain.params.flat.data.set(stage.params.flat.data);
    const V = gpt2.vocabSize;
    const at = (seed?: number): number => stage.forward(tokens(V), B, T, targets(V), 0, seed) as number;
    assert.equal(at(1), at(1));
    assert.notEqual(at(1), at(2));
    assert.notEqual(at(), at(), 'by default each forward draws new masks');
    stage.training = false;
    assert.equal(at(1), plain.forward(tokens(V), B, T, targets(V)) as number);
  } finally {
    stage.release();
    plain.release();
  }
});

for (const [label, config, targets] of [['qwen2', qwen2, ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']], ['gpt2', gpt2, ['c_attn', 'c_proj', 'c_fc']]] as const) {
  test(`${label}: adapters merged into the base at load (serving) give the unmerged training forward's logits within f32 rounding`, () => {
    const spec: LoraSpec = { rank: 4, alpha: 16, dropout: 0, targets: [...targets] };
    const range = { from: 0, to: partCount(config) };
    const stage = new GptStage(engine, config, range, { batchSize: 1, seed: 11, lora: spec });
    const base = new GptStage(engine, config, range, { batchSize: 1, seed: 11 });
    try {
      for (const n of stage.params.names()) if (n.endsWith('.B')) stage.params.get(n).data.set(randomValues(stage.params.get(n).size, n.length, 0.3));
      const prompt = tokens(config.vocabSize).subarray(0, T);
      const V = config.vocabSize;
      const unmerged = (stage.forward(prompt, 1, T) as Float32Array).slice((T - 1) * V);
      const baseLogits = (base.forward(prompt, 1, T) as Float32Array).slice((T - 1) * V);
      const served = new StageInference(engine, config, range, stage.base!.flat.data, { maxSessions: 1, lora: { spec, adapters: stage.params.flat.data } });
      try {
        served.join('s');
        const merged = served.prefill('s', prompt);
        let diff = 0, moved = 0;
        for (let v = 0; v < V; v++) {
          diff = Math.max(diff, Math.abs(merged[v] - unmerged[v]));
          moved = Math.max(moved, Math.abs(unmerged[v] - baseLogits[v]));
        }
        assert.ok(diff <= 1e-5, `merged vs unmerged: max |Δlogit| ${diff}`);
        assert.ok(moved > 1e-2, `the adapter changes the logits (by ${moved})`);
      } finally {
        served.release();
      }
      assert.throws(() => new StageInference(engine, config, range, stage.base!.flat.data, { lora: { spec, adapters: new Float32Array(3) } }), /3 adapter values where the spec takes/);
      const bad = stage.params.flat.data.slice();
      bad[5] = NaN;
      assert.throws(() => new StageInference(engine, config, range, stage.base!.flat.data, { lora: { spec, adapters: bad } }), /adapter value 5 is not finite/);
    } finally {
      stage.release();
      base.release();
    }
  });
}
