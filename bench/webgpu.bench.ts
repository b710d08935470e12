// WebGPU benchmarks: whether this machine has a device (a GPU, else
// SwiftShader), how far its SGEMM is from the WASM kernel's on a 256³
// product, how far a few other ported kernels are from theirs at gpt-tiny
// sizes, and on a hardware adapter only, SGEMM throughput at 2048³
// (SwiftShader's speed says nothing about a GPU, so it is not measured), and
// gpt-tiny's training tokens/s there; on any adapter, 200 training steps of
// gpt-micro on both backends (how far apart their losses get), and the bytes
// a miner's GPU stage moves between CPU and GPU per microbatch.
import { Engine } from '../src/engine/engine.ts';
import { GpuAttention } from '../src/engine/webgpu/attention.ts';
import { crosscheckAttention } from '../src/engine/webgpu/attention-check.ts';
import { compareSgemm, runGpuSgemm, runWasmSgemm, sgemmInputs, sgemmLayout } from '../src/engine/webgpu/crosscheck.ts';
import { openGpu } from '../src/engine/webgpu/device.ts';
import { GpuGemm } from '../src/engine/webgpu/gemm.ts';
import { sgemmGflops } from '../src/engine/webgpu/gemm-speed.ts';
import { adamPredictCase, adamwCase, elementwiseCase } from '../src/engine/webgpu/kernel-cases.ts';
import { crossEntropyForwardCase, layernormForwardCase } from '../src/engine/webgpu/kernel-cases-rows.ts';
import { checkCase, type KernelCase } from '../src/engine/webgpu/kernel-check.ts';
import { GpuKernelSet } from '../src/engine/webgpu/kernel-set.ts';
import { batchForShard } from '../src/data/batches.ts';
import { mobyDickBytes } from '../src/data/corpus.ts';
import { GpuGptStep } from '../src/engine/webgpu/gpt-step.ts';
import { AdamW, ADAMW_DEFAULTS } from '../src/model/adamw.ts';
import { GPT_CONFIGS, gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { partCount, rangeParamCount } from '../src/model/parts.ts';
import { mulberry32 } from '../src/model/init.ts';
import { recorderOf } from '../src/engine/webgpu/recorder.ts';
import { StageRunner } from '../src/miner/stage-runner.ts';
import type { StageAssignment } from '../src/protocol/messages.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

/** max |gpu − wasm| of a 256³ product, and the worst element's share of its rounding bound. */
async function diffAgainstWasm(device: GPUDevice, gemm: GpuGemm): Promise<{ maxAbsDiff: number; worstRatio: number }> {
  const engine = await Engine.create({ threads: 0 });
  try {
    const c = { M: 256, N: 256, K: 256 };
    const layout = sgemmLayout(c);
    const inputs = sgemmInputs(layout, mulberry32(256));
    const gpu = await runGpuSgemm(device, gemm, c, layout, inputs);
    return compareSgemm(c, layout, inputs, gpu, runWasmSgemm(engine, c, layout, inputs));
  } finally {
    await engine.close();
  }
}

/**
 * max |gpu − wasm| of representative non-GEMM kernels at gpt-tiny sizes: B·T =
 * 12·64 rows, C = 128, vocabulary 256, MLP width 4C, AdamW over every
 * parameter. Each must also stay within its rounding bound (kernel-cases*.ts).
 */
async function kernelDiffs(device: GPUDevice, log: (line: string) => void): Promise<BenchResult[]> {
  const tiny = GPT_CONFIGS['gpt-tiny'];
  const N = 12 * tiny.contextLength, C = tiny.channels, V = tiny.vocabSize;
  const random = mulberry32(64);
  const cases: KernelCase[] = [
    layernormForwardCase({ N, C }, random),
    crossEntropyForwardCase({ N, V }, random),
    adamwCase(rangeParamCount(tiny, { from: 0, to: partCount(tiny) }), random),
    adamPredictCase(rangeParamCount(tiny, { from: 0, to: partCount(tiny) }), random),
    elementwiseCase('geluBackward', N * tiny.mlpRatio * C, random),
  ];
  const [engine, set] = await Promise.all([Engine.create({ threads: 0 }), GpuKernelSet.create(device)]);
  try {
    const results: BenchResult[] = [];
    for (const c of cases) {
      const r = await checkCase(engine, set, c);
      log(`${c.kernel} at gpt-tiny sizes against WASM: max |diff| ${r.maxAbsDiff.toExponential(2)}, worst element at ${r.worstRatio.toExponential(2)} of its rounding bound`);
      if (r.worstRatio > 1) throw new Error(`${c.kernel}: the GPU is ${r.worstRatio}× its bound away from WASM`);
      results.push({ bench: `engine.webgpu.max_abs_diff.${c.kernel}`, value: r.maxAbsDiff, unit: 'abs' });
    }
    return results;
  } finally {
    set.destroy();
    await engine.close();
  }
}

/** max |gpu − wasm| of attention forward (out) and backward (dqkv) at gpt-tiny sizes, B = 4; each must stay within its bound (attention-bound.ts). */
async function attentionDiffs(device: GPUDevice, log: (line: string) => void): Promise<BenchResult[]> {
  const [engine, attention] = await Promise.all([Engine.create({ threads: 0 }), GpuAttention.create(device, 32)]);
  try {
    const r = (await crosscheckAttention(engine, device, attention, { B: 4, T: 64, C: 128, NH: 4 }, mulberry32(64))).gpuWasm;
    log(`attention at gpt-tiny sizes (B 4) against WASM: max |diff| out ${r.out.maxAbsDiff.toExponential(2)}, dqkv ${r.dqkv.maxAbsDiff.toExponential(2)}; worst elements at ${r.out.worstRatio.toExponential(2)}, ${r.dqkv.worstRatio.toExponential(2)} of their bounds`);
    if (r.out.worstRatio > 1 || r.att.worstRatio > 1 || r.dqkv.worstRatio > 1) throw new Error('attention: the GPU is outside its bound from WASM');
    return [
      { bench: 'engine.webgpu.max_abs_diff.attention_forward', value: r.out.maxAbsDiff, unit: 'abs' },
      { bench: 'engine.webgpu.max_abs_diff.attention_backward', value: r.dqkv.maxAbsDiff, unit: 'abs' },
    ];
  } finally {
    attention.destroy();
    await engine.close();
  }
}

/**
 * 200 training steps of gpt-micro (B 4, Moby Dick, AdamW defaults) on both
 * backends from the same weights: the largest |Δloss| at any step and the
 * final losses (the test runs 50 of them, gpt-step.test.ts).
 */
async function train200(device: GPUDevice, log: (line: string) => void): Promise<BenchResult[]> {
  const config = gptConfig('gpt-micro');
  const B = 4, T = config.contextLength, steps = 200;
  const engine = await Engine.create({ threads: 0 });
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: B, seed: 7 });
  const opt = new AdamW(engine, stage.params, stage.grads, ADAMW_DEFAULTS);
  const gpuStep = await GpuGptStep.create(device, config, stage.layout, stage.params.flat.data.slice(), { batchSize: B, optimizer: ADAMW_DEFAULTS });
  try {
    const bytes = mobyDickBytes();
    let maxDiff = 0, wasmLoss = 0, gpuLoss = 0;
    for (let step = 0; step < steps; step++) {
      const b = batchForShard(bytes, 7, step, B, T);
      stage.zeroGrad();
      wasmLoss = stage.forward(b.inputs, B, T, b.targets) as number;
      stage.backward();
      opt.update();
      gpuLoss = (await gpuStep.trainStep(b.inputs, b.targets, B)).loss;
      maxDiff = Math.max(maxDiff, Math.abs(gpuLoss - wasmLoss));
    }
    log(`gpt-micro, ${steps} steps on both backends: final loss WebGPU ${gpuLoss.toFixed(5)}, WASM ${wasmLoss.toFixed(5)}; max |Δloss| over the steps ${maxDiff.toExponential(2)}`);
    // the bound gpt-step.test.ts states for 50 steps holds for 200
    if (!(maxDiff <= 1e-4)) throw new Error(`gpt-micro: the backends' losses drifted ${maxDiff} apart in ${steps} steps (bound 1e-4)`);
    return [
      { bench: 'engine.webgpu.train200.max_loss_diff', value: maxDiff, unit: 'nats' },
      { bench: 'engine.webgpu.train200.final_loss', value: Number(gpuLoss.toFixed(5)), unit: 'nats' },
    ];
  } finally {
    gpuStep.destroy();
    opt.release();
    stage.release();
    await engine.close();
  }
}

