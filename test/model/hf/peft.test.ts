// PEFT's adapter layout (src/model/hf/peft.ts): written and read back
// exactly, with PEFT's config fields and tensor names and shapes, and every
// kind of bad folder refused with one clear error.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { decoderConfigFromHf, gptConfigOfDecoder } from '../../../src/model/hf/decoder-config.ts';
import { ADAPTER_CONFIG, ADAPTER_WEIGHTS, readPeftAdapter, writePeftAdapter } from '../../../src/model/hf/peft.ts';
import { SafetensorsReader, writeSafetensorsFile } from '../../../src/model/hf/safetensors-file.ts';
import { loraLayout, type LoraSpec } from '../../../src/model/lora.ts';
import { partCount } from '../../../src/model/parts.ts';
import { randomValues, TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG } from '../../helpers/hf-folder.ts';

const llama = gptConfigOfDecoder(decoderConfigFromHf(TINY_LLAMA_CONFIG));
const gpt2 = gptConfigOfDecoder(decoderConfigFromHf(TINY_GPT2_CONFIG));
const root = mkdtempSync(join(tmpdir(), 'nimble-peft-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const fresh = (): string => join(root, `a${n++}`);

const LLAMA_SPEC: LoraSpec = { rank: 4, alpha: 8, dropout: 0.05, targets: ['q_proj', 'v_proj', 'down_proj'] };
const adaptersOf = (config: typeof llama, spec: LoraSpec): Float32Array => randomValues(loraLayout(config, spec, { from: 0, to: partCount(config) }).size, 5, 0.5);

function written(config = llama, spec = LLAMA_SPEC): { dir: string; adapters: Float32Array } {
  const dir = fresh();
  const adapters = adaptersOf(config, spec);
  writePeftAdapter(dir, config, { spec, adapters, baseModel: 'TinyLlama/TinyLlama-1.1B' });
  return { dir, adapters };
}

test('a Llama adapter is written with PEFT\'s config and names, and read back exactly', () => {
  const { dir, adapters } = written();
  const cfg = JSON.parse(readFileSync(join(dir, ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
  assert.deepEqual(
    { peft_type: cfg.peft_type, task_type: cfg.task_type, r: cfg.r, lora_alpha: cfg.lora_alpha, lora_dropout: cfg.lora_dropout, target_modules: cfg.target_modules, bias: cfg.bias, fan_in_fan_out: cfg.fan_in_fan_out, base: cfg.base_model_name_or_path },
    { peft_type: 'LORA', task_type: 'CAUSAL_LM', r: 4, lora_alpha: 8, lora_dropout: 0.05, target_modules: ['q_proj', 'v_proj', 'down_proj'], bias: 'none', fan_in_fan_out: false, base: 'TinyLlama/TinyLlama-1.1B' },
  );
  const reader = SafetensorsReader.open(join(dir, ADAPTER_WEIGHTS));
  try {
    assert.equal(reader.entries.size, 2 * 3 * 2);
    assert.deepEqual(reader.entries.get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')?.shape, [4, 64]);
    assert.deepEqual(reader.entries.get('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight')?.shape, [64, 4]);
    assert.deepEqual(reader.entries.get('base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight')?.shape, [32, 4], 'v: 2 key/value heads of 16');
    assert.deepEqual(reader.entries.get('base_model.model.model.layers.1.mlp.down_proj.lora_A.weight')?.shape, [4, 160]);
  } finally {
    reader.close();
  }
  const back = readPeftAdapter(dir, llama);
  assert.deepEqual(back.spec, LLAMA_SPEC);
  assert.equal(back.baseModel, 'TinyLlama/TinyLlama-1.1B');
  assert.deepEqual(back.adapters, adapters);
});

test('a GPT-2 adapter has fan_in_fan_out and the transformer.h names; c_proj adapts attention\'s and the MLP\'s; BF16 reads back rounded', () => {
  const spec: LoraSpec = { rank: 2, alpha: 4, dropout: 0, targets: ['c_attn', 'c_proj'] };
  const dir = fresh();
  const adapters = adaptersOf(gpt2, spec);
  writePeftAdapter(dir, gpt2, { spec, adapters, baseModel: null, dtype: 'BF16' });
  const cfg = JSON.parse(readFileSync(join(dir, ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
  assert.equal(cfg.fan_in_fan_out, true);
  const reader = SafetensorsReader.open(join(dir, ADAPTER_WEIGHTS));
  try {
    assert.deepEqual([...reader.entries.keys()].filter((k) => k.includes('.h.0.')).sort(), [
      'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight', 'base_model.model.transformer.h.0.attn.c_attn.lora_B.weight',
      'base_model.model.transformer.h.0.attn.c_proj.lora_A.weight', 'base_model.model.transformer.h.0.attn.c_proj.lora_B.weight',
      'base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight', 'base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight',
    ]);
    assert.deepEqual(reader.entries.get('base_model.model.transformer.h.0.attn.c_attn.lora_B.weight')?.shape, [192, 2]);
    assert.deepEqual(reader.entries.get('base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight')?.shape, [2, 256]);
  } finally {
    reader.close();
  }
  const back = readPeftAdapter(dir, gpt2);
  let max = 0;
  for (let i = 0; i < adapters.length; i++) max = Math.max(max, Math.abs(back.adapters[i] - adapters[i]) / Math.max(1e-3, Math.abs(adapters[i])));
  assert.ok(max < 1 / 128, `bf16 relative error ${max}`);
});

test('writing refuses a folder that is not empty, and a wrong number of values', () => {
  const { dir } = written();
  assert.throws(() => writePeftAdapter(dir, llama, { spec: LLAMA_SPEC, adapters: adaptersOf(llama, LLAMA_SPEC), baseModel: null }), /exists and is not empty/);
  assert.throws(() => writePeftAdapter(fresh(), llama, { spec: LLAMA_SPEC, adapters: new Float32Array(7), baseModel: null }), /7 values where the spec takes/);
});

/** A written adapter with its config edited. */
function withConfig(edit: (cfg: Record<string, unknown>) => void): string {
  const { dir } = written();
  const cfg = JSON.parse(readFileSync(join(dir, ADAPTER_CONFIG), 'utf8')) as Record<string, unknown>;
  edit(cfg);
  writeFileSync(join(dir, ADAPTER_CONFIG), JSON.stringify(cfg));
  return dir;
}

test('a bad adapter_config.json is refused with the field and the reason', () => {
  const cases: [(c: Record<string, unknown>) => void, RegExp][] = [
    [(c) => (c.peft_type = 'IA3'), /peft_type "IA3": only LORA/],
    [(c) => (c.task_type = 'SEQ_CLS'), /task_type "SEQ_CLS"/],
    [(c) => (c.use_dora = true), /use_dora true: DoRA is not supported/],
    [(c) => (c.use_rslora = true), /use_rslora true/],
    [(c) => (c.bias = 'all'), /bias "all": trained biases/],
    [(c) => (c.rank_pattern = { q_proj: 8 }), /rank_pattern/],
    [(c) => (c.layers_to_transform = [0]), /layers_to_transform/],
    [(c) => (c.modules_to_save = ['lm_head']), /modules_to_save/],
    [(c) => (c.target_modules = 'all-linear'), /target_modules must be a list/],
    [(c) => (c.target_modules = ['q_proj', 'c_fc']), /target "c_fc" is not a module of a llama block/],
    [(c) => (c.r = 0), /r .*>= 1|r Expected integer to be greater or equal to 1/],
    [(c) => (c.lora_dropout = 1.5), /lora_dropout/],
    [(c) => (c.r = 8), /has shape \[8, 64\] where the base model takes \[4, 64\]|shape \[4, 64\] where the base model takes \[8, 64\]/],
    [(c) => (c.target_modules = ['q_proj', 'v_proj', 'down_proj', 'k_proj']), /missing tensor base_model\.model\.model\.layers\.0\.self_attn\.k_proj\.lora_A\.weight/],
    [(c) => (c.target_modules = ['q_proj', 'v_proj']), /unexpected tensor base_model\.model\.model\.layers\.0\.mlp\.down_proj/],
  ];
  for (const [edit, re] of cases) assert.throws(() => readPeftAdapter(withConfig(edit), llama), re, re.source);
  const dir = written().dir;
  writeFileSync(join(dir, ADAPTER_CONFIG), '{not json');
  assert.throws(() => readPeftAdapter(dir, llama), /adapter_config\.json: not valid JSON/);
  assert.throws(() => readPeftAdapter(fresh(), llama), /adapter_config\.json: missing/);
});

test('bad weights are refused: the wrong base model, a non-finite value, a truncated file, an unsupported dtype, no file', () => {
  const { dir } = written();
  assert.throws(() => readPeftAdapter(dir, gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, hidden_size: 32 }))), /where the base model takes/);
  assert.throws(() => readPeftAdapter(dir, gptConfigOfDecoder(decoderConfigFromHf({ ...TINY_LLAMA_CONFIG, num_hidden_layers: 1 }))), /unexpected tensor base_model\.model\.model\.layers\.1\./);

  const file = join(dir, ADAPTER_WEIGHTS);
  const reader = SafetensorsReader.open(file);
  const tensors = [...reader.entries.values()].map((e) => ({ name: e.name, shape: e.shape, data: reader.read(e.name) }));
  reader.close();
  tensors[3].data[2] = Infinity;
  writeSafetensorsFile(file, tensors.map((t) => ({ name: t.name, shape: t.shape, values: () => t.data })), 'F32');
  assert.throws(() => readPeftAdapter(dir, llama), new RegExp(`${tensors[3].name.replace(/\./g, '\\.')} has a non-finite value at 2`));

  const bytes = readFileSync(file);
  writeFileSync(file, bytes.subarray(0, bytes.length - 10));
  assert.throws(() => readPeftAdapter(dir, llama), /adapter_model\.safetensors: .*truncated|corrupt/);

  const header = Buffer.from(JSON.stringify({ x: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(header.length));
  writeFileSync(file, Buffer.concat([len, header, Buffer.alloc(8)]));
  assert.throws(() => readPeftAdapter(dir, llama), /dtype "I64" is not supported/);

  rmSync(file);
  assert.throws(() => readPeftAdapter(dir, llama), /adapter_model\.safetensors: missing/);
});
