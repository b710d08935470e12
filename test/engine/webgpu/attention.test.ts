// GPU causal self-attention (src/engine/webgpu/attention.ts) against the WASM
// kernels and the exact values, on SwiftShader: the forward output, the
// attention matrix rebuilt from the saved row statistics and the backward's
// dqkv, each element within the bound of src/engine/webgpu/attention-bound.ts
// (|gpu − wasm| ≤ 2E, |gpu − exact| ≤ E, |wasm − exact| ≤ E); gpt-tiny and
// gpt-small sizes, odd T, one row, peaky scores, a head size that is not a
// multiple of 4; finite differences of the GPU forward against the GPU
// backward; and shaders broken on purpose (no causal mask, wrong scale, wrong
// head offset), which the bound must reject.
import assert from 'node:assert/strict';
import { after, before, test, type TestContext } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { attentionStatsLength, GpuAttention, type AttentionShape } from '../../../src/engine/webgpu/attention.ts';
import { attentionReference } from '../../../src/engine/webgpu/attention-bound.ts';
import { attentionInputs, compareAttention, crosscheckAttention, runGpuAttention, runWasmAttention, type AttentionComparison } from '../../../src/engine/webgpu/attention-check.ts';
import { attentionWgsl, type AttentionShaders } from '../../../src/engine/webgpu/attention.wgsl.ts';
import { createArray, readArray, uploadArray } from '../../../src/engine/webgpu/buffers.ts';
import { openGpu } from '../../../src/engine/webgpu/device.ts';
import { mulberry32 } from '../../../src/model/init.ts';

const opened = await openGpu({ software: 'only' });
const skip = opened.gpu ? false : `no WebGPU device: ${opened.reason}`;
if (skip) process.stderr.write(`webgpu attention tests skipped: ${skip}\n`);

let engine: Engine;
let attention32: GpuAttention;
before(async () => {
  engine = await Engine.create({ threads: 2 });
  if (opened.gpu) attention32 = await GpuAttention.create(opened.gpu.device, 32);
});
after(async () => {
  await engine.close();
  attention32?.destroy();
  await opened.gpu?.close();
});

function device(): GPUDevice {
  return opened.gpu!.device;
}

function describe(c: AttentionComparison): string {
  return (['out', 'att', 'dqkv'] as const).map((k) => `${k} ${c[k].maxAbsDiff.toExponential(2)} (${c[k].worstRatio.toFixed(3)} of bound)`).join(', ');
}

function assertWithin(c: AttentionComparison, what: string): void {
  for (const k of ['out', 'att', 'dqkv'] as const) {
    assert.ok(c[k].worstRatio <= 1, `${what}: ${k} reaches ${c[k].worstRatio}× its bound at element ${c[k].worstAt} (max diff ${c[k].maxAbsDiff})`);
  }
}

test('forward, att and dqkv match the WASM kernels and the exact values within the bound', { skip }, async (t: TestContext) => {
  const cases: [string, AttentionShape, number][] = [
    ['gpt-tiny', { B: 2, T: 64, C: 128, NH: 4 }, 1],
    ['gpt-small', { B: 1, T: 128, C: 256, NH: 8 }, 1],
    ['odd T = 17', { B: 3, T: 17, C: 64, NH: 2 }, 1],
    ['T = 77: two query blocks, two key tiles', { B: 1, T: 77, C: 64, NH: 2 }, 1],
    ['one row', { B: 2, T: 1, C: 64, NH: 2 }, 1],
    ['peaky scores (inputs ×4: scores 16× larger, rows near one-hot)', { B: 1, T: 100, C: 64, NH: 2 }, 4],
  ];
  let seed = 1;
  for (const [name, s, amplitude] of cases) {
    const r = await crosscheckAttention(engine, device(), attention32, s, mulberry32(seed++), amplitude);
    assertWithin(r.gpuWasm, `${name} gpu − wasm`);
    assertWithin(r.gpuExact, `${name} gpu − exact`);
    assertWithin(r.wasmExact, `${name} wasm − exact`);
    t.diagnostic(`${name} ${JSON.stringify(s)}: |gpu − wasm| ${describe(r.gpuWasm)}`);
  }
});

