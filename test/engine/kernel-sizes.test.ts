// The kernels' scratch sizes come from the compiled module's exports, and the
// attention scratch they size keeps threads apart at any sequence length.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { readFileSync } from 'node:fs';
import { Engine, kernelSizes } from '../../src/engine/engine.ts';
import { fillRandom } from '../helpers/gradcheck.ts';

let one: Engine;
let two: Engine;
before(async () => {
  one = await Engine.create({ threads: 1 });
  two = await Engine.create({ threads: 2 });
});
after(async () => {
  await one.close();
  await two.close();
});

test('kernelSizes reads the exported global and function, and names what is missing', () => {
  const sizes = kernelSizes({
    SGEMM_WORK_BYTES: new WebAssembly.Global({ value: 'i32', mutable: false }, 1234),
    attentionScratchFloats: (T: number, hs: number) => T * hs + 1,
  });
  assert.equal(sizes.sgemmWorkBytes, 1234);
  assert.equal(sizes.attentionScratchFloats(3, 4), 13);
  assert.throws(() => kernelSizes({ attentionScratchFloats: () => 0 }), /lacks the i32 global SGEMM_WORK_BYTES/);
  assert.throws(() => kernelSizes({ SGEMM_WORK_BYTES: new WebAssembly.Global({ value: 'i32' }, 1) }), /lacks the function attentionScratchFloats/);
});

test('the engine sizes its scratch from the module it runs', () => {
  const module = new WebAssembly.Module(readFileSync(new URL('../../build/kernels-simd.wasm', import.meta.url)));
  const exported = WebAssembly.Module.exports(module).map((e) => `${e.kind} ${e.name}`);
  assert.ok(exported.includes('global SGEMM_WORK_BYTES'));
  assert.ok(exported.includes('function attentionScratchFloats'));
  const { sizes } = two.kernels;
  assert.ok(Number.isInteger(sizes.sgemmWorkBytes) && sizes.sgemmWorkBytes > 0);
  // a head of hs floats over T keys (padded to 4) at least
  for (const [T, hs] of [[1, 4], [5, 8], [64, 32]]) assert.ok(sizes.attentionScratchFloats(T, hs) >= hs * T);
});

test('attention forward and backward are bitwise identical on 1 and 2 threads for odd lengths', () => {
  const B = 2, C = 16, NH = 2;
  for (const T of [1, 5, 13, 30]) {
    const results = [one, two].map((engine) => {
      const qkv = engine.tensor([B * T * 3 * C]);
      const out = engine.tensor([B * T * C]);
      const att = engine.tensor([B * NH * T * T]);
      const dout = engine.tensor([B * T * C]);
      const dqkv = engine.tensor([B * T * 3 * C]);
      fillRandom(qkv.data, T);
      fillRandom(dout.data, T + 100);
      engine.kernels.attentionForward(out.ptr, att.ptr, qkv.ptr, B, T, C, NH);
      engine.kernels.attentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, C, NH);
      const r = { out: out.data.slice(), dqkv: dqkv.data.slice() };
      for (const t of [qkv, out, att, dout, dqkv]) engine.free(t);
      return r;
    });
    assert.ok(results[0].out.every((v) => Number.isFinite(v)), `T=${T}: finite output`);
    assert.deepEqual(new Uint32Array(results[1].out.buffer), new Uint32Array(results[0].out.buffer), `T=${T}: forward`);
    assert.deepEqual(new Uint32Array(results[1].dqkv.buffer), new Uint32Array(results[0].dqkv.buffer), `T=${T}: backward`);
  }
});
