// Model references (src/model/model-ref.ts): the three forms parse into the
// model they name and back into the same string; whatever else the network
// might send is refused with a message naming the problem; a GPT and an MLP
// answer the same questions (parts, parameters, layout, items per
// microbatch); and an MLP's checkpoints (src/model/checkpoint.ts) round-trip
// by reference while the GPT-only readers refuse them by name (the model
// store's checker takes either kind: test/model/whole-model.test.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CHECKPOINT_FORMAT, encodeCheckpoint, encodeMlpCheckpoint, encodeModelCheckpoint, loadModelParams, MLP_CHECKPOINT_FORMAT, modelCheckpointInfo, checkpointInfo } from '../../src/model/checkpoint.ts';
import { GPT_CONFIGS, gptConfig } from '../../src/model/config.ts';
import { partCount, rangeParamCount } from '../../src/model/parts.ts';
import { initParams } from '../../src/model/init.ts';
import { MAX_MLP_PARAMS, mlpParamSpecs } from '../../src/model/mlp.ts';
import {
  gptConfigOf,
  gptModelRef,
  itemsPerMicrobatch,
  MAX_MODEL_REF_LENGTH,
  mlpModelRef,
  modelLabel,
  ModelRefError,
  modelParts,
  modelRefOf,
  parseModelRef,
  rangeParams,
  stageLayout,
} from '../../src/model/model-ref.ts';
import { decodeSafetensors, SafetensorsError } from '../../src/model/safetensors.ts';
import { checkWholeModel } from '../../src/model/whole-model.ts';
import { jobModel } from '../../src/jobs/spec.ts';
import { mlpParamCount } from '../../src/jobs/mlp-cost.ts';

test('the three forms parse into the model they name, and back into the same string', () => {
  const named = parseModelRef('gpt-tiny');
  assert.deepEqual(named, { kind: 'gpt', ref: 'gpt-tiny', name: 'gpt-tiny', config: GPT_CONFIGS['gpt-tiny'] });

  const inline = parseModelRef('gpt:v256.t32.c64.l3.h4.r2');
  assert.equal(inline.kind, 'gpt');
  assert.deepEqual(inline.kind === 'gpt' && inline.config, { vocabSize: 256, contextLength: 32, channels: 64, layers: 3, heads: 4, mlpRatio: 2 });
  assert.equal(inline.kind === 'gpt' && inline.name, null);
  assert.equal(gptModelRef(gptConfigOf(inline)), 'gpt:v256.t32.c64.l3.h4.r2');
  // a named config has an inline form too, the same model
  assert.deepEqual(gptConfigOf(gptModelRef(gptConfig('gpt-micro'))), gptConfig('gpt-micro'));

  const mlp = parseModelRef('mlp:4096-64-2');
  assert.deepEqual(mlp, { kind: 'mlp', ref: 'mlp:4096-64-2', config: { inputs: 4096, hidden: [64], classes: 2 } });
  assert.deepEqual(parseModelRef('mlp:10-3').kind === 'mlp' && parseModelRef('mlp:10-3').config, { inputs: 10, hidden: [], classes: 3 });
  assert.equal(mlpModelRef({ inputs: 8, hidden: [4, 4], classes: 2 }), 'mlp:8-4-4-2');
  assert.equal(modelLabel(mlp), 'MLP 4096→64→2');
  assert.equal(modelLabel(named), 'gpt-tiny');

  // a job's model: its name, its inline form, its MLP form
  assert.equal(modelRefOf(jobModel('gpt-small')), 'gpt-small');
  assert.equal(modelRefOf(jobModel({ type: 'gpt', vocabSize: 256, contextLength: 16, channels: 32, layers: 2, heads: 4 })), 'gpt:v256.t16.c32.l2.h4.r4');
  assert.equal(modelRefOf(jobModel({ type: 'mlp', inputs: 1024, hidden: [32, 16], classes: 2 })), 'mlp:1024-32-16-2');
});