test('an odd head size (the WASM kernel needs a multiple of 4) matches the exact values, with tiles shorter than a block', { skip }, async (t: TestContext) => {
  // hs 37 stages tiles of 55 rows (attentionTileRows), which straddle the
  // 64-row blocks of queries and keys; T = 130 makes three blocks, the last of 2 rows
  const s: AttentionShape = { B: 2, T: 130, C: 74, NH: 2 };
  const attention37 = await GpuAttention.create(device(), 37);
  try {
    const inputs = attentionInputs(s, mulberry32(50));
    const ref = attentionReference(s, inputs);
    const r = compareAttention(ref, await runGpuAttention(device(), attention37, s, inputs), ref, 1);
    assertWithin(r, 'hs = 37 gpu − exact');
    t.diagnostic(`hs 37 ${JSON.stringify(s)}: |gpu − exact| ${describe(r)}`);
  } finally {
    attention37.destroy();
  }
});

test('central differences of the GPU forward agree with the GPU backward (T = 5, C = 8, 2 heads)', { skip }, async (t: TestContext) => {
  const s: AttentionShape = { B: 1, T: 5, C: 8, NH: 2 };
  const d = device();
  const attention4 = await GpuAttention.create(d, 4);
  try {
    const inputs = attentionInputs(s, mulberry32(60));
    const gpu = await runGpuAttention(d, attention4, s, inputs);
    // the same tiny case against WASM while we are here
    const ref = attentionReference(s, inputs);
    assertWithin(compareAttention(ref, gpu, runWasmAttention(engine, s, inputs), 2), 'tiny gpu − wasm');
    // loss = Σ out·dout, so dloss/dqkv = dqkv. Every qkv element nudged up
    // and down: 2·n copies of the case, one batch each, in one forward
    const n = inputs.qkv.length, h = 2 ** -7;
    const batch: AttentionShape = { ...s, B: 2 * n };
    const qkv = new Float32Array(2 * n * n), steps = new Float64Array(n);
    for (let e = 0; e < n; e++) {
      for (const [copy, sign] of [[2 * e, 1], [2 * e + 1, -1]]) {
        qkv.set(inputs.qkv, copy * n);
        qkv[copy * n + e] = inputs.qkv[e] + sign * h;
      }
      steps[e] = qkv[2 * e * n + e] - qkv[(2 * e + 1) * n + e]; // the float32 step actually taken
    }
    const qkvGpu = uploadArray(d, qkv), out = createArray(d, 2 * n * s.T * s.C), stats = createArray(d, attentionStatsLength(batch));
    let outs: Float32Array;
    try {
      attention4.forward({ ...batch, qkv: qkvGpu, out, stats });
      outs = await readArray(d, out);
    } finally {
      for (const x of [qkvGpu, out, stats]) x.destroy();
    }
    const m = s.T * s.C;
    const loss = (copy: number): number => {
      let l = 0;
      for (let x = 0; x < m; x++) l += outs[copy * m + x] * inputs.dout[x];
      return l;
    };
    let worst = 0, maxGrad = 0;
    for (let e = 0; e < n; e++) {
      const fd = (loss(2 * e) - loss(2 * e + 1)) / steps[e];
      worst = Math.max(worst, Math.abs(fd - gpu.dqkv[e]));
      maxGrad = Math.max(maxGrad, Math.abs(gpu.dqkv[e]));
    }
    // the error is truncation (h²/6·|loss'''|) plus the float32 rounding of
    // the two losses over the step (~1e-7·Σ|out·dout| / h, ~1e-5); measured
    // 1.4e-5. 1e-3 is 0.06% of the largest gradient; a wrong backward (the
    // negative controls below) is off by O(1)
    t.diagnostic(`${n} central differences, step 2⁻⁷: max |fd − backward| ${worst.toExponential(2)}, max |gradient| ${maxGrad.toFixed(3)}`);
    assert.ok(worst <= 1e-3, `finite differences are ${worst} from the backward`);
    assert.ok(maxGrad > 0.1, 'the gradients are too small for this check to mean anything');
  } finally {
    attention4.destroy();
  }
});

type Edit = readonly [kernel: keyof AttentionShaders, from: string, to: string];

/** The hs = 32 shaders with each edit made; fails if an edit finds nothing to replace. */
function broken(edits: readonly Edit[]): AttentionShaders {
  const code = attentionWgsl(32);
  for (const [kernel, from, to] of edits) {
    assert.ok(code[kernel].includes(from), `the ${kernel} shader no longer contains "${from}"`);
    code[kernel] = code[kernel].split(from).join(to);
  }
  return code;
}

