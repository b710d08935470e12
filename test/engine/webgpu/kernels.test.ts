// The ported element-wise, row, optimizer and embedding kernels against their
// WASM twins, on SwiftShader: random inputs at sizes that are not multiples
// of any workgroup size, every output element within its bound (rounding.ts:
// 0, the same bits, where both backends do the same correctly rounded
// operations in the same order), dispatches spilling into a second dimension,
// argument checks; and negative controls per family, proving the bounds
// catch a plausible mistake (a wrong eps, a missing accumulate, no bias
// correction, ...).
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import type { Engine } from '../../../src/engine/engine.ts';
import { NORM_CHUNK } from '../../../src/engine/kernels.ts';
import { createArray } from '../../../src/engine/webgpu/buffers.ts';
import { uploadTokens } from '../../../src/engine/webgpu/embedding.ts';
import { checkCase, compareOutputs, runGpuCase, runWasmCase, type Comparison, type KernelCase, type Outputs } from '../../../src/engine/webgpu/kernel-check.ts';
import * as rows from '../../../src/engine/webgpu/kernel-cases-rows.ts';
import { ADAMW_CASE, adamPredictCase, adamwCase, adamwScaledCase, elementwiseCase, embeddingCase, sumSquaresCase, type AdamWHyper, type ElementwiseKernel, type Random } from '../../../src/engine/webgpu/kernel-cases.ts';
import { GpuKernelSet } from '../../../src/engine/webgpu/kernel-set.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('kernel', (device) => GpuKernelSet.create(device));
const skip = fixture.skip;
const engine = (): Engine => fixture.engine();
const set = (): GpuKernelSet => fixture.kernels();

const ELEMENTWISE: ElementwiseKernel[] = ['addForward', 'accumulate', 'geluForward', 'geluBackward', 'reluForward', 'reluBackward'];

/** Every kernel at awkward sizes: n, N, C, V, B·T not multiples of 4, 64 or 256 (C a multiple of 4 where the WASM kernel needs it). */
function allCases(random: Random): KernelCase[] {
  return [
    ...ELEMENTWISE.flatMap((k) => [elementwiseCase(k, 10007, random), elementwiseCase(k, 3, random)]),
    adamwCase(10007, random),
    adamwCase(1, random),
    adamwScaledCase(10007, random),
    adamPredictCase(10007, random),
    adamPredictCase(3, random),
    sumSquaresCase(40009, random),
    sumSquaresCase(5, random),
    embeddingCase('embeddingForward', { B: 3, T: 7, C: 20, V: 50 }, random),
    embeddingCase('embeddingBackward', { B: 3, T: 7, C: 20, V: 50 }, random),
    embeddingCase('embeddingBackward', { B: 5, T: 13, C: 36, V: 300 }, random),
    rows.layernormForwardCase({ N: 37, C: 100 }, random),
    rows.layernormForwardCase({ N: 5, C: 772, shift: 0.5, scale: 2 }, random),
    rows.layernormForwardCase({ N: 3, C: 12 }, random),
    rows.layernormBackwardInputCase({ N: 37, C: 100 }, random),
    rows.layernormBackwardInputCase({ N: 5, C: 772 }, random),
    rows.layernormBackwardParamsCase({ N: 37, C: 100 }, random),
    rows.biasBackwardCase({ N: 37, C: 101 }, random),
    rows.crossEntropyForwardCase({ N: 37, V: 257 }, random),
    rows.crossEntropyForwardCase({ N: 19, V: 300, spread: 8 }, random),
    rows.crossEntropyBackwardCase({ N: 37, V: 257 }, random),
  ];
}

function describe(r: Comparison): string {
  if (r.exact) return `exact: ${r.differing} of ${r.elements} differ`;
  return `max |gpu − wasm| ${r.maxAbsDiff.toExponential(2)}, worst ${r.worstOutput} element at ${r.worstRatio.toExponential(2)} of its bound`;
}

