// Shared helpers of the merge tests.
import assert from 'node:assert/strict';
import { MergeError, type MergeErrorCode } from '../../src/merge/errors.ts';
import { mulberry32 } from '../../src/model/init.ts';

/** A small deterministic PRNG (the engine's mulberry32), floats in [0, 1). */
export const rng = mulberry32;

/** Uniform values in [-scale, scale). */
export function randomVector(n: number, seed: number, scale = 1): Float32Array {
  const r = rng(seed);
  const x = new Float32Array(n);
  for (let i = 0; i < n; i++) x[i] = (r() * 2 - 1) * scale;
  return x;
}

/** Asserts `fn` throws a MergeError with `code`; returns it. */
export function expectMergeError(fn: () => unknown, code: MergeErrorCode): MergeError {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof MergeError, `expected MergeError ${code}, got ${String(caught)}`);
  assert.equal(caught.code, code, caught.message);
  return caught;
}

/** Bitwise equality of two float32 arrays. */
export function bitwiseEqual(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}
