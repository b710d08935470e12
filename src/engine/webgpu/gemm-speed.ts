// How fast a device multiplies matrices: the GFLOP/s of an n³ SGEMM
// (gemm.ts), timed to the queue's completion, the median of a few runs after
// one warm-up. The bench reports it at 2048³ on a hardware adapter; a miner
// measures it when it joins with the webgpu backend (src/miner/hardware.ts).
import { createArray, uploadArray } from './buffers.ts';
import type { GpuGemm } from './gemm.ts';
import { recorderOf } from './recorder.ts';

export async function sgemmGflops(device: GPUDevice, gemm: GpuGemm, n: number, repeats: number): Promise<number> {
  const values = Float32Array.from({ length: n * n }, (_, i) => Math.sin(i));
  const a = uploadArray(device, values), b = uploadArray(device, values), c = createArray(device, n * n);
  try {
    const run = async (): Promise<void> => {
      gemm.sgemm({ M: n, N: n, K: n, a, lda: n, b, ldb: n, c, ldc: n });
      await recorderOf(device).drain();
    };
    await run();
    const rates: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const t0 = performance.now();
      await run();
      rates.push((2 * n ** 3) / (Math.max(performance.now() - t0, 1e-3) * 1e6));
    }
    rates.sort((x, y) => x - y);
    return rates[rates.length >> 1];
  } finally {
    for (const x of [a, b, c]) x.destroy();
  }
}
