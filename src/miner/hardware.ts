// What a miner measures about itself when it joins: matrix-product speed with
// the engine (as throttled), threads and the memory it offers, and where its
// stages run: with the webgpu backend the speed is the GPU's SGEMM, and the
// adapter is named.
//
// The memory offered is what the planner may fill with one stage (weights,
// gradients, AdamW's moments, activations: src/planner/cost.ts). On WASM a
// stage lives in the engine's memory, which 32-bit WebAssembly holds to
// 4 GiB whatever the machine has. On a GPU the stage lives on the GPU (the
// host keeps a few copies of the weights for merges: less than the stage),
// so the offer is the GPU's memory, which WebGPU does not report: the miner
// is told it (`--gpu-memory`), else the free host memory is offered and a
// stage the GPU cannot hold is refused when it is taken. Either way a stage
// is held to weights of at most the adapter's largest storage binding
// (4 bytes a weight of the 16 a stage needs): at most 4 × that is offered.
import { freemem } from 'node:os';
import { WASM_MEMORY_BYTES, type Engine } from '../engine/engine.ts';
import { GpuGemm } from '../engine/webgpu/gemm.ts';
import { sgemmGflops } from '../engine/webgpu/gemm-speed.ts';
import type { Hardware } from '../protocol/messages.ts';
import type { Throttle } from './throttle.ts';

/** What the miner's memory allows, and what it was told (`--memory`, `--gpu-memory`). */
export interface MemoryFacts {
  /** free host memory */
  freeBytes: number;
  /** `--memory`: at most this */
  capBytes?: number;
  /** `--gpu-memory`: the GPU's memory (webgpu only) */
  gpuBytes?: number;
  /** the adapter's largest storage buffer binding (webgpu only) */
  maxBindingBytes?: number;
}

/** The memory a miner offers the planner for one stage on `backend` (see the top of this file). */
export function offeredMemory(backend: 'wasm' | 'webgpu', m: MemoryFacts): number {
  const limits = [m.freeBytes, m.capBytes ?? Infinity];
  if (backend === 'wasm') limits.push(WASM_MEMORY_BYTES);
  else limits.push(m.gpuBytes ?? Infinity, 4 * (m.maxBindingBytes ?? Infinity));
  return Math.max(1, Math.floor(Math.min(...limits)));
}

/** Median GFLOP/s of a 384³ sgemm on every engine thread, scaled by the throttle's share; the memory offered for a stage on WASM (offeredMemory). */
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
    memoryBytes: offeredMemory('wasm', { freeBytes: freemem(), capBytes: memoryCap }),
    backend: 'wasm',
  };
}

/**
 * The hardware a miner reports: on WASM as measureCpuHardware; on a GPU, the
 * median GFLOP/s of an SGEMM on it (512³ on a hardware adapter; 128³ on a
 * software one, which runs at CPU speed and would take seconds at 512³),
 * scaled by the throttle's share, the memory offered for a stage on the GPU
 * (offeredMemory: `gpuMemory` is what `--gpu-memory` said), and the
 * adapter's name.
 */
export async function measureHardware(engine: Engine, throttle: Throttle, memoryCap?: number, gpuMemory?: number): Promise<Hardware> {
  const cpu = measureCpuHardware(engine, throttle, memoryCap);
  const gpu = engine.gpu;
  if (!gpu) return cpu;
  const gemm = await GpuGemm.create(gpu.device);
  try {
    const gflops = await sgemmGflops(gpu.device, gemm, gpu.isSoftware ? 128 : 512, 5);
    const memoryBytes = offeredMemory('webgpu', { freeBytes: freemem(), capBytes: memoryCap, gpuBytes: gpuMemory, maxBindingBytes: gpu.limits.maxStorageBufferBindingSize });
    return { ...cpu, gflops: Math.min(1e7, gflops * throttle.share), memoryBytes, backend: 'webgpu', adapter: printable(gpu.adapterName), softwareAdapter: gpu.isSoftware };
  } finally {
    gemm.destroy();
  }
}

/** The adapter's name as the join message takes it: printable ASCII, at most 200 characters. */
function printable(name: string): string {
  const s = name.replace(/[^\x20-\x7e]/g, '?').trim().slice(0, 200);
  return s || 'unnamed adapter';
}
