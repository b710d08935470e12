// AdamW on the GPU (GpuStageOptimizer: moments, gradient norm and clipping
// scale all on the GPU) against src/model/adamw.ts on WASM, over a flat
// buffer of three NORM_CHUNK chunks and a bit, with a decay and a no-decay
// range. Steps that do not clip give the same bits (the same correctly
// rounded operations in the same order, kernels.test.ts); steps that clip
// may differ by the clipping scale's last bits (the GPU adds the chunk
// partials in compensated float32, WASM in float64), about an ulp of a
// weight (1e-6 of the largest is allowed). Weight prediction gives
// the same bits. A step whose norm overflows is skipped on the GPU, counted,
// and leaves weights and moments as they were.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { NORM_CHUNK } from '../../../src/engine/kernels.ts';
import { readArray, uploadArray, writeArray } from '../../../src/engine/webgpu/buffers.ts';
import { GpuKernelSet } from '../../../src/engine/webgpu/kernel-set.ts';
import { GpuStageOptimizer } from '../../../src/engine/webgpu/stage-optimizer.ts';
import { AdamW, ADAMW_DEFAULTS } from '../../../src/model/adamw.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { FlatTensors, ParamLayout } from '../../../src/model/params.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('stage optimizer', (device) => GpuKernelSet.create(device));
const skip = fixture.skip;

const n = 3 * NORM_CHUNK + 77;
const layout = new ParamLayout([
  { name: 'w', shape: [2 * NORM_CHUNK + 5], decay: true, init: { kind: 'zeros' } },
  { name: 'b', shape: [NORM_CHUNK + 72], decay: false, init: { kind: 'zeros' } },
]);

function random(len: number, seed: number, scale: number): Float32Array {
  const r = mulberry32(seed);
  return Float32Array.from({ length: len }, () => (r() * 2 - 1) * scale);
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

test('GPU AdamW steps, clipping and prediction match AdamW on WASM; a non-finite norm skips the step', { skip }, async () => {
  const engine = fixture.engine(), device = fixture.gpu().device;
  const config = { ...ADAMW_DEFAULTS, lr: 1e-2 };
  const params = new FlatTensors(layout, engine), grads = new FlatTensors(layout, engine);
  params.flat.data.set(random(n, 1, 0.2));
  const wasm = new AdamW(engine, params, grads, config);
  const weights = uploadArray(device, params.flat.data, 'weights');
  const g = uploadArray(device, new Float32Array(n), 'grads');
  const gpu = new GpuStageOptimizer(device, fixture.kernels().optimizer, layout, weights, config);
  const out = uploadArray(device, new Float32Array(n), 'predicted');
  try {
    // before any step, the prediction is the weights
    gpu.predict(out, 3);
    assert.deepEqual(await readArray(device, out), params.flat.data);

    // gradient scales: norms about 0.3 (no clipping) and about 30 (clipped to 1)
    const scales = [0.003, 0.003, 0.3, 0.003, 0.3];
    for (let s = 0; s < scales.length; s++) {
      const grad = random(n, 10 + s, scales[s]);
      grads.flat.data.set(grad);
      writeArray(device, g, grad);
      const norm = wasm.update();
      gpu.update(g);
      const status = await gpu.readStatus();
      const got = await readArray(device, weights);
      const d = maxDiff(got, params.flat.data);
      const clipped = norm > config.gradClip;
      process.stderr.write(`step ${s + 1}: norm ${norm.toFixed(4)} (GPU ${status.norm.toFixed(4)}, rel ${(Math.abs(status.norm - norm) / norm).toExponential(2)}), ${clipped ? 'clipped' : 'not clipped'}, weights apart by ${d.toExponential(2)}\n`);
      assert.ok(Math.abs(status.norm - norm) <= 1e-6 * norm, `norm ${status.norm} vs ${norm}`);
      // not clipped so far: the same bits; once a step clipped, the scale's last bits may differ, which moves a weight by an ulp or so
      if (s < 2) assert.equal(d, 0, `step ${s + 1}: same bits`);
      else assert.ok(d <= 1e-6 * Math.max(...params.flat.data.map(Math.abs)), `step ${s + 1}: ${d}`);
      assert.equal(status.nonFinite, 0);
      assert.equal(gpu.step, wasm.step);
    }

    // prediction from the same weights and moments: the same bits
    const moments = await gpu.readMoments();
    gpu.writeMoments(wasm.m.data, wasm.v.data);
    writeArray(device, weights, params.flat.data);
    gpu.predict(out, 3);
    assert.deepEqual(await readArray(device, out), wasm.predict(new Float32Array(n), 3));
    gpu.writeMoments(moments.m, moments.v);

    // an overflowing norm: skipped on the GPU, counted; weights and moments stay; the next step runs
    const before = await readArray(device, weights);
    const huge = new Float32Array(n).fill(1e30);
    writeArray(device, g, huge);
    gpu.update(g);
    assert.equal((await gpu.readStatus()).nonFinite, 1);
    assert.deepEqual(await readArray(device, weights), before, 'weights unchanged');
    const after = await gpu.readMoments();
    assert.deepEqual(after.m, moments.m, 'moments unchanged');
    writeArray(device, g, random(n, 99, 0.003));
    gpu.update(g);
    const status = await gpu.readStatus();
    assert.equal(status.nonFinite, 1, 'still one skipped step');
    assert.ok(Number.isFinite(status.norm));
    assert.notDeepEqual(await readArray(device, weights), before, 'the next step moved the weights');
  } finally {
    gpu.destroy();
    for (const a of [weights, g, out]) a.destroy();
    wasm.release();
    engine.free(params.flat);
    engine.free(grads.flat);
  }
});