test('a reference from the network is refused, with the problem named, unless it is exactly one of the forms within the limits', () => {
  const refused = (ref: unknown, pattern: RegExp): void => {
    assert.throws(() => parseModelRef(ref), (e: unknown) => e instanceof ModelRefError && pattern.test(e.message), String(ref));
  };
  refused('', /non-empty string/);
  refused(42, /non-empty string/);
  refused(null, /non-empty string/);
  refused(`mlp:${'1-'.repeat(90)}2`, new RegExp(`at most ${MAX_MODEL_REF_LENGTH}`));
  refused('gpt-huge', /unknown model 'gpt-huge'.*gpt-tiny/);
  refused('constructor', /unknown model/);
  refused('__proto__', /unknown model/);
  refused('GPT:v256.t16.c16.l2.h2.r4', /unknown model/);
  // inline GPTs: the six fields, in order, canonical integers, a valid config
  refused('gpt:v256.t16.c16.l2.h2', /gpt:v<vocab>/);
  refused('gpt:v256.t16.c16.l2.h2.r4.x1', /gpt:v<vocab>/);
  refused('gpt:t16.v256.c16.l2.h2.r4', /field 1 must start with 'v'/);
  refused('gpt:v256.t016.c16.l2.h2.r4', /contextLength '016' is not a positive integer/);
  refused('gpt:v256.t0.c16.l2.h2.r4', /contextLength '0'/);
  refused('gpt:v256.t-1.c16.l2.h2.r4', /contextLength '-1'/);
  refused('gpt:v256.t1e3.c16.l2.h2.r4', /contextLength '1e3'/);
  refused('gpt:v256.t16.c16.l2.h3.r4', /channels must divide into heads/);
  refused('gpt:v256.t16.c12.l2.h2.r4', /head size must be a multiple of 4/);
  refused('gpt:v250.t16.c16.l2.h2.r4', /vocabulary size must be a multiple of 4/);
  refused('gpt:v256.t16.c16.l2.h2.r17', /mlpRatio 17 exceeds 16/);
  refused('gpt:v256.t16.c16.l9999999.h2.r4', /layers 9999999 exceeds 1024/);
  refused('gpt:v256.t16.c16.l2.h2.r4 ', /mlpRatio '4 '/);
  // MLPs: inputs, hidden widths, classes
  refused('mlp:4096', /mlp:<inputs>-<hidden>/);
  refused('mlp:', /mlp:<inputs>/);
  refused('mlp:4096--2', /hidden width 1 '' is not a positive integer/);
  refused('mlp:4096-64-1', /classes must be from 2/);
  refused('mlp:4096-0-2', /hidden width 1 '0'/);
  refused('mlp:04096-64-2', /inputs '04096'/);
  refused('mlp:2000000-2', /inputs 2000000 exceeds/);
  refused('mlp:4-70000-2', /hidden width 70000 exceeds/);
  refused(`mlp:4-${'2-'.repeat(17)}2`, /17 hidden layers, at most 16/);
  refused('mlp:1000000-65536-2', new RegExp(`more than ${MAX_MLP_PARAMS}`));
  // a config a reference cannot carry
  assert.throws(() => gptModelRef({ ...gptConfig('gpt-micro'), init: 'gpt2' }), ModelRefError);
});

