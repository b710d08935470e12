// What a miner measures about itself when it joins: matrix-product speed with
// the engine (as throttled), threads and free memory.
import { freemem } from 'node:os';
import type { Engine } from '../engine/engine.ts';
import type { Hardware } from '../protocol/messages.ts';
import type { Throttle } from './throttle.ts';

/** Median GFLOP/s of a 384³ sgemm on every engine thread, scaled by the throttle's share; the free memory, or `memoryCap` when that is less (what the miner offers). */
export function measureHardware(engine: Engine, throttle: Throttle, memoryCap?: number): Hardware {
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
  };
}