function assertWithin(c: KernelCase, r: Comparison): void {
  assert.ok(r.worstRatio <= 1, `${c.kernel}: ${r.worstOutput} reaches ${r.worstRatio}× its bound (max diff ${r.maxAbsDiff}, ${r.differing} of ${r.elements} differ)`);
  if (r.exact) assert.equal(r.differing, 0);
}

test('every kernel matches its WASM twin within its bound, at awkward sizes', { skip }, async (t: TestContext) => {
  const seen = new Map<string, Comparison>();
  for (const c of allCases(mulberry32(1))) {
    const r = await checkCase(engine(), set(), c);
    assertWithin(c, r);
    // per kernel, the largest diff and the worst ratio over its cases
    const w = seen.get(c.kernel) ?? r;
    seen.set(c.kernel, { ...w, maxAbsDiff: Math.max(w.maxAbsDiff, r.maxAbsDiff), ...(r.worstRatio >= w.worstRatio ? { worstRatio: r.worstRatio, worstOutput: r.worstOutput } : {}), differing: w.differing + (w === r ? 0 : r.differing), elements: w.elements + (w === r ? 0 : r.elements) });
  }
  for (const [kernel, r] of seen) t.diagnostic(`${kernel}: ${describe(r)}`);
  assert.equal(seen.size, 18);
});

test('dispatches beyond the per-dimension workgroup limit spill into a second dimension and cover every element once', { skip }, async () => {
  // a limit of 8 workgroups a side: 10007 elements take 8 × 5 groups (1 spare), 37 rows 8 × 5 (3 spare), 9 chunks 8 × 2
  const small = await GpuKernelSet.create(fixture.gpu().device, 8);
  try {
    const random = mulberry32(2);
    for (const c of [
      elementwiseCase('accumulate', 10007, random),
      rows.layernormForwardCase({ N: 37, C: 100 }, random),
      rows.crossEntropyBackwardCase({ N: 37, V: 257 }, random),
      embeddingCase('embeddingBackward', { B: 5, T: 13, C: 36, V: 300 }, random),
      sumSquaresCase(8 * NORM_CHUNK + 5, random),
    ]) {
      assertWithin(c, await checkCase(engine(), small, c));
    }
  } finally {
    small.destroy();
  }
});

test('windows: arrays at an offset into larger buffers give the same bits, read nothing outside and write nothing outside', { skip }, async () => {
  for (const c of allCases(mulberry32(7))) {
    const whole = await runGpuCase(set(), c), windowed = await runGpuCase(set(), c, 5);
    for (const name of Object.keys(c.bounds)) assert.deepEqual(windowed[name], whole[name], `${c.kernel}: ${name} differs in a window`);
  }
});

/** The GPU's outputs for `c`, and a comparison of them with another result. */
async function control(c: KernelCase, other: (gpu: Outputs) => Outputs): Promise<Comparison> {
  const gpu = await runGpuCase(set(), c);
  return compareOutputs(c, gpu, other(gpu));
}

/** The WASM kernel run on the same case with some of its arrays or its call changed. */
function wasmWith(c: KernelCase, change: Partial<KernelCase>): Outputs {
  return runWasmCase(engine(), { ...c, ...change, arrays: { ...c.arrays, ...change.arrays } });
}

const zeros = (a: Float32Array | Int32Array): Float32Array => new Float32Array(a.length);

/** Φ(x)·x with erf (Abramowitz–Stegun 7.1.26, |error| ≤ 1.5e-7): the GELU the tanh form approximates. */
function erfGelu(x: number): number {
  const z = Math.abs(x) / Math.SQRT2, k = 1 / (1 + 0.3275911 * z);
  const erf = 1 - k * (0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429)))) * Math.exp(-z * z);
  return 0.5 * x * (1 + Math.sign(x) * erf);
}

