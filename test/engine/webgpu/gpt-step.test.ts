// A whole GPT training step on the GPU (SwiftShader) against the WASM
// engine's step: same config, same seed, same init, same batch. One step:
// the loss, every gradient and every parameter after AdamW within the bounds
// of src/engine/webgpu/gpt-step-check.ts; negative controls (one layer's
// gradient dropped, a learning rate 10% off) fail those bounds. Then 50 steps
// of gpt-micro on Moby Dick on both backends: the losses stay together and
// fall on the GPU.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { batchForShard, type TokenBatch } from '../../../src/data/batches.ts';
import { mobyDickBytes } from '../../../src/data/corpus.ts';
import { GpuGptStep } from '../../../src/engine/webgpu/gpt-step.ts';
import { recorderOf } from '../../../src/engine/webgpu/recorder.ts';
import { compareFirstStep, type StepComparison } from '../../../src/engine/webgpu/gpt-step-check.ts';
import { AdamW, ADAMW_DEFAULTS, type AdamWConfig } from '../../../src/model/adamw.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { partCount } from '../../../src/model/parts.ts';
import { gpuFixture } from './gpu-fixture.ts';

const fixture = await gpuFixture('gpt step', () => Promise.resolve({ destroy(): void {} }));
const skip = fixture.skip;
const device = (): GPUDevice => fixture.gpu().device;
const SEED = 7;
const bytes = mobyDickBytes();

/**
 * Tolerances. Empirical, with safety factors; the worst-case sums of the
 * per-kernel bounds of docs/webgpu.md over a network's depth are 10² to 10³
 * times looser and would let real mistakes through.
 * - loss: relative 1e-6 (measured ≤ 2.5e-9 on gpt-micro and gpt-tiny).
 * - gradients: per tensor, max |gpu − wasm| ≤ 1e-5 · max |wasm| (measured ≤ 6.6e-7:
 *   15× headroom; each element is a chain of 10 to 25 kernels, each with a
 *   relative rounding of a few 1e-7 per the GEMM and attention tables).
 * - parameters after one AdamW step: derived from the gradient tolerance (gpt-step-check.ts).
 * - after 50 steps: |Δloss| ≤ 1e-4 (measured ≤ 3e-8).
 */
const LOSS_REL = 1e-6;
const GRAD_REL = 1e-5;
const LOSS_50_ABS = 1e-4;

interface OneStep {
  comparison: StepComparison;
  wasmLoss: number;
  gpuLoss: number;
  wasmNorm: number;
  gpuNorm: number;
  ms: number;
  /** the step's kernels and the command buffers they went in (recorder.ts) */
  work: { dispatches: number; submits: number };
}

function batch(step: number, B: number, T: number): TokenBatch {
  return batchForShard(bytes, SEED, step, B, T);
}

/** One step on both backends from the same initial weights; `gpu` tweaks the GPU side for negative controls. */
async function oneStep(model: string, B: number, gpu: { lrFactor?: number; dropGradients?: string[] } = {}): Promise<OneStep> {
  const config = gptConfig(model);
  const T = config.contextLength;
  const engine = fixture.engine();
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: B, seed: SEED });
  const opt = new AdamW(engine, stage.params, stage.grads, ADAMW_DEFAULTS);
  const before = stage.params.flat.data.slice();
  const gpuStep = await GpuGptStep.create(device(), config, stage.layout, before, { batchSize: B, optimizer: ADAMW_DEFAULTS, dropGradients: gpu.dropGradients });
  try {
    const b = batch(0, B, T);
    stage.zeroGrad();
    const wasmLoss = stage.forward(b.inputs, B, T, b.targets) as number;
    stage.backward();
    const wasmGrads = stage.grads.flat.data.slice();
    const wasmNorm = opt.update();
    const recorder = recorderOf(device());
    recorder.flush();
    const counted = { ...recorder.counts };
    const t0 = performance.now();
    const r = await gpuStep.trainStep(b.inputs, b.targets, B, ADAMW_DEFAULTS.lr * (gpu.lrFactor ?? 1));
    const gpuAfter = await gpuStep.readParams();
    const ms = performance.now() - t0;
    const work = { dispatches: recorder.counts.dispatches - counted.dispatches, submits: recorder.counts.submits - counted.submits };
    const gradScale = wasmNorm > ADAMW_DEFAULTS.gradClip ? ADAMW_DEFAULTS.gradClip / wasmNorm : 1;
    const comparison = compareFirstStep({
      layout: stage.layout, wasmGrads, gpuGrads: await gpuStep.readGrads(), before,
      wasmAfter: stage.params.flat.data, gpuAfter, gradRel: GRAD_REL, lr: ADAMW_DEFAULTS.lr, eps: ADAMW_DEFAULTS.eps, gradScale,
    });
    assert.deepEqual(fixture.gpu().takeErrors(), []);
    return { comparison, wasmLoss, gpuLoss: r.loss, wasmNorm, gpuNorm: r.gradNorm, ms, work };
  } finally {
    gpuStep.destroy();
    opt.release();
    stage.release();
  }
}