test('the bound catches a missing causal mask, a wrong scale and a wrong head offset in the shaders', { skip }, async (t: TestContext) => {
  // [name, broken shaders, whether the forward is broken too]
  const faults: [string, AttentionShaders, boolean][] = [
    ['forward without the causal mask', broken([
      ['forward', 'let kEnd = min(p.T, i0 + ROWS);', 'let kEnd = p.T;'],
      ['forward', 'if (live && j0 <= i) {', 'if (live) {'],
      ['forward', 'let n = min(KB, i + 1u - j0);', 'let n = min(KB, p.T - j0);'],
    ]), true],
    ['forward scaled by 1/√C instead of 1/√hs', broken([['forward', 'let sc = dot * p.scale;', 'let sc = dot * p.scale * 0.5;']]), true],
    ['forward reading q one head over', broken([['forward', '{ q[d] = qkv[o + d]; }', '{ q[d] = qkv[o + ((h + 1u) % p.H) * HS - h * HS + d]; }']]), true],
    ['backward without the scale in dS', broken([
      ['backwardQ', 'let dS = P * (dP - D) * p.scale;', 'let dS = P * (dP - D);'],
      ['backwardKV', 'let dS = P * (dP - Ds[ii]) * p.scale;', 'let dS = P * (dP - Ds[ii]);'],
    ]), false],
    ['backward dk, dv without the causal mask', broken([
      ['backwardKV', 'for (var i0 = j0; i0 < p.T; i0 += KB)', 'for (var i0 = 0u; i0 < p.T; i0 += KB)'],
      ['backwardKV', 'if (live && i0 + KB > j) {', 'if (live) {'],
      ['backwardKV', 'let first = max(j, i0) - i0;', 'let first = 0u;'],
    ]), false],
  ];
  const s: AttentionShape = { B: 1, T: 64, C: 128, NH: 4 };
  const inputs = attentionInputs(s, mulberry32(70));
  const ref = attentionReference(s, inputs);
  const wasm = runWasmAttention(engine, s, inputs);
  assertWithin(compareAttention(ref, await runGpuAttention(device(), attention32, s, inputs), wasm, 2), 'unbroken shaders');
  for (const [name, code, forwardBroken] of faults) {
    // only the edited kernels compile anew: GpuAttention reuses pipelines by source
    const faulty = await GpuAttention.create(device(), 32, code);
    try {
      const r = compareAttention(ref, await runGpuAttention(device(), faulty, s, inputs), wasm, 2);
      t.diagnostic(`${name}: out at ${r.out.worstRatio.toExponential(1)}× its bound, dqkv at ${r.dqkv.worstRatio.toExponential(1)}× (max diffs ${r.out.maxAbsDiff.toExponential(1)}, ${r.dqkv.maxAbsDiff.toExponential(1)})`);
      if (forwardBroken) assert.ok(r.out.worstRatio > 100, `${name}: the forward passed (${r.out.worstRatio})`);
      else assert.ok(r.out.worstRatio <= 1, `${name}: the forward, not broken, failed`);
      assert.ok(r.dqkv.worstRatio > 100, `${name}: the backward passed (${r.dqkv.worstRatio})`);
    } finally {
      faulty.destroy();
    }
  }
});

test('the kernels refuse a wrong head size, short arrays and a written array aliasing another', { skip }, () => {
  const d = device();
  const s: AttentionShape = { B: 1, T: 4, C: 64, NH: 2 };
  const qkv = createArray(d, 4 * 192), out = createArray(d, 4 * 64), stats = createArray(d, 16), att = createArray(d, 16), dqkv = createArray(d, 4 * 192);
  try {
    assert.throws(() => attention32.forward({ ...s, NH: 4, qkv, out, stats }), /head size C\/NH = 16, these pipelines are for 32/);
    assert.throws(() => attention32.forward({ ...s, T: 5, qkv, out, stats }), /qkv needs 960 floats, its array holds 768/);
    assert.throws(() => attention32.forward({ ...s, qkv, out: qkv, stats }), /out shares its buffer with qkv/);
    assert.throws(() => attention32.probs({ ...s, qkv, stats, att }), /att needs 32 floats, its array holds 16/);
    assert.throws(() => attention32.backward({ ...s, dqkv, dout: out, qkv: dqkv, out, stats }), /dqkv shares its buffer with qkv/);
    assert.throws(() => attention32.backward({ ...s, dqkv, dout: stats, qkv, out, stats }), /dout needs 256 floats, its array holds 16/);
    assert.throws(() => attention32.forward({ ...s, C: 63, qkv, out, stats }), /NH ≥ 1 dividing C/);
  } finally {
    for (const x of [qkv, out, stats, att, dqkv]) x.destroy();
  }
  assert.deepEqual(opened.gpu!.takeErrors(), []);
});
