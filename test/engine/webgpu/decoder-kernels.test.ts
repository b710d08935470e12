// The Llama-family decoder kernels on the GPU (src/engine/webgpu/decoder/)
// against their WASM twins (assembly/decoder.ts, assembly/attention-gqa.ts),
// on SwiftShader: RMSNorm forward and backward, RoPE both ways (in place, on
// the q and k heads of a fused qkv row, positions from the KV row table's
// second column), SwiGLU both ways, every output element within its bound
// (src/engine/webgpu/decoder/cases.ts) at odd row counts and widths that are
// not multiples of 4 or of a workgroup; windows into NaN-padded buffers; the
// decode path (cache store, cached attention) over several sessions at
// different positions; and negative controls that the bounds must reject.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { checkCachedPath } from '../../../src/engine/webgpu/decoder/cached-check.ts';
import * as dec from '../../../src/engine/webgpu/decoder/cases.ts';
import { checkCase, compareOutputs, runGpuCase, runWasmCase, type Comparison, type KernelCase } from '../../../src/engine/webgpu/kernel-check.ts';
import type { Random } from '../../../src/engine/webgpu/kernel-cases.ts';
import { GpuKernelSet } from '../../../src/engine/webgpu/kernel-set.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('decoder kernel', (device) => GpuKernelSet.create(device));
const skip = fixture.skip;

function allCases(random: Random): KernelCase[] {
  // a Llama-like fused qkv row: H 6, KV 2, D 12 → stride 120; RoPE turns the first H + KV = 8 heads
  const qkvRope = { rows: 37, heads: 8, D: 12, stride: 120, P: 50 };
  return [
    dec.rmsnormForwardCase({ N: 37, C: 100 }, random),
    dec.rmsnormForwardCase({ N: 5, C: 771, scale: 3 }, random),
    dec.rmsnormForwardCase({ N: 3, C: 13, eps: 1e-6 }, random),
    dec.rmsnormForwardCase({ N: 1, C: 2 }, random),
    dec.rmsnormBackwardInputCase({ N: 37, C: 100 }, random),
    dec.rmsnormBackwardInputCase({ N: 5, C: 771 }, random),
    dec.rmsnormBackwardInputCase({ N: 3, C: 13 }, random),
    dec.rmsnormBackwardParamsCase({ N: 37, C: 100 }, random),
    dec.rmsnormBackwardParamsCase({ N: 19, C: 13 }, random),
    dec.ropeCase('ropeForward', qkvRope, random),
    dec.ropeCase('ropeBackward', qkvRope, random),
    dec.ropeCase('ropeForward', { ...qkvRope, inPlace: true }, random),
    dec.ropeCase('ropeBackward', { ...qkvRope, inPlace: true }, random),
    dec.ropeCase('ropeForward', { rows: 9, heads: 3, D: 6, stride: 31, P: 20, posStride: 2, posOffset: 1, inPlace: true }, random),
    dec.ropeCase('ropeBackward', { rows: 1, heads: 1, D: 2, stride: 2, P: 3 }, random),
    dec.swigluForwardCase({ N: 37, I: 101 }, random),
    dec.swigluForwardCase({ N: 3, I: 3, spread: 20 }, random),
    dec.swigluBackwardCase({ N: 37, I: 101 }, random),
    dec.swigluBackwardCase({ N: 3, I: 3, spread: 20 }, random),
  ];
}

function describe(r: Comparison): string {
  return `max |gpu − wasm| ${r.maxAbsDiff.toExponential(2)}, worst ${r.worstOutput} element at ${r.worstRatio.toExponential(2)} of its bound, ${r.differing} of ${r.elements} differ`;
}

