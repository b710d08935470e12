// WebGPU benchmarks: whether this machine has a device (a GPU, else
// SwiftShader), how far its SGEMM is from the WASM kernel's on a 256³
// product, and on a hardware adapter only, SGEMM throughput at 2048³
// (SwiftShader's speed says nothing about a GPU, so it is not measured).
import { Engine } from '../src/engine/engine.ts';
import { createArray, uploadArray } from '../src/engine/webgpu/buffers.ts';
import { compareSgemm, runGpuSgemm, runWasmSgemm, sgemmInputs, sgemmLayout } from '../src/engine/webgpu/crosscheck.ts';
import { openGpu } from '../src/engine/webgpu/device.ts';
import { GpuGemm } from '../src/engine/webgpu/gemm.ts';
import { mulberry32 } from '../src/model/init.ts';
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

/** GFLOP/s of an n³ product, timed to the queue's completion, median of `repeats`. */
async function sgemmGflops(device: GPUDevice, gemm: GpuGemm, n: number, repeats: number): Promise<number> {
  const values = Float32Array.from({ length: n * n }, (_, i) => Math.sin(i));
  const a = uploadArray(device, values), b = uploadArray(device, values), c = createArray(device, n * n);
  try {
    const run = async (): Promise<void> => {
      gemm.sgemm({ M: n, N: n, K: n, a, lda: n, b, ldb: n, c, ldc: n });
      await device.queue.onSubmittedWorkDone();
    };
    await run();
    const rates: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const t0 = performance.now();
      await run();
      rates.push((2 * n ** 3) / ((performance.now() - t0) * 1e6));
    }
    return median(rates);
  } finally {
    for (const x of [a, b, c]) x.destroy();
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
        ];
        if (gpu.isSoftware) o.log('software adapter: sgemm2048 not measured (its speed says nothing about a GPU)');
        else results.push({ bench: 'engine.webgpu.sgemm2048', value: await sgemmGflops(gpu.device, gemm, 2048, 7), unit: 'GFLOP/s' });
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
