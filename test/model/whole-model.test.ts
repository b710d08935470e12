// What the model store accepts as a published model: a whole Nimble GPT
// checkpoint, or an MLP classifier's, every tensor its model names in its
// shape, finite, nothing else; with the model's kind and reference.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { encodeCheckpoint, encodeMlpCheckpoint } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { partCount } from '../../src/model/parts.ts';
import { encodeSafetensors } from '../../src/model/safetensors.ts';
import { checkWholeModel, wholeModelRef } from '../../src/model/whole-model.ts';
import { mlpModelBytes, mlpModelTensors, SMALL_MLP, wholeModelBytes, wholeModelTensors } from '../helpers/whole-model.ts';

const config = gptConfig('gpt-micro');
const refused = (bytes: Uint8Array, message: RegExp): void => {
  assert.throws(() => checkWholeModel(bytes), (err: Error & { code?: string; status?: number }) => {
    assert.equal(err.code, 'bad_checkpoint');
    assert.equal(err.status, 400);
    assert.match(err.message, message);
    return true;
  });
};

test('a whole checkpoint passes with its kind, reference, config and step', () => {
  const info = checkWholeModel(wholeModelBytes(3, 42));
  assert.equal(info.kind, 'gpt');
  assert.equal(info.model, 'gpt-micro');
  assert.deepEqual(info.config, config);
  assert.equal(info.step, 42);
  assert.equal(info.to, partCount(config));
  // an inline GPT is named inline; the init rule is not part of a reference
  const inline = { vocabSize: 256, contextLength: 32, channels: 32, layers: 2, heads: 4, mlpRatio: 4 };
  assert.equal(checkWholeModel(wholeModelBytes(3, 1, inline)).model, 'gpt:v256.t32.c32.l2.h4.r4');
  const gpt2 = checkWholeModel(wholeModelBytes(3, 1, { ...config, init: 'gpt2' }));
  assert.equal(gpt2.model, 'gpt-micro');
  assert.equal(gpt2.kind === 'gpt' && gpt2.config.init, 'gpt2');
  assert.equal(wholeModelRef({ kind: 'mlp', config: { inputs: 4096, hidden: [], classes: 2 } }), 'mlp:4096-2');
});

test("an MLP classifier's whole checkpoint passes with its kind, reference, config and step", () => {
  const info = checkWholeModel(mlpModelBytes(3, 150));
  assert.deepEqual(info, { kind: 'mlp', model: 'mlp:64-16-2', config: SMALL_MLP, from: 0, to: 1, step: 150 });
  const deep = { inputs: 8, hidden: [4, 4], classes: 3 };
  assert.equal(checkWholeModel(encodeMlpCheckpoint(mlpModelTensors(deep, 1), { config: deep, step: 0 })).model, 'mlp:8-4-4-3');
});

test("an MLP checkpoint missing a tensor, with one misshapen, a NaN or a tensor its model does not name is refused, naming why", () => {
  const tensors = mlpModelTensors(SMALL_MLP, 1);
  const meta = { config: SMALL_MLP, step: 1 };
  refused(encodeMlpCheckpoint(tensors.filter((t) => t.name !== 'fc1.b'), meta), /^the checkpoint lacks fc1\.b$/);
  refused(encodeMlpCheckpoint(tensors.map((t) => (t.name === 'fc0.w' ? { ...t, shape: [16, 64] } : t)), meta), /^fc0\.w: shape \[16, 64\] in the file, \[64, 16\] expected$/);
  const nan = tensors.map((t) => (t.name === 'fc1.w' ? { ...t, data: t.data.map((x, i) => (i === 3 ? NaN : x)) } : t));
  refused(encodeMlpCheckpoint(nan, meta), /^fc1\.w: non-finite value at 3$/);
  const inf = tensors.map((t) => (t.name === 'fc0.b' ? { ...t, data: t.data.map((x, i) => (i === 0 ? -Infinity : x)) } : t));
  refused(encodeMlpCheckpoint(inf, meta), /^fc0\.b: non-finite value at 0$/);
  refused(encodeMlpCheckpoint([...tensors, { name: 'fc2.w', shape: [2, 2], data: new Float32Array(4) }], meta), /^the checkpoint has a tensor its model does not name: fc2\.w$/);
  // the tensors of another MLP than its metadata says
  refused(encodeMlpCheckpoint(mlpModelTensors({ inputs: 64, hidden: [8], classes: 2 }, 1), meta), /fc0\.w: shape \[64, 8\] in the file, \[64, 16\] expected/);
  const bytes = mlpModelBytes();
  refused(bytes.subarray(0, bytes.length - 100), /truncated|corrupt/);
});

test('a stage, a missing or extra or misshapen tensor, a NaN, garbage and a truncated file are refused, each naming why', () => {
  const tensors = wholeModelTensors(config, 1);
  const whole = { config, range: { from: 0, to: partCount(config) }, step: 1 };
  refused(encodeCheckpoint(tensors.slice(0, 2), { ...whole, range: { from: 0, to: 1 } }), /parts \[0, 1\) of 4/);
  refused(encodeCheckpoint(tensors.filter((t) => t.name !== 'lnf.b'), whole), /lacks lnf\.b/);
  refused(encodeCheckpoint([...tensors, { name: 'extra', shape: [1], data: new Float32Array(1) }], whole), /does not name: extra/);
  refused(encodeCheckpoint(tensors.map((t) => (t.name === 'wte' ? { ...t, shape: [t.shape[1], t.shape[0]] } : t)), whole), /wte: shape/);
  const nan = tensors.map((t) => (t.name === 'wpe' ? { ...t, data: t.data.map((x, i) => (i === 5 ? NaN : x)) } : t));
  refused(encodeCheckpoint(nan, whole), /wpe: non-finite value at 5/);
  refused(encodeSafetensors(tensors), /not a Nimble checkpoint \(format 'none'\): a published model is a nimble-gpt\/1 \(GPT\) or nimble-mlp\/1 \(MLP classifier\) file/);
  refused(new TextEncoder().encode('definitely not safetensors'), /header/);
  const bytes = wholeModelBytes();
  refused(bytes.subarray(0, bytes.length - 100), /truncated|corrupt/);
});
