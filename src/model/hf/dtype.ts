// The floating-point types of Hugging Face weights (safetensors' dtype names)
// and their conversion to and from the engine's f32. F16 is IEEE half
// precision; BF16 is the upper 16 bits of an f32. Reading is exact (every F16
// and BF16 value is an f32); writing rounds to nearest, ties to even, as
// PyTorch's `.to(torch.bfloat16)` and `.half()` do.

export type FloatDtype = 'F32' | 'F16' | 'BF16';
export const FLOAT_DTYPES: readonly FloatDtype[] = ['F32', 'F16', 'BF16'];

export const dtypeBytes = (d: FloatDtype): number => (d === 'F32' ? 4 : 2);

export const isFloatDtype = (d: unknown): d is FloatDtype => typeof d === 'string' && (FLOAT_DTYPES as readonly string[]).includes(d);

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** One IEEE half's bits to its f32 value. */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** An f32 value to IEEE half bits, rounded to nearest even (overflow to ±Inf, NaN kept). */
export function floatToHalf(v: number): number {
  f32[0] = v;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let m = mant >>> shift;
    if (rest > half || (rest === half && m & 1)) m++;
    return sign | m;
  }
  const rest = mant & 0x1fff;
  let m = mant >>> 13;
  if (rest > 0x1000 || (rest === 0x1000 && m & 1)) {
    m++;
    if (m === 0x400) {
      m = 0;
      e++;
      if (e >= 0x1f) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | m;
}

/** An f32 value to bfloat16 bits, rounded to nearest even (NaN kept quiet). */
export function floatToBf16(v: number): number {
  f32[0] = v;
  const x = u32[0];
  if ((x & 0x7f800000) === 0x7f800000 && x & 0x7fffff) return ((x >>> 16) | 0x40) & 0xffff;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Little-endian bytes of `count` values of `dtype` into `out` (f32). */
export function decodeFloats(bytes: Uint8Array, dtype: FloatDtype, out: Float32Array): void {
  const n = out.length;
  if (bytes.length !== n * dtypeBytes(dtype)) throw new RangeError(`${bytes.length} bytes are not ${n} ${dtype} values`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'F32') {
    for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
  } else if (dtype === 'BF16') {
    const bits = new Uint32Array(out.buffer, out.byteOffset, n);
    for (let i = 0; i < n; i++) bits[i] = dv.getUint16(2 * i, true) << 16;
  } else {
    for (let i = 0; i < n; i++) out[i] = halfToFloat(dv.getUint16(2 * i, true));
  }
}

/** The value at element `index` of little-endian `dtype` values viewed by `view` (for gathers that do not decode a whole tensor). */
export function floatAt(view: DataView, dtype: FloatDtype, index: number): number {
  if (dtype === 'F32') return view.getFloat32(4 * index, true);
  if (dtype === 'BF16') {
    u32[0] = view.getUint16(2 * index, true) << 16;
    return f32[0];
  }
  return halfToFloat(view.getUint16(2 * index, true));
}

/** f32 values to little-endian bytes of `dtype`. */
export function encodeFloats(values: Float32Array, dtype: FloatDtype): Uint8Array {
  const n = values.length;
  const out = new Uint8Array(n * dtypeBytes(dtype));
  const dv = new DataView(out.buffer);
  if (dtype === 'F32') for (let i = 0; i < n; i++) dv.setFloat32(4 * i, values[i], true);
  else if (dtype === 'BF16') for (let i = 0; i < n; i++) dv.setUint16(2 * i, floatToBf16(values[i]), true);
  else for (let i = 0; i < n; i++) dv.setUint16(2 * i, floatToHalf(values[i]), true);
  return out;
}