/** Layer norm in float64 with a given eps and variance divisor. */
function layernormReference(c: KernelCase, N: number, C: number, eps: number, divisor: number): Float32Array {
  const x = c.arrays.inp, w = c.arrays.w, b = c.arrays.b, out = new Float32Array(N * C);
  for (let r = 0; r < N; r++) {
    const row = Array.from(x.subarray(r * C, (r + 1) * C));
    const m = row.reduce((a, v) => a + v, 0) / C;
    const s = 1 / Math.sqrt(row.reduce((a, v) => a + (v - m) ** 2, 0) / divisor + eps);
    row.forEach((v, j) => (out[r * C + j] = (v - m) * s * w[j] + b[j]));
  }
  return out;
}

function assertCaught(t: TestContext, what: string, r: Comparison): void {
  t.diagnostic(`${what}: ${r.exact ? `${r.differing} of ${r.elements} elements differ where the bound is 0` : `worst element at ${r.worstRatio.toFixed(0)}× its bound`}`);
  assert.ok(r.worstRatio > 10, `${what}: the bound let it pass (${r.worstRatio})`);
}

test('negative controls, element-wise: overwrite for accumulate, erf GELU for the tanh form, ReLU′ at 0', { skip }, async (t: TestContext) => {
  const random = mulberry32(3);
  const acc = elementwiseCase('accumulate', 10007, random);
  assertCaught(t, 'accumulate that overwrites', await control(acc, () => wasmWith(acc, { arrays: { dst: zeros(acc.arrays.dst) } })));
  const gelu = elementwiseCase('geluForward', 10007, random);
  assertCaught(t, 'GELU with erf, not tanh', await control(gelu, () => ({ out: Float32Array.from(gelu.arrays.inp, erfGelu) })));
  const relu = elementwiseCase('reluBackward', 10007, random);
  const { inp, dout } = relu.arrays;
  assertCaught(t, "ReLU′ with inp ≥ 0, not > 0", await control(relu, () => ({ dinp: Float32Array.from(inp, (x, i) => (x >= 0 ? dout[i] : 0)) })));
});

test('negative controls, rows: layer-norm eps 1e-6 and unbiased variance, missing accumulates, a wrong target, an unscaled gradient', { skip }, async (t: TestContext) => {
  const random = mulberry32(4);
  // small activations, where eps matters: the rstd moves by ~10%
  const quiet = rows.layernormForwardCase({ N: 37, C: 100, scale: 0.01 }, random);
  assertCaught(t, 'layer norm with eps 1e-6', await control(quiet, (g) => ({ ...g, out: layernormReference(quiet, 37, 100, 1e-6, 100) })));
  const ln = rows.layernormForwardCase({ N: 37, C: 100 }, random);
  assertCaught(t, 'layer norm with variance / (C − 1)', await control(ln, (g) => ({ ...g, out: layernormReference(ln, 37, 100, 1e-5, 99) })));
  const lnIn = rows.layernormBackwardInputCase({ N: 37, C: 100 }, random);
  assertCaught(t, 'layernormBackwardInput that overwrites dinp', await control(lnIn, () => wasmWith(lnIn, { arrays: { dinp: zeros(lnIn.arrays.dinp) } })));
  const lnP = rows.layernormBackwardParamsCase({ N: 37, C: 100 }, random);
  assertCaught(t, 'layernormBackwardParams that overwrites dw', await control(lnP, (g) => ({ ...wasmWith(lnP, { arrays: { dw: zeros(lnP.arrays.dw) } }), db: g.db })));
  const ce = rows.crossEntropyForwardCase({ N: 37, V: 257 }, random);
  const shifted = Int32Array.from(ce.arrays.targets, (v) => (v + 1) % 257);
  assertCaught(t, 'cross-entropy loss at the next target', await control(ce, (g) => ({ ...g, losses: wasmWith(ce, { arrays: { targets: shifted } }).losses })));
  const ceB = rows.crossEntropyBackwardCase({ N: 37, V: 257 }, random);
  assertCaught(t, 'cross-entropy gradient summed, not averaged over rows', await control(ceB, () => wasmWith(ceB, rows.crossEntropyBackwardCase({ N: 37, V: 257 }, random, 1))));
});

