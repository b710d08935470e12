// The payload codecs of a tensor frame: how a Float32Array is laid out in the
// payload bytes (little-endian) and read back, with no per-element allocation.
//
//   f32         numel x float32
//   f16         numel x binary16 (round to nearest even, finite overflow saturates to +-65504)
//   int8-row    rows x float32 scale, then numel x int8; a row is the last dimension
//   int8-block  ceil(numel / blockSize) x float32 scale, then numel x int8

import { FrameError } from './errors.ts';
import { decodeF16, encodeF16, findNonFiniteF16 } from './fp16.ts';
import { dequantizeInt8, findBadScale, groupCount, quantizeInt8 } from './int8.ts';
import type { ErrorFeedback } from './error-feedback.ts';

/** How a frame's payload encodes its float32 values. */
export type Codec = 'f32' | 'f16' | 'int8-row' | 'int8-block';

/** Every codec this build reads and writes. */
export const CODECS: readonly Codec[] = ['f32', 'f16', 'int8-row', 'int8-block'];

/** Default block size of 'int8-block' (values per scale). */
export const DEFAULT_BLOCK_SIZE = 256;

/** Largest block size a frame may declare. */
export const MAX_BLOCK_SIZE = 1 << 20;

/** Whether `value` names a codec. */
export function isCodec(value: unknown): value is Codec {
  return typeof value === 'string' && (CODECS as readonly string[]).includes(value);
}

/** Values per scale of an int8 codec for `shape`: the last dim (rows) or the block size. */
export function groupSizeOf(codec: 'int8-row' | 'int8-block', shape: readonly number[], blockSize: number): number {
  if (codec === 'int8-block') return blockSize;
  const last = shape.length === 0 ? 1 : shape[shape.length - 1];
  return Math.max(1, last);
}

/** Payload bytes of `numel` values of `shape` under `codec`. */
export function payloadByteLength(codec: Codec, shape: readonly number[], numel: number, blockSize: number): number {
  switch (codec) {
    case 'f32':
      return numel * 4;
    case 'f16':
      return numel * 2;
    case 'int8-row':
    case 'int8-block':
      return groupCount(numel, groupSizeOf(codec, shape, blockSize)) * 4 + numel;
  }
}

/** Index of the first NaN or +-Infinity in `values`, or -1. */
export function findNonFinite(values: Float32Array): number {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v - v !== 0) return i;
  }
  return -1;
}

/**
 * Writes `data` into `payload` (exactly payloadByteLength bytes, 4-byte aligned).
 * Returns the number of values that saturated (f16 only). With `errorFeedback`
 * ('int8-block' only) quantizes data + residual and updates the residual.
 */
export function encodePayload(
  codec: Codec,
  data: Float32Array,
  shape: readonly number[],
  blockSize: number,
  payload: Uint8Array,
  errorFeedback?: ErrorFeedback,
): number {
  const n = data.length;
  const { buffer, byteOffset } = payload;
  switch (codec) {
    case 'f32':
      new Float32Array(buffer, byteOffset, n).set(data);
      return 0;
    case 'f16':
      return encodeF16(data, new Uint16Array(buffer, byteOffset, n));
    case 'int8-row':
    case 'int8-block': {
      const group = groupSizeOf(codec, shape, blockSize);
      const groups = groupCount(n, group);
      const scales = new Float32Array(buffer, byteOffset, groups);
      const codes = new Int8Array(buffer, byteOffset + groups * 4, n);
      if (errorFeedback) errorFeedback.compress(data, { scales, codes });
      else quantizeInt8(data, group, scales, codes);
      return 0;
    }
  }
}

/** `bytes` itself, or a copy at offset 0 when its offset is not a multiple of `align`. */
function aligned(bytes: Uint8Array, align: number): Uint8Array {
  return bytes.byteOffset % align === 0 ? bytes : bytes.slice();
}

/**
 * Reads `numel` float32 values from `payload` (already length-checked).
 * Throws FrameError 'non_finite' / 'bad_scale' for NaN, Infinity or negative scales.
 */
export function decodePayload(codec: Codec, payload: Uint8Array, shape: readonly number[], numel: number, blockSize: number): Float32Array {
  const out = new Float32Array(numel);
  switch (codec) {
    case 'f32': {
      new Uint8Array(out.buffer).set(payload);
      const bad = findNonFinite(out);
      if (bad >= 0) throw new FrameError('non_finite', `value ${bad} is ${out[bad]}`);
      return out;
    }
    case 'f16': {
      const p = aligned(payload, 2);
      const halves = new Uint16Array(p.buffer, p.byteOffset, numel);
      const bad = findNonFiniteF16(halves);
      if (bad >= 0) throw new FrameError('non_finite', `value ${bad} is a half NaN or Infinity (0x${halves[bad].toString(16)})`);
      decodeF16(halves, out);
      return out;
    }
    case 'int8-row':
    case 'int8-block': {
      const q = readInt8Payload(codec, payload, shape, numel, blockSize);
      dequantizeInt8(q.scales, q.codes, q.groupSize, out);
      return out;
    }
  }
}

/** An int8 payload read in place: one float32 scale per group of `groupSize` values, then the codes (value = code × its group's scale). */
export interface Int8Payload {
  scales: Float32Array;
  codes: Int8Array;
  groupSize: number;
}

/**
 * The scales and codes of an int8 payload (already length-checked) without
 * dequantizing: the codes are a view of `payload`, the scales one too when
 * aligned. Throws FrameError 'non_finite' / 'bad_scale' for a NaN, infinite,
 * negative or overflowing scale, as decodePayload does.
 */
export function readInt8Payload(codec: 'int8-row' | 'int8-block', payload: Uint8Array, shape: readonly number[], numel: number, blockSize: number): Int8Payload {
  const groupSize = groupSizeOf(codec, shape, blockSize);
  const groups = groupCount(numel, groupSize);
  const p = aligned(payload.subarray(0, groups * 4), 4);
  const scales = new Float32Array(p.buffer, p.byteOffset, groups);
  const bad = findBadScale(scales);
  if (bad >= 0) {
    const s = scales[bad];
    if (s < 0) throw new FrameError('bad_scale', `scale ${bad} is negative (${s})`);
    throw new FrameError('non_finite', `scale ${bad} is ${s}${Number.isFinite(s) ? ' (values would overflow float32)' : ''}`);
  }
  return { scales, codes: new Int8Array(payload.buffer, payload.byteOffset + groups * 4, numel), groupSize };
}
