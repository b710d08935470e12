// Symmetric int8 quantization with float32 scales, over typed arrays.
//
// A group (a row, or a block) of values x is stored as scale = absmax(x) / 127
// (rounded to float32) and q = round(x / scale) in [-127, 127]; it decodes as
// q * scale. Each decoded value is within scale / 2 of the original (plus
// float32 rounding of the product). An all-zero group has scale 0.
//
// Per-row ('int8-row'): groups are the rows of the last dimension; used for
// activations and gradients. Per-block ('int8-block'): groups are consecutive
// blocks of `blockSize` values of the flat vector (the last may be shorter);
// used for pseudo-gradients, with ErrorFeedback carrying the rounding error
// over to the next round.

/** Largest magnitude of an int8 code. */
const QMAX = 127;
/** Smallest normal float32 (2^-126). */
const MIN_NORMAL_F32 = 1.1754943508222875e-38;

/** Scales plus int8 codes of a quantized vector; groups are contiguous runs of `groupSize` values. */
export interface Int8Quantized {
  scales: Float32Array;
  codes: Int8Array;
}

/** Number of groups of `groupSize` values in `n` values (the last may be shorter). */
export function groupCount(n: number, groupSize: number): number {
  if (!Number.isInteger(groupSize) || groupSize < 1) throw new RangeError(`group size ${groupSize} must be a positive integer`);
  return Math.ceil(n / groupSize);
}

/**
 * Quantizes `src` in groups of `groupSize` consecutive values into `scales`
 * (one per group) and `codes` (one per value). No allocation. `src` must be
 * finite (frames check this before quantizing).
 */
export function quantizeInt8(src: Float32Array, groupSize: number, scales: Float32Array, codes: Int8Array): void {
  const n = src.length;
  const groups = groupCount(n, groupSize);
  if (scales.length !== groups) throw new RangeError(`quantizeInt8: ${scales.length} scales for ${groups} groups`);
  if (codes.length !== n) throw new RangeError(`quantizeInt8: ${codes.length} codes for ${n} values`);
  for (let g = 0; g < groups; g++) {
    const start = g * groupSize;
    const end = Math.min(start + groupSize, n);
    // min and max without Math.abs: branch-light and 3-4x faster in V8
    let hi = 0;
    let lo = 0;
    for (let i = start; i < end; i++) {
      const v = src[i];
      if (v > hi) hi = v;
      if (v < lo) lo = v;
    }
    const absmax = hi >= -lo ? hi : -lo; // never -0
    const scale = Math.fround(absmax / QMAX);
    scales[g] = scale;
    if (scale === 0) {
      codes.fill(0, start, end);
      continue;
    }
    const inv = 1 / scale;
    if (scale < MIN_NORMAL_F32) {
      // a subnormal scale has few significant bits: src * inv may pass 127.5, so clamp
      for (let i = start; i < end; i++) codes[i] = Math.max(-QMAX, Math.min(QMAX, Math.round(src[i] * inv)));
      continue;
    }
    for (let i = start; i < end; i++) {
      // |src[i] * inv| <= 127 * (1 + 2^-23), so t + 128.5 is in (1, 256): truncation is floor,
      // giving round-half-up into [-127, 127] with no clamp needed.
      codes[i] = ((src[i] * inv + 128.5) | 0) - 128;
    }
  }
}

/** Dequantizes `codes` with one scale per `groupSize` values into `dst`. No allocation. */
export function dequantizeInt8(scales: Float32Array, codes: Int8Array, groupSize: number, dst: Float32Array): void {
  const n = codes.length;
  const groups = groupCount(n, groupSize);
  if (scales.length !== groups) throw new RangeError(`dequantizeInt8: ${scales.length} scales for ${groups} groups`);
  if (dst.length !== n) throw new RangeError(`dequantizeInt8: dst has ${dst.length} values, codes ${n}`);
  for (let g = 0; g < groups; g++) {
    const start = g * groupSize;
    const end = Math.min(start + groupSize, n);
    const scale = scales[g];
    for (let i = start; i < end; i++) dst[i] = codes[i] * scale;
  }
}

/** Allocates buffers and quantizes `src` in groups of `groupSize`. */
export function quantize(src: Float32Array, groupSize: number): Int8Quantized {
  const scales = new Float32Array(groupCount(src.length, groupSize));
  const codes = new Int8Array(src.length);
  quantizeInt8(src, groupSize, scales, codes);
  return { scales, codes };
}

/** Allocates the output and dequantizes. */
export function dequantize(q: Int8Quantized, groupSize: number): Float32Array {
  const out = new Float32Array(q.codes.length);
  dequantizeInt8(q.scales, q.codes, groupSize, out);
  return out;
}

/** Index of the first scale that is negative, NaN, +-Infinity, or so large that 128 * scale overflows float32; or -1. */
export function findBadScale(scales: Float32Array): number {
  for (let i = 0; i < scales.length; i++) {
    const s = scales[i];
    if (!(s >= 0 && Math.fround(s * 128) < Infinity)) return i;
  }
  return -1;
}