test('a GPT and an MLP answer the same questions: parts, parameters, layout, items per microbatch', () => {
  const tiny = parseModelRef('gpt-tiny');
  const config = gptConfig('gpt-tiny');
  assert.equal(modelParts(tiny), partCount(config));
  assert.equal(rangeParams('gpt-tiny', { from: 1, to: 3 }), rangeParamCount(config, { from: 1, to: 3 }));
  assert.equal(stageLayout(tiny, { from: 0, to: 2 }).size, rangeParamCount(config, { from: 0, to: 2 }));
  assert.equal(itemsPerMicrobatch(tiny, 12), 12 * 64);

  const mlp = parseModelRef('mlp:4096-64-2');
  assert.equal(modelParts(mlp), 1, 'an MLP is one part');
  const params = mlpParamCount({ inputs: 4096, hidden: [64], classes: 2 });
  assert.equal(rangeParams(mlp, { from: 0, to: 1 }), params);
  const layout = stageLayout(mlp, { from: 0, to: 1 });
  assert.equal(layout.size, params);
  assert.deepEqual(layout.entries.map((e) => e.name), ['fc0.w', 'fc1.w', 'fc0.b', 'fc1.b'], 'weights (decayed) first, as the Mlp lays them out');
  assert.equal(layout.decaySize, 4096 * 64 + 64 * 2);
  assert.equal(itemsPerMicrobatch(mlp, 64), 64, 'an MLP counts examples');
  assert.throws(() => rangeParams(mlp, { from: 0, to: 2 }), /not parts of 'mlp:4096-64-2' \(1 part\)/);
  assert.throws(() => gptConfigOf(mlp), /is an MLP classifier, not a GPT/);
});

test('an MLP checkpoint round-trips by reference; the GPT-only readers refuse it by name, the publisher takes it', () => {
  const model = parseModelRef('mlp:16-8-2');
  assert.equal(model.kind, 'mlp');
  if (model.kind !== 'mlp') return;
  const layout = stageLayout(model, { from: 0, to: 1 });
  const weights = new Float32Array(layout.size);
  initParams(layout, weights, 5);
  const tensors = layout.entries.map((e) => ({ name: e.name, shape: e.shape, data: weights.subarray(e.offset, e.offset + e.size) }));
  const bytes = encodeModelCheckpoint(model, tensors, { range: { from: 0, to: 1 }, step: 40, extra: { model: model.ref } });
  const file = decodeSafetensors(bytes);
  assert.equal(file.metadata.format, MLP_CHECKPOINT_FORMAT);
  assert.equal(file.metadata.model, 'mlp:16-8-2');
  assert.deepEqual(modelCheckpointInfo(file), { kind: 'mlp', config: { inputs: 16, hidden: [8], classes: 2 }, from: 0, to: 1, step: 40 });
  const back = new Float32Array(layout.size);
  loadModelParams(model, { from: 0, to: 1 }, layout, back, file);
  assert.deepEqual(back, weights);

  // another model's checkpoint, or a bad one, is refused before anything is copied
  const other = parseModelRef('mlp:16-4-2');
  assert.throws(() => loadModelParams(other, { from: 0, to: 1 }, stageLayout(other, { from: 0, to: 1 }), new Float32Array(stageLayout(other, { from: 0, to: 1 }).size), file), /not of 'mlp:16-4-2'/);
  const gpt = parseModelRef('gpt-micro');
  assert.throws(() => loadModelParams(gpt, { from: 0, to: 1 }, stageLayout(gpt, { from: 0, to: 1 }), new Float32Array(stageLayout(gpt, { from: 0, to: 1 }).size), file), /is of an MLP classifier/);
  const micro = gptConfig('gpt-micro');
  const gptFile = decodeSafetensors(encodeCheckpoint([], { config: micro, range: { from: 0, to: 1 }, step: 1 }));
  assert.throws(() => loadModelParams(model, { from: 0, to: 1 }, layout, back, gptFile), /is of a GPT/);
  const nan = tensors.map((t) => (t.name === 'fc1.b' ? { ...t, data: Float32Array.from([0, NaN]) } : t));
  assert.throws(() => loadModelParams(model, { from: 0, to: 1 }, layout, back, decodeSafetensors(encodeMlpCheckpoint(nan, { config: model.config, step: 1 }))), /fc1\.b: non-finite value at 1/);
  const withMeta = (patch: Record<string, string>) => ({ tensors: file.tensors, metadata: { ...file.metadata, ...patch } });
  assert.throws(() => modelCheckpointInfo(withMeta({ to: '2' })), /do not fit an MLP/);
  assert.throws(() => modelCheckpointInfo(withMeta({ config: '{"inputs":16,"hidden":[8],"classes":2,"x":1}' })), /exactly inputs, hidden and classes/);
  assert.throws(() => modelCheckpointInfo(withMeta({ config: '{"inputs":16,"hidden":"8","classes":2}' })), /config is invalid/);
  assert.throws(() => modelCheckpointInfo(withMeta({ config: '{"inputs":16,"hidden":[8],"classes":1}' })), /classes must be from 2/);
  assert.throws(() => encodeModelCheckpoint(model, tensors, { range: { from: 0, to: 2 }, step: 0 }), /one part/);

  // the GPT-only readers say what it is
  assert.throws(() => checkpointInfo(file), (e: unknown) => e instanceof SafetensorsError && /an MLP classifier checkpoint/.test(e.message));
  assert.equal(checkWholeModel(bytes).model, 'mlp:16-8-2');
  assert.equal(decodeSafetensors(encodeCheckpoint([], { config: micro, range: { from: 0, to: 1 }, step: 1 })).metadata.format, CHECKPOINT_FORMAT);
  assert.deepEqual(mlpParamSpecs(model.config).map((s) => s.name).sort(), ['fc0.b', 'fc0.w', 'fc1.b', 'fc1.w']);
});

