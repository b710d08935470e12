// One checkpoint format: encodeCheckpoint writes the same bytes as the three
// encoders it replaced (a saved stage, a miner's stage state, the assembled
// whole model), and checkpointInfo refuses metadata it cannot trust.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { CHECKPOINT_FORMAT, checkpointInfo, encodeCheckpoint, encodeStage, stageTensors } from '../../src/model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { partCount } from '../../src/model/parts.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError, type NamedTensor } from '../../src/model/safetensors.ts';

let engine: Engine;
let stage: GptStage;
const config = gptConfig('gpt-micro');

before(async () => {
  engine = await Engine.create({ threads: 1 });
  stage = new GptStage(engine, config, { from: 1, to: 3 }, { batchSize: 2, seed: 42 });
});
after(async () => {
  stage.release();
  await engine.close();
});

test('encodeStage writes the same bytes as before (format, config, from, to, step)', () => {
  const old = encodeSafetensors(stageTensors(stage), {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(stage.config),
    from: String(stage.range.from),
    to: String(stage.range.to),
    step: String(17),
  });
  const now = encodeStage(stage, 17);
  assert.equal(Buffer.compare(Buffer.from(now), Buffer.from(old)), 0);
  assert.deepEqual(checkpointInfo(decodeSafetensors(now)), { config, from: 1, to: 3, step: 17 });
  // the default step is 0
  assert.equal(decodeSafetensors(encodeStage(stage)).metadata.step, '0');
});

test("a miner's stage state and the whole model keep their metadata keys, values and order", () => {
  const momentum: NamedTensor = { name: 'outer.momentum', shape: [stage.paramCount], data: new Float32Array(stage.paramCount).fill(0.25) };
  const tensors = [...stageTensors(stage), momentum];
  const oldState = encodeSafetensors(tensors, {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(stage.config),
    from: '1',
    to: '3',
    step: '4',
    outerStep: '3',
  });
  const state = encodeCheckpoint(tensors, { config, range: { from: 1, to: 3 }, step: 4, extra: { outerStep: '3' } });
  assert.equal(Buffer.compare(Buffer.from(state), Buffer.from(oldState)), 0);

  const oldWhole = encodeSafetensors(stageTensors(stage), {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(config),
    from: '0',
    to: String(partCount(config)),
    step: '120',
    run: 'run-1',
    rounds: '12',
  });
  const whole = encodeCheckpoint(stageTensors(stage), { config, range: { from: 0, to: partCount(config) }, step: 120, extra: { run: 'run-1', rounds: '12' } });
  assert.equal(Buffer.compare(Buffer.from(whole), Buffer.from(oldWhole)), 0);
  assert.deepEqual(Object.keys(decodeSafetensors(whole).metadata), ['format', 'config', 'from', 'to', 'step', 'run', 'rounds']);
});

test('encodeCheckpoint refuses metadata a reader would refuse', () => {
  const t = stageTensors(stage);
  const range = { from: 1, to: 3 };
  assert.throws(() => encodeCheckpoint(t, { config, range, step: 1, extra: { step: '2' } }), /'step' is reserved/);
  assert.throws(() => encodeCheckpoint(t, { config, range, step: -1 }), /step -1 is not a non-negative integer/);
  assert.throws(() => encodeCheckpoint(t, { config, range: { from: 2, to: 9 }, step: 0 }), /do not fit a model of 4 parts/);
  assert.throws(() => encodeCheckpoint(t, { config: { ...config, heads: 3 }, range, step: 0 }), SafetensorsError);
});

test('checkpointInfo validates the stored config, part range and step', () => {
  const good = decodeSafetensors(encodeStage(stage, 5));
  const withMeta = (patch: Record<string, string | undefined>) => {
    const metadata: Record<string, string> = { ...good.metadata };
    for (const [k, v] of Object.entries(patch)) {
      if (v === undefined) delete metadata[k];
      else metadata[k] = v;
    }
    return { tensors: good.tensors, metadata };
  };
  const badConfig = (c: Partial<Record<keyof GptConfig, unknown>>): string => JSON.stringify({ ...config, ...c });
  const cases: [string, Record<string, string | undefined>, RegExp][] = [
    ['config not JSON', { config: '{nope' }, /no valid config: not JSON/],
    ['config missing', { config: undefined }, /no valid config/],
    ['config not an object', { config: '[1, 2]' }, /no valid config: not an object/],
    ['config null', { config: 'null' }, /no valid config: not an object/],
    ['a size missing', { config: badConfig({ layers: undefined }) }, /config is invalid: .*positive integer/],
    ['a size a string', { config: badConfig({ channels: '16' }) }, /config is invalid/],
    ['heads do not divide', { config: badConfig({ heads: 3 }) }, /config is invalid: .*heads/],
    ['unknown init', { config: badConfig({ init: 'xavier' }) }, /unknown init 'xavier'/],
    ['from missing', { from: undefined }, /'from' is missing/],
    ['from negative', { from: '-1' }, /'from' is '-1', not a non-negative integer/],
    ['from not an integer', { from: '1.5' }, /'from' is '1.5'/],
    ['to empty', { to: '' }, /'to' is ''/],
    ['to past the model', { to: '9' }, /parts \[1, 9\) do not fit a model of 4 parts/],
    ['empty range', { from: '3', to: '3' }, /parts \[3, 3\)/],
    ['step not a number', { step: 'x' }, /'step' is 'x'/],
    ['step too large', { step: '99999999999999999' }, /'step'/],
  ];
  for (const [label, patch, pattern] of cases) {
    assert.throws(() => checkpointInfo(withMeta(patch)), (e: unknown) => e instanceof SafetensorsError && pattern.test((e as Error).message), label);
  }
  // an old file without a step reads as step 0
  assert.equal(checkpointInfo(withMeta({ step: undefined })).step, 0);
});
