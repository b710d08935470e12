// The GPU SGEMM against the WASM one, on SwiftShader (a software Vulkan
// driver shipped in @sparticuz/chromium, so this runs on machines without a
// GPU): every transpose case, odd sizes, bias, accumulate, leading dimensions
// and offsets, within the rounding bound of src/engine/webgpu/crosscheck.ts;
// and proof that the bound catches a wrong transpose, a missing k term and a
// missing bias.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { createArray, readArray, uploadArray } from '../../../src/engine/webgpu/buffers.ts';
import { compareSgemm, runGpuSgemm, runWasmSgemm, sgemmInputs, sgemmLayout, type SgemmCase, type SgemmComparison } from '../../../src/engine/webgpu/crosscheck.ts';
import { openGpu } from '../../../src/engine/webgpu/device.ts';
import { GpuGemm } from '../../../src/engine/webgpu/gemm.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('gemm', (device) => GpuGemm.create(device));
const { skip } = fixture;

function device(): GPUDevice {
  return fixture.gpu().device;
}

/** Runs `c` on both backends; `wasmCase` lets a negative control give the WASM side other flags on the same data. */
async function both(c: SgemmCase, seed: number, wasmCase: SgemmCase = c): Promise<SgemmComparison> {
  const layout = sgemmLayout(c);
  const inputs = sgemmInputs(layout, mulberry32(seed));
  const gpu = await runGpuSgemm(device(), fixture.kernels(), c, layout, inputs);
  const wasm = runWasmSgemm(fixture.engine(), wasmCase, layout, inputs);
  return compareSgemm(c, layout, inputs, gpu, wasm);
}

const SIZES = [[1, 1, 1], [17, 33, 65], [64, 64, 64], [127, 5, 300]] as const;
const MODES = [{}, { bias: true }, { accumulate: true }, { accumulate: true, bias: true }] as const;

test('the device is SwiftShader, with the limits the kernels need', { skip }, (t: TestContext) => {
  const gpu = fixture.gpu();
  t.diagnostic(`adapter: ${gpu.adapterName} (${gpu.adapter.vendor} ${gpu.adapter.architecture}), software ${gpu.isSoftware}`);
  assert.equal(gpu.isSoftware, true);
  assert.match(`${gpu.adapter.architecture} ${gpu.adapter.description}`, /swiftshader/i);
  assert.ok(gpu.limits.maxComputeInvocationsPerWorkgroup >= 256);
  assert.ok(gpu.limits.maxComputeWorkgroupStorageSize >= 8192);
});

test("software 'never' refuses SwiftShader and says why; a GPU, if any, is hardware", { skip }, async (t: TestContext) => {
  const never = await openGpu({ software: 'never' });
  if (never.gpu) {
    t.diagnostic(`hardware adapter: ${never.gpu.adapterName}`);
    assert.equal(never.gpu.isSoftware, false);
    await never.gpu.close();
  } else {
    t.diagnostic(`no hardware adapter: ${never.reason}`);
    assert.match(never.reason, /software adapters were not allowed/);
  }
});

test('every transpose case, odd sizes, bias and accumulate match the WASM kernel within the bound', { skip }, async (t: TestContext) => {
  let seed = 1;
  for (const [M, N, K] of SIZES) {
    let worst = 0, maxDiff = 0, scale = 0;
    for (const transA of [false, true]) for (const transB of [false, true]) for (const mode of MODES) {
      const c: SgemmCase = { M, N, K, transA, transB, ...mode };
      const r = await both(c, seed++);
      assert.ok(r.worstRatio <= 1, `${JSON.stringify(c)}: |gpu − wasm| reaches ${r.worstRatio.toFixed(3)}× the bound (max diff ${r.maxAbsDiff})`);
      // and, coarser than the rigorous bound but far tighter in aggregate: for
      // these random inputs rounding errors grow like √K, not K (measured ≤ 0.25)
      assert.ok(r.maxAbsDiff <= r.scale, `${JSON.stringify(c)}: max diff ${r.maxAbsDiff} above 2⁻²³·(K+1)·max|a|·max|b| = ${r.scale}`);
      assert.equal(r.paddingChanged, 0);
      worst = Math.max(worst, r.worstRatio);
      maxDiff = Math.max(maxDiff, r.maxAbsDiff);
      scale = Math.max(scale, r.scale);
    }
    t.diagnostic(`${M}×${N}×${K}: max |gpu − wasm| ${maxDiff.toExponential(2)} = ${(maxDiff / scale).toFixed(4)} × 2⁻²³·(K+1)·max|a|·max|b|; worst element at ${worst.toExponential(2)} of its bound`);
  }
});

