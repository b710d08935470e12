// Runs one kernel call on the WASM engine and on the GPU with the same inputs
// and compares every output element against its rounding bound: the check
// that the ported kernels compute what the WASM ones do (tests, the bench,
// and later a miner's self-check). A case holds the inputs, the two calls and
// the bounds (kernel-cases*.ts build them, with rounding.ts); a bound of 0
// demands the same bits.
import type { Engine } from '../engine.ts';
import type { Kernels } from '../kernels.ts';
import { readArray, uploadArray, type GpuArray } from './buffers.ts';
import type { GpuKernelSet } from './kernel-set.ts';
import { uploadIndices, type GpuRef } from './program.ts';

export type HostArray = Float32Array | Int32Array;

/** The name of a returned number (sumSquares) among a case's outputs. */
export const VALUE = 'value';

export interface KernelCase {
  /** the kernel, as Kernels names it (src/engine/kernels.ts) */
  kernel: string;
  /** every array the kernel reads or writes, holding its contents before the call */
  arrays: Record<string, HostArray>;
  /**
   * The outputs to compare (array names, or VALUE for a returned number),
   * each with its bound on |gpu − wasm|: one per element, or one for all.
   */
  bounds: Record<string, Float64Array | number>;
  wasm(k: Kernels, ptr: Record<string, number>): number | void;
  gpu(set: GpuKernelSet, arrays: Record<string, GpuRef>): Promise<number | void> | number | void;
}

export type Outputs = Record<string, Float32Array | Float64Array>;

export interface Comparison {
  /** max |gpu − other| over every output element */
  maxAbsDiff: number;
  /** max |gpu − other| / bound; ≤ 1 passes; Infinity where a bound of 0 (or a NaN) was broken */
  worstRatio: number;
  /** elements that differ at all */
  differing: number;
  elements: number;
  /** every bound is 0: the kernel must match bit for bit */
  exact: boolean;
  /** the output holding the worst ratio */
  worstOutput: string;
}

/** Runs the case's WASM call on copies of its arrays; returns its outputs. */
export function runWasmCase(engine: Engine, c: KernelCase): Outputs {
  const ptr: Record<string, number> = {}, views: Record<string, Float32Array> = {}, owned: { ptr: number }[] = [];
  try {
    for (const [name, host] of Object.entries(c.arrays)) {
      if (host instanceof Int32Array) {
        const ints = engine.int32(Math.max(1, host.length));
        ints.data.set(host);
        owned.push(ints);
        ptr[name] = ints.ptr;
      } else {
        const t = engine.tensorFrom([Math.max(1, host.length)], host.length ? host : [0]);
        owned.push(t);
        ptr[name] = t.ptr;
        views[name] = t.data;
      }
    }
    const value = c.wasm(engine.kernels, ptr);
    return collect(c, (name) => views[name].slice(0, c.arrays[name].length), value);
  } finally {
    for (const t of owned) engine.free(t);
  }
}

/**
 * Runs the case's GPU call on uploaded copies of its arrays; returns its
 * outputs (read back). With `pad`, each array sits `pad` elements into a
 * buffer with `pad` more after it, the padding NaN (0 for int arrays), and
 * the kernels get windows: a read outside a window shows as NaN, a write
 * outside one throws here.
 */
export async function runGpuCase(set: GpuKernelSet, c: KernelCase, pad = 0): Promise<Outputs> {
  const device = set.device, arrays: Record<string, GpuArray> = {}, windows: Record<string, GpuRef> = {};
  try {
    for (const [name, host] of Object.entries(c.arrays)) {
      const padded = host instanceof Int32Array ? new Int32Array(host.length + 2 * pad) : new Float32Array(host.length + 2 * pad).fill(NaN);
      padded.set(host, pad);
      arrays[name] = padded instanceof Int32Array ? uploadIndices(device, padded, 2 ** 31, name) : uploadArray(device, padded, name);
      windows[name] = pad ? { array: arrays[name], offset: pad } : arrays[name];
    }
    const value = await c.gpu(set, windows);
    const read: Record<string, Float32Array> = {};
    for (const name of Object.keys(c.bounds)) {
      if (name === VALUE) continue;
      const whole = await readArray(device, arrays[name]), n = c.arrays[name].length;
      const outside = [...whole.subarray(0, pad), ...whole.subarray(pad + n)].filter((v) => !Number.isNaN(v)).length;
      if (outside) throw new Error(`${c.kernel}: ${outside} elements of ${name} outside its window changed`);
      read[name] = whole.slice(pad, pad + n);
    }
    return collect(c, (name) => read[name], value);
  } finally {
    for (const a of Object.values(arrays)) a.destroy();
  }
}

function collect(c: KernelCase, array: (name: string) => Float32Array, value: number | void): Outputs {
  const out: Outputs = {};
  for (const name of Object.keys(c.bounds)) out[name] = name === VALUE ? Float64Array.of(value ?? NaN) : array(name);
  return out;
}

/** Compares the GPU's outputs with another run's (WASM's, or a deliberately wrong one's) against the case's bounds. */
export function compareOutputs(c: KernelCase, gpu: Outputs, other: Outputs): Comparison {
  const r: Comparison = { maxAbsDiff: 0, worstRatio: 0, differing: 0, elements: 0, exact: true, worstOutput: '' };
  for (const [name, bound] of Object.entries(c.bounds)) {
    const g = gpu[name], o = other[name];
    if (g.length !== o.length) throw new Error(`${c.kernel}: ${name} has ${g.length} elements on the GPU, ${o.length} on the other side`);
    for (let i = 0; i < g.length; i++) {
      const b = typeof bound === 'number' ? bound : bound[i];
      if (b !== 0) r.exact = false;
      const d = Math.abs(g[i] - o[i]);
      const ratio = d === 0 ? 0 : Number.isNaN(d) || b === 0 ? Infinity : d / b;
      if (d !== 0) r.differing++;
      if (!Number.isNaN(d)) r.maxAbsDiff = Math.max(r.maxAbsDiff, d);
      if (ratio > r.worstRatio || !r.worstOutput) {
        r.worstRatio = Math.max(r.worstRatio, ratio);
        r.worstOutput = name;
      }
    }
    r.elements += g.length;
  }
  return r;
}

/** Runs a case on both backends and compares them. */
export async function checkCase(engine: Engine, set: GpuKernelSet, c: KernelCase): Promise<Comparison> {
  const gpu = await runGpuCase(set, c);
  return compareOutputs(c, gpu, runWasmCase(engine, c));
}