/**
 * What crosses between CPU and GPU per microbatch for a miner's stage on the
 * GPU: the first of 2 stages of gpt-tiny (B 8) through the StageRunner a
 * miner uses, 8 microbatches with 2 in flight. The weights, gradients and
 * AdamW's moments stay on the GPU, so it is the batch in, the activation
 * out, the gradient in and a 16-byte step status out (the stage's weights are
 * logged beside it: before, they crossed each way every microbatch).
 */
async function stageTraffic(log: (line: string) => void): Promise<BenchResult[]> {
  const config = gptConfig('gpt-tiny');
  const B = 8, width = B * config.contextLength * config.channels;
  const engine = await Engine.create({ threads: 0, backend: 'webgpu' });
  const a: StageAssignment = { runId: 'bench', stage: 0, stageCount: 2, from: 0, to: 3, model: 'gpt-tiny', data: 'moby-dick', batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-3 };
  const runner = new StageRunner(engine, a, 2);
  try {
    await runner.ready();
    const counts = recorderOf(engine.gpu!.device).counts;
    const before = { written: counts.bytesWritten, read: counts.bytesRead };
    const dOut = new Float32Array(width).fill(1e-4);
    const n = 8;
    for (let i = 0; i < n; i += 2) {
      await runner.forwardFirst(i, i);
      await runner.forwardFirst(i + 1, i + 1);
      await runner.backward(i, dOut);
      await runner.backward(i + 1, dOut);
    }
    const perMicrobatch = (counts.bytesWritten - before.written + counts.bytesRead - before.read) / n;
    log(`gpt-tiny stage [0, 3) on the GPU (${runner.paramCount} parameters, ${4 * runner.paramCount} bytes of weights): ${perMicrobatch} bytes cross CPU↔GPU per microbatch (written ${(counts.bytesWritten - before.written) / n}, read ${(counts.bytesRead - before.read) / n})`);
    return [
      { bench: 'engine.webgpu.stage.bytes_per_microbatch', value: perMicrobatch, unit: 'bytes' },
      { bench: 'engine.webgpu.stage.weights_bytes', value: 4 * runner.paramCount, unit: 'bytes' },
    ];
  } finally {
    runner.dispose();
    await engine.close();
  }
}