test('every decoder kernel matches its WASM twin within its bound, at odd sizes', { skip }, async (t: TestContext) => {
  const seen = new Map<string, Comparison>();
  for (const c of allCases(mulberry32(11))) {
    const r = await checkCase(fixture.engine(), fixture.kernels(), c);
    assert.ok(r.worstRatio <= 1, `${c.kernel}: ${r.worstOutput} reaches ${r.worstRatio}× its bound (max diff ${r.maxAbsDiff})`);
    const w = seen.get(c.kernel);
    seen.set(c.kernel, !w ? r : {
      ...w, maxAbsDiff: Math.max(w.maxAbsDiff, r.maxAbsDiff), differing: w.differing + r.differing, elements: w.elements + r.elements,
      ...(r.worstRatio >= w.worstRatio ? { worstRatio: r.worstRatio, worstOutput: r.worstOutput } : {}),
    });
  }
  for (const [kernel, r] of seen) t.diagnostic(`${kernel}: ${describe(r)}`);
  assert.equal(seen.size, 9);
});

test('windows: decoder kernels on arrays at an offset into larger buffers give the same bits, touching nothing outside', { skip }, async () => {
  for (const c of allCases(mulberry32(12))) {
    const whole = await runGpuCase(fixture.kernels(), c), windowed = await runGpuCase(fixture.kernels(), c, 5);
    for (const name of Object.keys(c.bounds)) assert.deepEqual(windowed[name], whole[name], `${c.kernel}: ${name} differs in a window`);
  }
});

test('dispatches spill into a second dimension past a per-dimension limit', { skip }, async () => {
  const small = await GpuKernelSet.create(fixture.gpu().device, 8);
  try {
    const random = mulberry32(13);
    for (const c of [dec.rmsnormForwardCase({ N: 37, C: 100 }, random), dec.swigluBackwardCase({ N: 37, I: 101 }, random), dec.ropeCase('ropeForward', { rows: 37, heads: 8, D: 12, stride: 120, P: 50 }, random)]) {
      const r = await checkCase(fixture.engine(), small, c);
      assert.ok(r.worstRatio <= 1, `${c.kernel} with 8 workgroups a side: ${r.worstRatio}`);
    }
  } finally {
    small.destroy();
  }
});

test('the decode path over several sessions at different positions: caches bit for bit, out within the attention bound', { skip }, async (t: TestContext) => {
  const shapes = [
    { H: 4, KV: 2, D: 16, T: 33, prefixes: [0, 5, 12, 30, 1] },
    { H: 6, KV: 2, D: 12, T: 70, prefixes: [66, 3, 64] },
    { H: 2, KV: 1, D: 8, T: 9, prefixes: [7] },
    { H: 4, KV: 4, D: 32, T: 130, prefixes: [128, 17] },
  ];
  let seed = 20;
  for (const s of shapes) {
    const r = await checkCachedPath(fixture.engine(), fixture.kernels(), s, mulberry32(seed++));
    assert.equal(r.cacheDiffering, 0, `${JSON.stringify(s)}: the caches differ`);
    for (const [what, c] of [['gpu − wasm', r.gpuWasm], ['gpu − exact', r.gpuExact], ['wasm − exact', r.wasmExact]] as const) {
      assert.ok(c.worstRatio <= 1, `${JSON.stringify(s)} ${what}: out reaches ${c.worstRatio}× its bound (max diff ${c.maxAbsDiff})`);
    }
    t.diagnostic(`H ${s.H}, KV ${s.KV}, D ${s.D}, T ${s.T}, positions ${s.prefixes.join(', ')} (+1; the first +2): ${r.rows} rows, |gpu − wasm| ${r.gpuWasm.maxAbsDiff.toExponential(2)} (${r.gpuWasm.worstRatio.toFixed(3)} of 2E)`);
  }
  assert.deepEqual(fixture.gpu().takeErrors(), []);
});

function assertCaught(t: TestContext, what: string, r: Comparison): void {
  t.diagnostic(`${what}: worst element at ${r.worstRatio.toExponential(1)}× its bound`);
  assert.ok(r.worstRatio > 10, `${what}: the bound let it pass (${r.worstRatio})`);
}