test('leading dimensions and offsets: padding and the floats before the offset are untouched', { skip }, async () => {
  let seed = 100;
  for (const transA of [false, true]) for (const transB of [false, true]) {
    for (const mode of [{ bias: true }, { accumulate: true }]) {
      const c: SgemmCase = { M: 19, N: 70, K: 37, transA, transB, pad: 5, offset: 3, ...mode };
      const r = await both(c, seed++);
      assert.ok(r.worstRatio <= 1, `${JSON.stringify(c)}: ${r.worstRatio}× the bound`);
      assert.equal(r.paddingChanged, 0, `${JSON.stringify(c)}: padding changed`);
    }
  }
});

test('the bound catches a wrong transpose, a missing k term and a missing bias', { skip }, async (t: TestContext) => {
  const square: SgemmCase = { M: 64, N: 64, K: 64, transA: true };
  const wrongTransA = await both(square, 7, { ...square, transA: false });
  const wrongTransB = await both({ ...square, transB: true }, 8, { ...square, transB: false });
  const lastK = await both({ M: 17, N: 33, K: 65 }, 9, { M: 17, N: 33, K: 64 });
  const noBias = await both({ M: 17, N: 33, K: 65, bias: true }, 10, { M: 17, N: 33, K: 65 });
  t.diagnostic(`worst ratio to the bound: wrong transA ${wrongTransA.worstRatio.toFixed(0)}, wrong transB ${wrongTransB.worstRatio.toFixed(0)}, K−1 terms ${lastK.worstRatio.toFixed(0)}, no bias ${noBias.worstRatio.toFixed(0)}`);
  for (const r of [wrongTransA, wrongTransB, lastK, noBias]) assert.ok(r.worstRatio > 10, `the bound let a wrong product pass (${r.worstRatio})`);
});

test('sgemm refuses short arrays, short leading dimensions and C aliasing an input', { skip }, () => {
  const d = device();
  const a = createArray(d, 6), b = createArray(d, 6), c = createArray(d, 4);
  try {
    assert.throws(() => fixture.kernels().sgemm({ M: 2, N: 2, K: 3, a, lda: 3, b, ldb: 2, c, ldc: 2, cOffset: 1 }), /c needs 5 floats, its array holds 4/);
    assert.throws(() => fixture.kernels().sgemm({ M: 2, N: 2, K: 3, a, lda: 2, b, ldb: 2, c, ldc: 2 }), /lda = 2 is less than the 3 columns of a/);
    assert.throws(() => fixture.kernels().sgemm({ M: 2, N: 2, K: 3, a, lda: 3, b, ldb: 4, c, ldc: 2, transB: true }), /b needs 7 floats, its array holds 6/);
    assert.throws(() => fixture.kernels().sgemm({ M: 2, N: 2, K: 2, a: c, lda: 2, b, ldb: 2, c, ldc: 2 }), /c shares its buffer with a/);
    assert.throws(() => fixture.kernels().sgemm({ M: 1.5, N: 2, K: 3, a, lda: 3, b, ldb: 2, c, ldc: 2 }), /M = 1.5 is not a u32/);
  } finally {
    for (const x of [a, b, c]) x.destroy();
  }
});

test('upload and readback keep values and honour offsets; the device reported no error', { skip }, async () => {
  const d = device();
  const values = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 1e3);
  const x = uploadArray(d, values);
  try {
    assert.deepEqual(await readArray(d, x), values);
    assert.deepEqual(await readArray(d, x, 990), values.subarray(990));
    assert.deepEqual(await readArray(d, x, 5, 0), new Float32Array(0));
    await assert.rejects(readArray(d, x, 999, 2), RangeError);
  } finally {
    x.destroy();
  }
  assert.deepEqual(fixture.gpu().takeErrors(), []);
});
