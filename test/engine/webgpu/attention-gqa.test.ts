// Grouped-query causal attention on the GPU (src/engine/webgpu/attention.ts
// with a GqaShape) against the WASM gqaAttentionForward / gqaAttentionBackward
// and the exact values, on SwiftShader: out, att (rebuilt from the saved
// stats) and dqkv, each element within the bound of attention-bound.ts
// (|gpu − wasm| ≤ 2E, |gpu − exact| ≤ E, |wasm − exact| ≤ E). Heads ≠ kvHeads
// (2, 3 and 4 query heads a kv head, one kv head for all), a head size that is
// not channels/heads of any model here, odd T, one row, two query blocks,
// peaky scores; the multi-head shape and the same data as a GqaShape with
// H = KV give the same bits; and shaders broken on purpose in the head
// mapping, which the bound must reject.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { GpuAttention, type AttentionShape, type GqaShape } from '../../../src/engine/webgpu/attention.ts';
import { attentionReference } from '../../../src/engine/webgpu/attention-bound.ts';
import { attentionInputs, compareAttention, crosscheckAttention, runGpuAttention, runWasmAttention, type AttentionComparison } from '../../../src/engine/webgpu/attention-check.ts';
import { attentionWgsl, type AttentionShaders } from '../../../src/engine/webgpu/attention.wgsl.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { gpuFixture } from './gpu-fixture.ts';

/** Compiled attention kernels per head size, made on first use. */
class Heads {
  private readonly made = new Map<number, Promise<GpuAttention>>();
  constructor(private readonly device: () => GPUDevice) {}
  get(hs: number): Promise<GpuAttention> {
    let a = this.made.get(hs);
    if (!a) this.made.set(hs, (a = GpuAttention.create(this.device(), hs)));
    return a;
  }
  destroy(): void {
    for (const a of this.made.values()) void a.then((x) => x.destroy());
  }
}

const fixture = await gpuFixture('gqa attention', (device) => Promise.resolve(new Heads(() => device)));
const skip = fixture.skip;

function describe(c: AttentionComparison): string {
  return (['out', 'att', 'dqkv'] as const).map((k) => `${k} ${c[k].maxAbsDiff.toExponential(2)} (${c[k].worstRatio.toFixed(3)} of bound)`).join(', ');
}

function assertWithin(c: AttentionComparison, what: string): void {
  for (const k of ['out', 'att', 'dqkv'] as const) {
    assert.ok(c[k].worstRatio <= 1, `${what}: ${k} reaches ${c[k].worstRatio}× its bound at element ${c[k].worstAt} (max diff ${c[k].maxAbsDiff})`);
  }
}

test('grouped-query forward, att and dqkv match the WASM kernels and the exact values within the bound', { skip }, async (t: TestContext) => {
  const cases: [string, GqaShape, number][] = [
    ['H 4, KV 2, D 16, odd T 17', { B: 2, T: 17, H: 4, KV: 2, D: 16 }, 1],
    ['H 6, KV 2, D 12, T 77: two query blocks', { B: 1, T: 77, H: 6, KV: 2, D: 12 }, 1],
    ['H 3, KV 1 (multi-query), D 8, T 5, B 3', { B: 3, T: 5, H: 3, KV: 1, D: 8 }, 1],
    ['H 8, KV 2, D 32, T 64 (a Llama-like tiny shape)', { B: 2, T: 64, H: 8, KV: 2, D: 32 }, 1],
    ['one row, H 4, KV 4', { B: 2, T: 1, H: 4, KV: 4, D: 16 }, 1],
    ['peaky scores (inputs ×3), H 4, KV 1, D 16, T 40', { B: 1, T: 40, H: 4, KV: 1, D: 16 }, 3],
  ];
  let seed = 101;
  for (const [name, s, amplitude] of cases) {
    const r = await crosscheckAttention(fixture.engine(), fixture.gpu().device, await fixture.kernels().get(s.D), s, mulberry32(seed++), amplitude);
    assertWithin(r.gpuWasm, `${name} gpu − wasm`);
    assertWithin(r.gpuExact, `${name} gpu − exact`);
    assertWithin(r.wasmExact, `${name} wasm − exact`);
    t.diagnostic(`${name}: |gpu − wasm| ${describe(r.gpuWasm)}`);
  }
});

