// Hugging Face model folders (src/model/hf/): config.json of each
// architecture read into one decoder config; the weights, single or sharded,
// in F32, F16 or BF16, read one tensor at a time; and every bad folder
// refused with one line that names the file and what is wrong.
import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { importFolder } from '../../../src/model/hf/convert.ts';
import { decoderConfigFromHf, decoderParamCount } from '../../../src/model/hf/decoder-config.ts';
import { hfTensorSpecs } from '../../../src/model/hf/hf-tensors.ts';
import { ModelFolder } from '../../../src/model/hf/model-folder.ts';
import { SafetensorsReader, writeSafetensorsFile } from '../../../src/model/hf/safetensors-file.ts';
import { TextTokenizer } from '../../../src/model/hf/tokenizer.ts';
import { TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG, writeRandomFolder } from '../../helpers/hf-folder.ts';

const root = mkdtempSync(join(tmpdir(), 'nimble-hf-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const folder = (hf: Record<string, unknown>, options: Parameters<typeof writeRandomFolder>[2] = {}): string => {
  const dir = join(root, `m${n++}`);
  writeRandomFolder(dir, hf, options);
  return dir;
};

test('config.json of Llama, Mistral, Qwen2 and GPT-2 read into one decoder config', () => {
  const llama = decoderConfigFromHf(TINY_LLAMA_CONFIG);
  assert.deepEqual(
    { norm: llama.norm, position: llama.position, mlp: llama.mlp, kvHeads: llama.kvHeads, headDim: llama.headDim, qkvBias: llama.qkvBias, tied: llama.tiedEmbeddings },
    { norm: 'rmsnorm', position: 'rope', mlp: 'swiglu', kvHeads: 2, headDim: 16, qkvBias: false, tied: false },
  );
  const qwen = decoderConfigFromHf(TINY_QWEN2_CONFIG);
  assert.deepEqual([qwen.architecture, qwen.qkvBias, qwen.attnOutBias, qwen.tiedEmbeddings, qwen.ropeTheta, qwen.kvHeads], ['qwen2', true, false, true, 1e6, 1]);
  const gpt2 = decoderConfigFromHf(TINY_GPT2_CONFIG);
  assert.deepEqual([gpt2.norm, gpt2.position, gpt2.mlp, gpt2.intermediateSize, gpt2.tiedEmbeddings, gpt2.mlpBias], ['layernorm', 'learned', 'gelu', 256, true, true]);
  const mistral = decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, model_type: 'mistral', max_position_embeddings: 32768, sliding_window: 4096 });
  assert.equal(mistral.contextLength, 4096);
  const llama3 = decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 } });
  assert.deepEqual(llama3.ropeScaling, { kind: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalContextLength: 8192 });
  assert.deepEqual(decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, rope_scaling: { type: 'linear', factor: 2 } }).ropeScaling, { kind: 'linear', factor: 2 });
});

test('parameter counts: GPT-2 124M and TinyLlama 1.1B from their published configs', () => {
  const gpt2 = decoderConfigFromHf({ model_type: 'gpt2', vocab_size: 50257, n_embd: 768, n_layer: 12, n_head: 12, n_positions: 1024 });
  assert.equal(decoderParamCount(gpt2), 124_439_808);
  const tinyllama = decoderConfigFromHf({
    model_type: 'llama', vocab_size: 32000, hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 22, num_attention_heads: 32, num_key_value_heads: 4, max_position_embeddings: 2048, rms_norm_eps: 1e-5, tie_word_embeddings: false,
  });
  assert.equal(decoderParamCount(tinyllama), 1_100_048_384);
});

test('configs the engine does not run are refused with the field that says why', () => {
  const cases: [unknown, RegExp][] = [
    [{ ...TINY_LLAMA_CONFIG, model_type: 'bert' }, /model_type "bert" is not supported/],
    [{ ...TINY_LLAMA_CONFIG, hidden_act: 'gelu' }, /hidden_act "gelu" is not supported/],
    [{ ...TINY_LLAMA_CONFIG, rope_scaling: { rope_type: 'yarn', factor: 4 } }, /rope_scaling type "yarn" is not supported/],
    [{ ...TINY_LLAMA_CONFIG, num_key_value_heads: 3 }, /not a multiple of num_key_value_heads 3/],
    [{ ...TINY_LLAMA_CONFIG, hidden_size: -4 }, /hidden_size must be a positive integer/],
    [{ ...TINY_LLAMA_CONFIG, vocab_size: undefined }, /vocab_size is missing/],
    [{ ...TINY_LLAMA_CONFIG, quantization_config: { quant_method: 'gptq' } }, /quantized checkpoints/],
    [{ ...TINY_GPT2_CONFIG, activation_function: 'relu' }, /activation_function "relu"/],
    [[1, 2], /not a JSON object/],
  ];
  for (const [c, re] of cases) assert.throws(() => decoderConfigFromHf(c), (err: Error) => re.test(err.message) && err.message.startsWith('config.json: '), JSON.stringify(c).slice(0, 80));
});