test('a decoder with an arch (Llama, Qwen2, GPT-2, rope scaling) round-trips through its inline reference, one spelling each', async () => {
  const { decoderConfigFromHf, gptConfigOfDecoder } = await import('../../src/model/hf/decoder-config.ts');
  const { TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG, TINY_GPT2_CONFIG } = await import('../helpers/hf-folder.ts');
  const tinyllama = {
    model_type: 'llama', vocab_size: 32000, hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 22, num_attention_heads: 32,
    num_key_value_heads: 4, max_position_embeddings: 2048, rms_norm_eps: 1e-5, rope_theta: 10000, tie_word_embeddings: false,
  };
  const llama3 = { ...TINY_LLAMA_CONFIG, rope_theta: 500000, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } };
  const gpt2 = { ...TINY_GPT2_CONFIG, vocab_size: 50257, n_embd: 768, n_layer: 12, n_head: 12, n_positions: 1024 };
  const linear = { ...TINY_QWEN2_CONFIG, rope_scaling: { type: 'linear', factor: 2.5 }, rms_norm_eps: 1e-7 };
  for (const hf of [tinyllama, TINY_LLAMA_CONFIG, llama3, TINY_QWEN2_CONFIG, linear, TINY_GPT2_CONFIG, gpt2]) {
    const config = gptConfigOfDecoder(decoderConfigFromHf(hf));
    const ref = gptModelRef(config);
    const back = parseModelRef(ref);
    assert.equal(back.ref, ref);
    assert.deepEqual(back.config, config, ref);
    assert.ok(ref.length <= MAX_MODEL_REF_LENGTH, ref);
  }
  const ok = gptModelRef(gptConfigOfDecoder(decoderConfigFromHf(tinyllama)));
  assert.equal(ok, 'llama:v32000.t2048.c2048.l22.h32.k4.d64.i5632.e0.00001.r10000.b000.w0');
  for (const [bad, why] of [
    [ok.replace('e0.00001', 'e1e-5'), /not a positive number as String\(n\) writes it/],
    [ok.replace('.k4', '.k5'), /not a multiple of 5 key\/value heads/],
    [ok.replace('.b000', '.b0'), /three bias flags/],
    [ok + '.x1', /follows the last field/],
    [ok.replace('.r10000', ''), /field 'r' is missing/],
    [ok.replace('d64', 'd6'), /multiple of 4/],
    ['mamba:v1', /unknown model/],
  ] as const) assert.throws(() => parseModelRef(bad), (err: Error) => err instanceof ModelRefError && why.test(err.message), bad);
});