test('negative controls, optimizer: no bias correction, gradScale ignored, the last partial chunk dropped', { skip }, async (t: TestContext) => {
  const random = mulberry32(5);
  const adam = adamwCase(10007, random);
  const variant = (change: Partial<AdamWHyper>): KernelCase['wasm'] => (k, p) =>
    k.adamw({ ...ADAMW_CASE, ...change, params: p.params, grads: p.grads, m: p.m, v: p.v, n: 10007 });
  assert.ok(compareOutputs(adam, await runGpuCase(set(), adam), wasmWith(adam, { wasm: variant({}) })).worstRatio <= 1, 'the variant helper itself is right');
  // at step 10⁹, 1 − βᵗ is 1: no bias correction
  assertCaught(t, 'AdamW without bias correction', await control(adam, () => wasmWith(adam, { wasm: variant({ step: 1e9 }) })));
  assertCaught(t, 'AdamW ignoring gradScale', await control(adam, () => wasmWith(adam, { wasm: variant({ gradScale: 1 }) })));
  const n = 40009, sq = sumSquaresCase(n, random);
  const whole = Math.floor(n / NORM_CHUNK) * NORM_CHUNK;
  assertCaught(t, 'sumSquares dropping the last partial chunk', await control(sq, () => wasmWith(sq, { wasm: (k, p) => k.sumSquares(p.x, whole) })));
});

test('negative controls, embeddings: backward that overwrites, positions taken from the wrong axis', { skip }, async (t: TestContext) => {
  const random = mulberry32(6);
  const z = { B: 3, T: 7, C: 20, V: 50 };
  const back = embeddingCase('embeddingBackward', z, random);
  assertCaught(t, 'embeddingBackward that overwrites dwte and dwpe', await control(back, () => wasmWith(back, { arrays: { dwte: zeros(back.arrays.dwte), dwpe: zeros(back.arrays.dwpe) } })));
  const fwd = embeddingCase('embeddingForward', z, random);
  // positions t = r mod B instead of r mod T (wpe holds T rows, B < T)
  assertCaught(t, 'embeddingForward with the position r mod B', await control(fwd, () => wasmWith(fwd, { wasm: (k, p) => k.embeddingForward(p.out, p.tokens, p.wte, p.wpe, z.T, z.B, z.C) })));
});

test('arguments are checked: aliasing a written array, short arrays, tokens out of range, u32 sizes', { skip }, () => {
  const d = fixture.gpu().device;
  const a = createArray(d, 10), b = createArray(d, 10), c = createArray(d, 4), e = createArray(d, 0);
  try {
    assert.throws(() => set().elementwise.add(a, a, b, 10), /out shares its buffer with a/);
    assert.throws(() => set().elementwise.add({ array: a, offset: 7 }, c, b, 4), /out needs 11 elements, its array holds 10/);
    assert.throws(() => set().elementwise.add(a, b, { array: c, offset: 1 }, 4), /b needs 5 elements, its array holds 4/);
    assert.throws(() => set().rows.layernormForward(a, b, c, b, b, b, 2, 5), /shares its buffer/);
    assert.throws(() => set().elementwise.geluForward(a, b, 2.5), /n = 2.5 is not a u32/);
    assert.throws(() => uploadTokens(d, Int32Array.of(1, 7, 2), 5), /tokens\[1\] = 7 is outside \[0, 5\)/);
    const tokens = uploadTokens(d, Int32Array.of(1, 2, 3), 5);
    assert.throws(() => set().embedding.embeddingForward(a, tokens, b, c, 2, 2, 1), /3 tokens for B·T = 2·2/);
    tokens.destroy();
    assert.throws(() => set().rows.crossEntropyBackward(a, b, c, 1, 3, 2 ** 31), /N \* V|is not a u32/);
    // nothing to do is not an error
    set().optimizer.adamw({ params: a, grads: b, m: c, v: e, n: 0, lr: 1, beta1: 0.9, beta2: 0.9, eps: 1, weightDecay: 0, step: 1, gradScale: 1 });
  } finally {
    for (const x of [a, b, c, e]) x.destroy();
  }
  assert.deepEqual(fixture.gpu().takeErrors(), []);
});