for (const [name, hf] of [['llama', TINY_LLAMA_CONFIG], ['qwen2', TINY_QWEN2_CONFIG], ['gpt2', TINY_GPT2_CONFIG]] as const) {
  test(`${name}: a folder in F32, F16 and BF16, single and sharded, reads back the same values`, () => {
    const f32 = ModelFolder.open(folder(hf, { dtype: 'F32', seed: 3 }));
    const sharded = ModelFolder.open(folder(hf, { dtype: 'F32', seed: 3, maxShardBytes: 100_000 }));
    const bf16 = ModelFolder.open(folder(hf, { dtype: 'BF16', seed: 3 }));
    const f16 = ModelFolder.open(folder(hf, { dtype: 'F16', seed: 3 }));
    try {
      const specs = hfTensorSpecs(f32.config);
      assert.equal(f32.entries.size, specs.length);
      for (const { name: t } of specs) {
        const ref = f32.read(t);
        assert.deepEqual(sharded.read(t), ref, t);
        const b = bf16.read(t);
        const h = f16.read(t);
        for (let i = 0; i < ref.length; i++) {
          assert.ok(Math.abs(b[i] - ref[i]) <= Math.abs(ref[i]) * 2 ** -8, `${t}[${i}] bf16`);
          assert.ok(Math.abs(h[i] - ref[i]) <= Math.abs(ref[i]) * 2 ** -11 + 2 ** -25, `${t}[${i}] f16`);
        }
      }
      assert.ok(f32.largestTensorBytes >= 512 * 64 * 4);
      const tok = TextTokenizer.fromFolder(f32.dir, f32.config.vocabSize);
      assert.equal(tok.decode(tok.encode('Call me Ishmael.', false)), 'Call me Ishmael.');
      assert.deepEqual(tok.eosTokenIds.includes(2), true);
    } finally {
      for (const f of [f32, sharded, bf16, f16]) f.close();
    }
  });
}

test('GPT-2 checkpoints saved with the transformer. prefix and the old attention buffers are read', () => {
  const dir = folder(TINY_GPT2_CONFIG);
  const reader = SafetensorsReader.open(join(dir, 'model.safetensors'));
  const tensors = [...reader.entries.values()].map((e) => ({ name: `transformer.${e.name}`, shape: e.shape, values: () => reader.read(e.name) }));
  tensors.push({ name: 'transformer.h.0.attn.bias', shape: [1, 1, 128, 128], values: () => new Float32Array(128 * 128) });
  writeSafetensorsFile(join(dir, 'model.safetensors.new'), tensors, 'F32');
  reader.close();
  writeFileSync(join(dir, 'model.safetensors'), readFileSync(join(dir, 'model.safetensors.new')));
  rmSync(join(dir, 'model.safetensors.new'));
  const f = ModelFolder.open(dir);
  assert.equal(f.entries.has('wte.weight'), true);
  assert.equal(f.entries.has('h.0.attn.bias'), false);
  f.close();
});

