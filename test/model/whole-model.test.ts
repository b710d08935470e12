// What the model store accepts as a published model: a whole Nimble GPT
// checkpoint, every part's tensors in their shapes, finite, nothing else.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { encodeCheckpoint } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { partCount } from '../../src/model/gpt.ts';
import { encodeSafetensors } from '../../src/model/safetensors.ts';
import { checkWholeModel } from '../../src/model/whole-model.ts';
import { wholeModelBytes, wholeModelTensors } from '../helpers/whole-model.ts';

const config = gptConfig('gpt-micro');
const refused = (bytes: Uint8Array, message: RegExp): void => {
  assert.throws(() => checkWholeModel(bytes), (err: Error & { code?: string; status?: number }) => {
    assert.equal(err.code, 'bad_checkpoint');
    assert.equal(err.status, 400);
    assert.match(err.message, message);
    return true;
  });
};

test('a whole checkpoint passes with its config and step', () => {
  const info = checkWholeModel(wholeModelBytes(3, 42));
  assert.deepEqual(info.config, config);
  assert.equal(info.step, 42);
  assert.equal(info.to, partCount(config));
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
  refused(encodeSafetensors(tensors), /not a Nimble GPT checkpoint/);
  refused(new TextEncoder().encode('definitely not safetensors'), /header/);
  const bytes = wholeModelBytes();
  refused(bytes.subarray(0, bytes.length - 100), /truncated|corrupt/);
});