test('negative controls: RMSNorm eps ×10 and an overwriting backward, RoPE turned backwards, SwiGLU with gate and up swapped', { skip }, async (t: TestContext) => {
  const random = mulberry32(14), e = fixture.engine(), set = fixture.kernels();
  const quiet = dec.rmsnormForwardCase({ N: 37, C: 100, scale: 0.003 }, random);
  assertCaught(t, 'RMSNorm with eps 1e-4, not 1e-5', compareOutputs(quiet, await runGpuCase(set, quiet), runWasmCase(e, { ...quiet, wasm: (k, p) => k.rmsnormForward(p.out, p.rstd, p.inp, p.w, 1e-4, 37, 100) })));
  const back = dec.rmsnormBackwardInputCase({ N: 37, C: 100 }, random);
  assertCaught(t, 'rmsnormBackwardInput that overwrites dinp', compareOutputs(back, await runGpuCase(set, back), runWasmCase(e, { ...back, arrays: { ...back.arrays, dinp: new Float32Array(37 * 100) } })));
  const dw = dec.rmsnormBackwardParamsCase({ N: 37, C: 100 }, random);
  assertCaught(t, 'rmsnormBackwardParams that overwrites dw', compareOutputs(dw, await runGpuCase(set, dw), runWasmCase(e, { ...dw, arrays: { ...dw.arrays, dw: new Float32Array(100) } })));
  const rope = dec.ropeCase('ropeForward', { rows: 37, heads: 8, D: 12, stride: 120, P: 50 }, random);
  const backwards = dec.ropeCase('ropeBackward', { rows: 37, heads: 8, D: 12, stride: 120, P: 50 }, mulberry32(99));
  assertCaught(t, 'RoPE turned the other way', compareOutputs(rope, await runGpuCase(set, rope), runWasmCase(e, { ...rope, wasm: backwards.wasm })));
  const sw = dec.swigluForwardCase({ N: 37, I: 101 }, random);
  const swapped = Float32Array.from(sw.arrays.inp as Float32Array);
  for (let r = 0; r < 37; r++) for (let c = 0; c < 101; c++) [swapped[r * 202 + c], swapped[r * 202 + 101 + c]] = [swapped[r * 202 + 101 + c], swapped[r * 202 + c]];
  assertCaught(t, 'SwiGLU with gate and up swapped', compareOutputs(sw, await runGpuCase(set, sw), runWasmCase(e, { ...sw, arrays: { ...sw.arrays, inp: swapped } })));
});

test('decoder calls refuse an odd head size, heads overrunning a row, KV not dividing H, a row table outside the cache', { skip }, async () => {
  const { createArray } = await import('../../../src/engine/webgpu/buffers.ts');
  const { uploadRowTable } = await import('../../../src/engine/webgpu/decoder/decoder.ts');
  const d = fixture.gpu().device, k = fixture.kernels().decoder;
  const a = createArray(d, 64), b = createArray(d, 64), pos = createArray(d, 4), table = createArray(d, 64);
  try {
    assert.throws(() => k.ropeForward(a, b, 2, 1, 5, 8, pos, 1, table), /headDim 5 must be a positive even integer/);
    assert.throws(() => k.ropeForward(a, b, 2, 3, 4, 8, pos, 1, table), /3 heads of 4 overrun rows of 8 floats/);
    assert.throws(() => k.ropeForward({ array: a, offset: 1 }, a, 2, 1, 4, 8, pos, 1, table), /shares its buffer/);
    assert.throws(() => k.gqaAttentionCached(a, b, table, pos, 1, 0, 0, 3, 2, 4, 4), /KV ≥ 1 dividing H/);
    assert.throws(() => uploadRowTable(d, Int32Array.of(0, 0, 60, 1), 64, 8, 4), /row 1's cache at 60 \(\+8\) is outside the cache's 64 floats/);
    assert.throws(() => uploadRowTable(d, Int32Array.of(0, 4), 64, 8, 4), /row 0 has position 4, outside the cache's 0..3/);
  } finally {
    for (const x of [a, b, pos, table]) x.destroy();
  }
  assert.deepEqual(fixture.gpu().takeErrors(), []);
});
