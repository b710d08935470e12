// What a miner measures about itself when it joins: matrix-product speed with
// the engine (as throttled), threads and free memory, and where its stages
// run: with the webgpu backend the speed is the GPU's SGEMM, and the adapter
// is named.
import { freemem } from 'node:os';
import type { Engine } from '../engine/engine.ts';
import { GpuGemm } from '../engine/webgpu/gemm.ts';
import { sgemmGflops } from '../engine/webgpu/gemm-speed.ts';
import type { Hardware } from '../protocol/messages.ts';
import type { Throttle } from './throttle.ts';

/** Median GFLOP/s of a 384³ sgemm on every engine thread, scaled by the throttle's share; the free memory, or `memoryCap` when that is less (what the miner offers). */
export function measureCpuHardware(engine: Engine, throttle: Throttle, memoryCap?: number): Hardware {
  const n = 384;
  const a = engine.tensor([n, n]), b = engine.tensor([n, n]), c = engine.tensor([n, n]);
  a.data.fill(0.5);
  b.data.fill(0.25);
  const rates: number[] = [];
  for (let i = 0; i < 7; i++) {
    const t0 = performance.now();
    engine.kernels.sgemm({ M: n, N: n, K: n, a: a.ptr, lda: n, b: b.ptr, ldb: n, c: c.ptr, ldc: n });
    const ms = Math.max(performance.now() - t0, 1e-3);
    if (i > 0) rates.push((2 * n ** 3) / (ms * 1e6));
  }
  for (const t of [a, b, c]) engine.free(t);
  rates.sort((x, y) => x - y);
  return {
    gflops: rates[rates.length >> 1] * throttle.share,
    threads: engine.threads,
    memoryBytes: Math.floor(Math.min(freemem(), memoryCap ?? Infinity)),
    backend: 'wasm',
  };
}

/**
 * The hardware a miner reports: on WASM as measureCpuHardware; on a GPU, the
 * median GFLOP/s of an SGEMM on it (512³ on a hardware adapter; 128³ on a
 * software one, which runs at CPU speed and would take seconds at 512³),
 * scaled by the throttle's share, and the adapter's name.
 */
export async function measureHardware(engine: Engine, throttle: Throttle, memoryCap?: number): Promise<Hardware> {
  const cpu = measureCpuHardware(engine, throttle, memoryCap);
  const gpu = engine.gpu;
  if (!gpu) return cpu;
  const gemm = await GpuGemm.create(gpu.device);
  try {
    const gflops = await sgemmGflops(gpu.device, gemm, gpu.isSoftware ? 128 : 512, 5);
    return { ...cpu, gflops: Math.min(1e7, gflops * throttle.share), backend: 'webgpu', adapter: printable(gpu.adapterName), softwareAdapter: gpu.isSoftware };
  } finally {
    gemm.destroy();
  }
}

/** The adapter's name as the join message takes it: printable ASCII, at most 200 characters. */
function printable(name: string): string {
  const s = name.replace(/[^\x20-\x7e]/g, '?').trim().slice(0, 200);
  return s || 'unnamed adapter';
}