function describe(s: OneStep): string {
  const c = s.comparison;
  return `loss rel ${(Math.abs(s.gpuLoss - s.wasmLoss) / s.wasmLoss).toExponential(2)}, worst gradient ${c.worstGrad.name} at ${c.worstGrad.gradRatio.toFixed(3)} of its tolerance, `
    + `worst parameter ${c.worstParam.name} at ${c.worstParam.paramRatio.toFixed(3)} of its bound, GPU step ${s.ms.toFixed(0)} ms, ${s.work.dispatches} dispatches in ${s.work.submits} command buffers`;
}

function assertSameStep(s: OneStep): void {
  assert.ok(Math.abs(s.gpuLoss - s.wasmLoss) <= LOSS_REL * s.wasmLoss, `loss ${s.gpuLoss} vs ${s.wasmLoss}`);
  assert.ok(Math.abs(s.gpuNorm - s.wasmNorm) <= GRAD_REL * s.wasmNorm, `gradient norm ${s.gpuNorm} vs ${s.wasmNorm}`);
  for (const t of s.comparison.tensors) {
    assert.ok(t.gradRatio <= 1, `${t.name}: gradient off by ${t.gradDiff} (max ${t.gradMax})`);
    assert.ok(t.paramRatio <= 1, `${t.name}: parameters off by ${t.paramRatio}× their bound`);
  }
}

for (const [model, B] of [['gpt-micro', 4], ['gpt-tiny', 2]] as const) {
  test(`${model}: one training step on the GPU matches the WASM step`, { skip }, async () => {
    const s = await oneStep(model, B);
    process.stderr.write(`${model} B ${B}: ${describe(s)}\n`);
    assertSameStep(s);
    // the forward and backward in one command buffer, AdamW (after the loss and norm are read) in another
    assert.ok(s.work.submits <= 3 && s.work.dispatches > 50, JSON.stringify(s.work));
  });
}

test('negative controls: a dropped layer gradient or a learning rate 10% off fails the bounds', { skip }, async () => {
  const dropped = await oneStep('gpt-micro', 4, { dropGradients: ['h.0.attn.qkv.w'] });
  const wrongLr = await oneStep('gpt-micro', 4, { lrFactor: 1.1 });
  process.stderr.write(`dropped h.0.attn.qkv.w gradient: ${describe(dropped)}\nlr ×1.1: ${describe(wrongLr)}\n`);
  assert.equal(dropped.comparison.worstGrad.name, 'h.0.attn.qkv.w');
  assert.ok(dropped.comparison.worstGrad.gradRatio > 1000);
  assert.ok(dropped.comparison.worstParam.paramRatio > 10);
  assert.throws(() => assertSameStep(dropped));
  assert.ok(wrongLr.comparison.worstParam.paramRatio > 10);
  assert.throws(() => assertSameStep(wrongLr));
});

test('gpt-micro: 50 steps on Moby Dick, both backends: the losses stay together and fall', { skip }, async () => {
  const config = gptConfig('gpt-micro');
  const B = 4, T = config.contextLength, steps = 50;
  const engine = fixture.engine();
  const optimizer: AdamWConfig = ADAMW_DEFAULTS;
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: B, seed: SEED });
  const opt = new AdamW(engine, stage.params, stage.grads, optimizer);
  const gpuStep = await GpuGptStep.create(device(), config, stage.layout, stage.params.flat.data.slice(), { batchSize: B, optimizer });
  try {
    const wasmLosses: number[] = [], gpuLosses: number[] = [];
    let gpuMs = 0;
    for (let step = 0; step < steps; step++) {
      const b = batch(step, B, T);
      stage.zeroGrad();
      wasmLosses.push(stage.forward(b.inputs, B, T, b.targets) as number);
      stage.backward();
      opt.update();
      const t0 = performance.now();
      gpuLosses.push((await gpuStep.trainStep(b.inputs, b.targets, B)).loss);
      gpuMs += performance.now() - t0;
    }
    const maxDiff = Math.max(...wasmLosses.map((l, i) => Math.abs(l - gpuLosses[i])));
    const first = gpuLosses[0], last = gpuLosses[steps - 1];
    process.stderr.write(`50 steps: GPU loss ${first.toFixed(4)} → ${last.toFixed(4)}, WASM → ${wasmLosses[steps - 1].toFixed(4)}, `
      + `max |Δloss| ${maxDiff.toExponential(2)}, ${(gpuMs / steps).toFixed(0)} ms per GPU step (SwiftShader)\n`);
    assert.ok(Math.abs(last - wasmLosses[steps - 1]) <= LOSS_50_ABS, `final losses ${last} vs ${wasmLosses[steps - 1]}`);
    assert.ok(maxDiff <= LOSS_50_ABS, `losses apart by ${maxDiff}`);
    assert.ok(last < first - 0.5, `GPU loss ${first} → ${last} did not fall`);
    assert.deepEqual(fixture.gpu().takeErrors(), []);
  } finally {
    gpuStep.destroy();
    opt.release();
    stage.release();
  }
});