test('a multi-head shape and the same data as a GqaShape with H = KV give the same bits on the GPU and on WASM', { skip }, async () => {
  const mha: AttentionShape = { B: 2, T: 19, C: 64, NH: 4 };
  const gqa: GqaShape = { B: 2, T: 19, H: 4, KV: 4, D: 16 };
  const inputs = attentionInputs(mha, mulberry32(120));
  const a = await fixture.kernels().get(16), d = fixture.gpu().device;
  const [x, y] = [await runGpuAttention(d, a, mha, inputs), await runGpuAttention(d, a, gqa, inputs)];
  for (const k of ['out', 'att', 'dqkv', 'stats'] as const) assert.deepEqual(y[k], x[k], `gpu ${k}`);
  const [wx, wy] = [runWasmAttention(fixture.engine(), mha, inputs), runWasmAttention(fixture.engine(), gqa, inputs)];
  for (const k of ['out', 'att', 'dqkv'] as const) assert.deepEqual(wy[k], wx[k], `wasm ${k}`);
});

type Edit = readonly [kernel: keyof AttentionShaders, from: string, to: string];

function broken(hs: number, edits: readonly Edit[]): AttentionShaders {
  const code = attentionWgsl(hs);
  for (const [kernel, from, to] of edits) {
    assert.ok(code[kernel].includes(from), `the ${kernel} shader no longer contains "${from}"`);
    code[kernel] = code[kernel].split(from).join(to);
  }
  return code;
}

test('the bound catches a wrong query-to-kv-head mapping and dk, dv summed over one query head only', { skip }, async (t: TestContext) => {
  const faults: [string, AttentionShaders, boolean][] = [
    ['forward with kv head h mod KV (interleaved), not h / (H/KV)', broken(16, [
      ['forward', 'let kvh = h / (p.H / p.KV);', 'let kvh = h % p.KV;'],
      ['backwardQ', 'let kvh = h / (p.H / p.KV);', 'let kvh = h % p.KV;'],
    ]), true],
    ['backward dk, dv from the first query head of each kv head only', broken(16, [
      ['backwardKV', 'h < (g + 1u) * rep;', 'h < g * rep + 1u;'],
    ]), false],
  ];
  const s: GqaShape = { B: 1, T: 33, H: 4, KV: 2, D: 16 };
  const inputs = attentionInputs(s, mulberry32(130));
  const ref = attentionReference(s, inputs);
  const wasm = runWasmAttention(fixture.engine(), s, inputs);
  const d = fixture.gpu().device;
  for (const [name, code, forwardBroken] of faults) {
    const faulty = await GpuAttention.create(d, 16, code);
    try {
      const r = compareAttention(ref, await runGpuAttention(d, faulty, s, inputs), wasm, 2);
      t.diagnostic(`${name}: out at ${r.out.worstRatio.toExponential(1)}× its bound, dqkv at ${r.dqkv.worstRatio.toExponential(1)}×`);
      if (forwardBroken) assert.ok(r.out.worstRatio > 100, `${name}: the forward passed (${r.out.worstRatio})`);
      else assert.ok(r.out.worstRatio <= 1, `${name}: the forward, not broken, failed`);
      assert.ok(r.dqkv.worstRatio > 100, `${name}: the backward passed (${r.dqkv.worstRatio})`);
    } finally {
      faulty.destroy();
    }
  }
});

test('grouped-query calls refuse KV not dividing H, a wrong head size and short arrays', { skip }, async () => {
  const a = await fixture.kernels().get(16), d = fixture.gpu().device;
  const { createArray } = await import('../../../src/engine/webgpu/buffers.ts');
  const s: GqaShape = { B: 1, T: 4, H: 4, KV: 2, D: 16 };
  const qkv = createArray(d, 4 * 128), out = createArray(d, 4 * 64), stats = createArray(d, 32);
  try {
    assert.throws(() => a.forward({ ...s, KV: 3, qkv, out, stats }), /KV ≥ 1 dividing H/);
    assert.throws(() => a.forward({ ...s, D: 8, qkv, out, stats }), /head size D = 8, these pipelines are for 16/);
    assert.throws(() => a.forward({ ...s, T: 5, qkv, out, stats }), /qkv needs 640 floats, its array holds 512/);
  } finally {
    for (const x of [qkv, out, stats]) x.destroy();
  }
});