/** gpt-tiny training tokens/s of the whole GPU step (B 8; on a hardware adapter only), median of 5 steps after one. */
async function tinyTokensPerS(device: GPUDevice): Promise<number> {
  const config = gptConfig('gpt-tiny');
  const B = 8, T = config.contextLength;
  const engine = await Engine.create({ threads: 0 });
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 7 });
  const gpuStep = await GpuGptStep.create(device, config, stage.layout, stage.params.flat.data.slice(), { batchSize: B, optimizer: ADAMW_DEFAULTS });
  try {
    const b = batchForShard(mobyDickBytes(), 7, 0, B, T);
    const rates: number[] = [];
    for (let i = 0; i < 6; i++) {
      const t0 = performance.now();
      // trainStep resolves once AdamW has run (it reads the step's status after it)
      await gpuStep.trainStep(b.inputs, b.targets, B);
      if (i > 0) rates.push((B * T) / ((performance.now() - t0) / 1000));
    }
    return median(rates);
  } finally {
    gpuStep.destroy();
    stage.release();
    await engine.close();
  }
}

export const webgpuBenches: Bench[] = [
  {
    group: 'webgpu',
    async run(o): Promise<BenchResult[]> {
      const opened = await openGpu({ software: 'allow' });
      if (!opened.gpu) {
        o.log(`no WebGPU device: ${opened.reason}`);
        return [{ bench: 'engine.webgpu.available', value: 0, unit: 'bool' }];
      }
      const gpu = opened.gpu;
      const gemm = await GpuGemm.create(gpu.device);
      try {
        o.log(`adapter "${gpu.adapterName}" (vendor ${gpu.adapter.vendor}, architecture ${gpu.adapter.architecture}), software ${gpu.isSoftware}`);
        const diff = await diffAgainstWasm(gpu.device, gemm);
        o.log(`sgemm 256³ against WASM: max |diff| ${diff.maxAbsDiff.toExponential(2)}, worst element at ${diff.worstRatio.toExponential(2)} of its rounding bound`);
        const results: BenchResult[] = [
          { bench: 'engine.webgpu.available', value: 1, unit: 'bool' },
          { bench: 'engine.webgpu.software', value: gpu.isSoftware ? 1 : 0, unit: 'bool' },
          { bench: 'engine.webgpu.max_abs_diff.sgemm', value: diff.maxAbsDiff, unit: 'abs' },
          ...(await kernelDiffs(gpu.device, o.log)),
          ...(await attentionDiffs(gpu.device, o.log)),
          ...(await train200(gpu.device, o.log)),
          ...(await stageTraffic(o.log)),
        ];
        if (gpu.isSoftware) o.log('software adapter: sgemm2048 and gpt-tiny tokens/s not measured (its speed says nothing about a GPU)');
        else {
          results.push({ bench: 'engine.webgpu.sgemm2048', value: await sgemmGflops(gpu.device, gemm, 2048, 7), unit: 'GFLOP/s' });
          results.push({ bench: 'gpt-tiny.webgpu.train.tokens_per_s', value: Math.round(await tinyTokensPerS(gpu.device)), unit: 'tokens/s' });
        }
        const errors = gpu.takeErrors();
        if (errors.length) throw new Error(`the GPU reported errors: ${errors.join('; ')}`);
        return results;
      } finally {
        gemm.destroy();
        await gpu.close();
      }
    },
  },
];
