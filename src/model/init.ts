// Deterministic initialisation: every parameter tensor draws from its own
// generator seeded by (seed, name), so a model initialises identically whether
// it is built whole or as stages.
import type { ParamLayout } from './params.ts';

/** FNV-1a hash of a string mixed with a seed: a 32-bit generator seed. */
export function hashSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ (seed >>> 0)) >>> 0;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/** mulberry32: a small, fast 32-bit generator. Returns floats in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal samples (Box-Muller) from a uniform generator. */
export function normalSampler(uniform: () => number): () => number {
  let spare: number | undefined;
  return () => {
    if (spare !== undefined) {
      const s = spare;
      spare = undefined;
      return s;
    }
    let u = 0;
    while (u === 0) u = uniform();
    const v = uniform();
    const r = Math.sqrt(-2 * Math.log(u));
    spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  };
}

/** Fills `flat` (laid out by `layout`) from each parameter's init rule. */
export function initParams(layout: ParamLayout, flat: Float32Array, seed: number): void {
  for (const e of layout.entries) {
    const view = flat.subarray(e.offset, e.offset + e.size);
    switch (e.init.kind) {
      case 'zeros':
        view.fill(0);
        break;
      case 'ones':
        view.fill(1);
        break;
      case 'uniform': {
        const uniform = mulberry32(hashSeed(seed, e.name));
        const b = e.init.bound;
        for (let i = 0; i < view.length; i++) view[i] = (uniform() * 2 - 1) * b;
        break;
      }
      case 'normal': {
        const normal = normalSampler(mulberry32(hashSeed(seed, e.name)));
        const std = e.init.std;
        for (let i = 0; i < view.length; i++) view[i] = normal() * std;
        break;
      }
    }
  }
}
