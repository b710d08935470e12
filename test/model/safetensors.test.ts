// Save and load a model or a stage: the round trip is bitwise; corrupt or
// truncated files get a clear error.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { loadStage, saveStage } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { partCount } from '../../src/model/parts.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError } from '../../src/model/safetensors.ts';

let engine: Engine;
let dir: string;
before(async () => {
  engine = await Engine.create({ threads: 2 });
  dir = mkdtempSync(join(tmpdir(), 'nimble-st-'));
});
after(async () => {
  await engine.close();
  rmSync(dir, { recursive: true, force: true });
});

const config = gptConfig('gpt-micro');

test('a whole model round-trips bitwise, and a stage loads its parts from it', () => {
  const whole = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 3 });
  const path = join(dir, 'whole.safetensors');
  saveStage(whole, path, 17);
  const copy = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 4 });
  assert.notDeepEqual(copy.params.flat.data.slice(), whole.params.flat.data.slice());
  const info = loadStage(copy, path);
  assert.equal(info.step, 17);
  assert.deepEqual(copy.params.flat.data.slice(), whole.params.flat.data.slice());
  const middle = new GptStage(engine, config, { from: 1, to: 3 }, { batchSize: 1, seed: 5 });
  loadStage(middle, path);
  for (const name of middle.params.names()) assert.deepEqual(middle.params.get(name).data.slice(), whole.params.get(name).data.slice());
  // a stage file does not hold the whole model
  const stagePath = join(dir, 'middle.safetensors');
  saveStage(middle, stagePath);
  assert.throws(() => loadStage(copy, stagePath), /holds parts \[1, 3\)/);
  for (const s of [whole, copy, middle]) s.release();
});

test('the file is standard safetensors: header length, JSON header, little-endian data', () => {
  const bytes = encodeSafetensors([{ name: 'x', shape: [2], data: new Float32Array([1.5, -2]) }], { a: 'b' });
  const headerLen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLen)));
  assert.deepEqual(header.x, { dtype: 'F32', shape: [2], data_offsets: [0, 8] });
  assert.deepEqual(header.__metadata__, { a: 'b' });
  assert.equal((8 + headerLen) % 8, 0);
  const data = new DataView(bytes.buffer, 8 + headerLen);
  assert.equal(data.getFloat32(0, true), 1.5);
  assert.equal(data.getFloat32(4, true), -2);
});

test('corrupt and truncated files are refused with clear errors', () => {
  const whole = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1 });
  const path = join(dir, 'c.safetensors');
  saveStage(whole, path);
  const good = new Uint8Array(readFileSync(path));
  const headerLen = Number(new DataView(good.buffer).getBigUint64(0, true));
  const cases: [string, Uint8Array, RegExp][] = [
    ['empty', new Uint8Array(0), /too short/],
    ['truncated data', good.subarray(0, good.length - 10), /truncated|past the end|after the last/],
    ['truncated header', good.subarray(0, 8 + headerLen - 5), /exceeds the file|JSON/],
    ['huge header length', (() => { const b = good.slice(); new DataView(b.buffer).setBigUint64(0, 1n << 60n, true); return b; })(), /exceeds the file/],
    ['garbage header', (() => { const b = good.slice(); b.fill(0x7b, 8, 20); return b; })(), /JSON/],
    ['extra bytes', (() => { const b = new Uint8Array(good.length + 4); b.set(good); return b; })(), /after the last tensor/],
  ];
  for (const [label, bytes, pattern] of cases) {
    assert.throws(() => decodeSafetensors(bytes), (e: unknown) => e instanceof SafetensorsError && pattern.test((e as Error).message), label);
  }
  const wrongDtype = encodeSafetensors([{ name: 'x', shape: [1], data: new Float32Array(1) }]);
  const text = new TextDecoder().decode(wrongDtype).replace('"F32"', '"I32"');
  assert.throws(() => decodeSafetensors(new TextEncoder().encode(text)), /dtype I32 is not supported \(F32, F16 or BF16\)/);
  // F16 and BF16 are read (widened exactly); their byte counts are checked by their width
  const half = new TextDecoder().decode(wrongDtype).replace('"F32"', '"BF16"');
  assert.throws(() => decodeSafetensors(new TextEncoder().encode(half)), /4 bytes do not match shape \[1\] of BF16/);
  const nan = encodeSafetensors([{ name: 'wte', shape: [1], data: new Float32Array([NaN]) }]);
  assert.throws(() => decodeSafetensors(nan).tensors.get('wte')!.data.forEach((v) => { if (!Number.isFinite(v)) throw new SafetensorsError('non-finite'); }), /non-finite/);
  const missing = join(dir, 'nope.safetensors');
  assert.throws(() => loadStage(whole, missing), /cannot read checkpoint/);
  writeFileSync(join(dir, 'notckpt.safetensors'), encodeSafetensors([{ name: 'x', shape: [1], data: new Float32Array(1) }]));
  assert.throws(() => loadStage(whole, join(dir, 'notckpt.safetensors')), /not a Nimble GPT checkpoint/);
  whole.release();
});