test('bad folders are refused, each with one line naming the file and the problem', () => {
  const fails = (dir: string, re: RegExp): void => {
    assert.throws(() => ModelFolder.open(dir), (err: Error) => re.test(err.message) && !err.message.includes('\n'), `${dir}: ${re}`);
  };
  // a tensor missing, one too many, one of the wrong shape
  const rewrite = (dir: string, edit: (t: { name: string; shape: readonly number[]; values: () => Float32Array }[]) => void): void => {
    const reader = SafetensorsReader.open(join(dir, 'model.safetensors'));
    const tensors = [...reader.entries.values()].map((e) => ({ name: e.name, shape: e.shape, values: () => reader.read(e.name) }));
    edit(tensors);
    writeSafetensorsFile(join(dir, 'new.bin'), tensors, 'F32');
    reader.close();
    writeFileSync(join(dir, 'model.safetensors'), readFileSync(join(dir, 'new.bin')));
    rmSync(join(dir, 'new.bin'));
  };
  let d = folder(TINY_LLAMA_CONFIG);
  rewrite(d, (t) => t.splice(t.findIndex((x) => x.name === 'model.norm.weight'), 1));
  fails(d, /missing tensor model\.norm\.weight/);
  d = folder(TINY_LLAMA_CONFIG);
  rewrite(d, (t) => t.push({ name: 'model.extra.weight', shape: [2], values: () => new Float32Array(2) }));
  fails(d, /unexpected tensor model\.extra\.weight/);
  d = folder(TINY_LLAMA_CONFIG);
  writeFileSync(join(d, 'config.json'), JSON.stringify({ ...TINY_LLAMA_CONFIG, intermediate_size: 192 }));
  fails(d, /mlp\.gate_proj\.weight: \[160, 64\] where the config says \[192, 64\]/);
  // a model_type the engine does not run
  d = folder(TINY_LLAMA_CONFIG);
  writeFileSync(join(d, 'config.json'), JSON.stringify({ ...TINY_LLAMA_CONFIG, model_type: 'mamba' }));
  fails(d, /config\.json: model_type "mamba" is not supported/);
  // an unknown dtype
  d = folder(TINY_LLAMA_CONFIG);
  const file = join(d, 'model.safetensors');
  const bytes = readFileSync(file);
  const headerLen = Number(bytes.readBigUInt64LE(0));
  const header = bytes.subarray(8, 8 + headerLen).toString().replace('"F32"', '"I64"');
  writeFileSync(file, Buffer.concat([bytes.subarray(0, 8), Buffer.from(header), bytes.subarray(8 + headerLen)]));
  fails(d, /model\.safetensors: .*dtype "I64" is not supported \(F32, F16 or BF16\)/);
  // truncated, and oversized
  d = folder(TINY_LLAMA_CONFIG);
  truncateSync(join(d, 'model.safetensors'), 5000);
  fails(d, /model\.safetensors: .*truncated/);
  d = folder(TINY_LLAMA_CONFIG);
  appendFileSync(join(d, 'model.safetensors'), Buffer.alloc(16));
  fails(d, /model\.safetensors: 16 bytes after the last tensor/);
  // no weights; an index naming a file outside the folder; a config that is not JSON
  d = folder(TINY_LLAMA_CONFIG);
  rmSync(join(d, 'model.safetensors'));
  fails(d, /no weights in .*: neither model\.safetensors nor model\.safetensors\.index\.json/);
  d = folder(TINY_LLAMA_CONFIG, { maxShardBytes: 100_000 });
  const index = JSON.parse(readFileSync(join(d, 'model.safetensors.index.json'), 'utf8'));
  index.weight_map['model.norm.weight'] = '../../etc/passwd.safetensors';
  writeFileSync(join(d, 'model.safetensors.index.json'), JSON.stringify(index));
  fails(d, /model\.safetensors\.index\.json: model\.norm\.weight names "\.\.\/\.\.\/etc\/passwd\.safetensors", not a \.safetensors file in the folder/);
  d = folder(TINY_LLAMA_CONFIG);
  writeFileSync(join(d, 'config.json'), '{"model_type": ');
  fails(d, /config\.json: not valid JSON/);
  fails(join(root, 'nowhere'), /not a folder/);
  // a NaN weight is refused when read, naming the tensor
  d = folder(TINY_LLAMA_CONFIG);
  rewrite(d, (t) => {
    const i = t.findIndex((x) => x.name === 'model.norm.weight');
    t[i] = { ...t[i], values: () => new Float32Array(64).fill(NaN) };
  });
  const f = ModelFolder.open(d);
  assert.throws(() => f.read('model.norm.weight'), /model\.norm\.weight holds a non-finite value at 0/);
  f.close();
  // an import, which reads in pieces of rows or gathers a transposed tensor from its stored bytes, names the tensor and the element too, and leaves no file
  for (const [name, at] of [['model.layers.1.self_attn.k_proj.weight', 37], ['model.embed_tokens.weight', 300]] as const) {
    d = folder(TINY_LLAMA_CONFIG);
    rewrite(d, (t) => {
      const i = t.findIndex((x) => x.name === name);
      const values = t[i].values();
      values[at] = -Infinity;
      t[i] = { ...t[i], values: () => values };
    });
    const out = join(d, 'out.safetensors');
    assert.throws(() => importFolder(d, out), new RegExp(`${name.replace(/\./g, '\\.')} holds a non-finite value at ${at}$`));
    assert.ok(!existsSync(out) && !readdirSync(d).some((n) => n.startsWith('out.')), 'nothing is left');
  }
});
