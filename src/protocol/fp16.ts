// float32 <-> float16 (IEEE 754 binary16) conversion over typed arrays.
//
// Encoding rounds to nearest, ties to even, and keeps subnormals. A finite
// float32 whose magnitude would round to Infinity in half precision
// (|x| >= 65520) SATURATES to +-65504 (the largest finite half) and is counted,
// so a value that was finite on the sender is finite on the receiver. NaN and
// +-Infinity are encoded as half NaN / +-Infinity (frames refuse them earlier).
// Decoding is a 64 Ki-entry lookup table of float32 bit patterns.

/** Largest finite float16 value. */
export const F16_MAX = 65504;

/** float32 bit pattern of 65520: the smallest magnitude that rounds to half Infinity. */
const F16_OVERFLOW_BITS = 0x477ff000;
/** float32 bit pattern of 2^-14, the smallest normal half. */
const F16_MIN_NORMAL_BITS = 0x38800000;
/** Adding 0.5 (2^-1) to a value < 2^-14 leaves its subnormal half mantissa, correctly rounded, in the low bits. */
const DENORM_MAGIC = 0.5;
const DENORM_MAGIC_BITS = 0x3f000000;

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

/**
 * Half bits of one float32 given by its bit pattern, round to nearest even.
 * Finite values that would overflow saturate to +-65504.
 */
export function f32BitsToF16(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const abs = bits & 0x7fffffff;
  if (abs >= F16_OVERFLOW_BITS) {
    if (abs > 0x7f800000) return sign | 0x7e00; // NaN
    if (abs === 0x7f800000) return sign | 0x7c00; // Infinity
    return sign | 0x7bff; // saturate
  }
  if (abs < F16_MIN_NORMAL_BITS) {
    // Subnormal or zero: let the FPU round, the half mantissa ends up in the low bits.
    scratchU32[0] = abs;
    scratchF32[0] = scratchF32[0] + DENORM_MAGIC;
    return sign | (scratchU32[0] - DENORM_MAGIC_BITS);
  }
  const mantOdd = (abs >>> 13) & 1;
  // rebias exponent (127 -> 15) and add the rounding bias (0xfff + odd bit: ties to even)
  return sign | ((abs - 0x38000000 + 0xfff + mantOdd) >>> 13);
}

/** Half bits of a float32 value. */
export function f32ToF16(value: number): number {
  scratchF32[0] = value;
  return f32BitsToF16(scratchU32[0]);
}

let decodeTable: Uint32Array | undefined;

/** float32 bit pattern of every half, built once on first use (256 KiB). */
function table(): Uint32Array {
  if (decodeTable) return decodeTable;
  const t = new Uint32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const exp = (h >>> 10) & 0x1f;
    const mant = h & 0x3ff;
    if (exp === 0x1f) {
      t[h] = sign | 0x7f800000 | (mant << 13); // Inf / NaN
    } else if (exp !== 0) {
      t[h] = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant === 0) {
      t[h] = sign;
    } else {
      // subnormal half: mant * 2^-24, exact in float32
      scratchF32[0] = mant * 5.960464477539063e-8;
      t[h] = sign | scratchU32[0];
    }
  }
  decodeTable = t;
  return t;
}

/** float32 value of half bits. */
export function f16ToF32(half: number): number {
  scratchU32[0] = table()[half & 0xffff];
  return scratchF32[0];
}

/**
 * Encodes `src` into `dst` (same length) as half bits. Returns how many finite
 * values saturated to +-65504.
 */
export function encodeF16(src: Float32Array, dst: Uint16Array): number {
  const n = src.length;
  if (dst.length !== n) throw new RangeError(`encodeF16: dst has ${dst.length} elements, src ${n}`);
  const bits = new Uint32Array(src.buffer, src.byteOffset, n);
  let saturated = 0;
  for (let i = 0; i < n; i++) {
    const b = bits[i];
    const abs = b & 0x7fffffff;
    // fast path: normal range, no overflow
    if (abs >= F16_MIN_NORMAL_BITS && abs < F16_OVERFLOW_BITS) {
      dst[i] = ((b >>> 16) & 0x8000) | ((abs - 0x38000000 + 0xfff + ((abs >>> 13) & 1)) >>> 13);
    } else {
      const h = f32BitsToF16(b);
      if ((h & 0x7fff) === 0x7bff && abs < 0x7f800000 && abs >= F16_OVERFLOW_BITS) saturated++;
      dst[i] = h;
    }
  }
  return saturated;
}

/** Decodes half bits `src` into `dst` (same length). */
export function decodeF16(src: Uint16Array, dst: Float32Array): void {
  const n = src.length;
  if (dst.length !== n) throw new RangeError(`decodeF16: dst has ${dst.length} elements, src ${n}`);
  const t = table();
  const out = new Uint32Array(dst.buffer, dst.byteOffset, n);
  for (let i = 0; i < n; i++) out[i] = t[src[i]];
}

/** Index of the first half that is NaN or +-Infinity, or -1. */
export function findNonFiniteF16(src: Uint16Array): number {
  for (let i = 0; i < src.length; i++) if ((src[i] & 0x7c00) === 0x7c00) return i;
  return -1;
}
