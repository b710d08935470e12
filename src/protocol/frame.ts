// Tensor frames: the binary message that carries one float32 tensor between
// miners and the orchestrator (activations, gradients, pseudo-gradients).
//
//   offset  size  field
//   0       4     magic "NIMF" (0x4e 0x49 0x4d 0x46)
//   4       1     version (1)
//   5       3     reserved, zero
//   8       4     header length H, uint32 little-endian (JSON bytes incl. trailing space padding)
//   12      H     header: UTF-8 JSON {sha256, dtype, codec, shape, byteLength, blockSize?, meta?},
//                 padded with spaces so the payload starts at a multiple of 8
//   12+H    L     payload, L = header.byteLength bytes, little-endian (see codec.ts)
//
// The frame is exactly 12 + H + L bytes. Decoding validates everything a peer
// could get wrong before touching the values, and throws FrameError.

import { createHash } from 'node:crypto';
import { FrameError } from './errors.ts';
import { CODECS, DEFAULT_BLOCK_SIZE, MAX_BLOCK_SIZE, decodePayload, encodePayload, findNonFinite, isCodec, payloadByteLength, readInt8Payload, type Codec, type Int8Payload } from './codec.ts';
import type { ErrorFeedback } from './error-feedback.ts';

/** Small JSON metadata carried in a frame header (run id, stage, microbatch id, ...). */
export type FrameMeta = { [key: string]: JsonValue };
/** A JSON value. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** The JSON header of a frame, as written. */
export interface FrameHeader {
  sha256: string;
  dtype: 'f32';
  codec: Codec;
  shape: number[];
  byteLength: number;
  blockSize?: number;
  meta?: FrameMeta;
}

/** A decoded frame. */
export interface DecodedFrame {
  data: Float32Array;
  shape: number[];
  codec: Codec;
  meta: FrameMeta;
  /** Block size of an 'int8-block' frame. */
  blockSize?: number;
}

/** Limits and expectations a receiver applies when decoding. */
export interface FrameExpect {
  /** Expected shape; -1 matches any size in that dimension. */
  shape?: readonly number[];
  /** Largest accepted frame in bytes (default 256 MiB). */
  maxBytes?: number;
  /** Accepted codecs (default all). */
  codecs?: readonly Codec[];
  /** Largest accepted element count (default 2^26). */
  maxElements?: number;
}

/** Options of encodeFrame. */
export interface EncodeOptions {
  /** Values per scale for 'int8-block' (default 256). */
  blockSize?: number;
  /** 'int8-block' only: quantize data + residual and keep the new residual. */
  errorFeedback?: ErrorFeedback;
}

export const FRAME_MAGIC = 'NIMF';
export const FRAME_VERSION = 1;
/** Bytes before the header. */
export const PREFIX_BYTES = 12;
/** Largest header (JSON incl. padding). */
export const MAX_HEADER_BYTES = 16 * 1024;
/** Largest meta object, as JSON. */
export const MAX_META_BYTES = 4 * 1024;
/** Largest tensor rank. */
export const MAX_RANK = 8;
export const DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024;
export const DEFAULT_MAX_ELEMENTS = 1 << 26;

const MAGIC_BYTES = [0x4e, 0x49, 0x4d, 0x46];
const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const SHA256_HEX = /^[0-9a-f]{64}$/;

function assertLittleEndianHost(): void {
  if (!LITTLE_ENDIAN_HOST) throw new Error('tensor frames need a little-endian host');
}

/** Checks a shape and returns its element count; FrameError 'bad_shape' or 'too_large'. */
export function checkShape(shape: unknown, maxElements: number = DEFAULT_MAX_ELEMENTS): number {
  if (!Array.isArray(shape)) throw new FrameError('bad_shape', 'shape is not an array');
  if (shape.length > MAX_RANK) throw new FrameError('bad_shape', `rank ${shape.length} exceeds ${MAX_RANK}`);
  let n = 1;
  for (const d of shape) {
    if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 0) throw new FrameError('bad_shape', `dimension ${JSON.stringify(d)} is not a non-negative integer`);
    // a dimension alone past the element limit is refused even when another is 0 (the tensor is empty, the shape absurd)
    if (d > maxElements) throw new FrameError('too_large', `dimension ${d} of shape [${shape.join(', ')}] exceeds ${maxElements} elements`);
    n *= d;
    if (n > maxElements) throw new FrameError('too_large', `shape [${shape.join(', ')}] has more than ${maxElements} elements`);
  }
  return n;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function checkMeta(meta: unknown): FrameMeta {
  if (meta === undefined) return {};
  if (!isPlainObject(meta)) throw new FrameError('bad_header', 'meta is not a JSON object');
  const size = Buffer.byteLength(JSON.stringify(meta));
  if (size > MAX_META_BYTES) throw new FrameError('too_large', `meta is ${size} bytes, limit ${MAX_META_BYTES}`);
  return meta as FrameMeta;
}

function checkBlockSize(blockSize: unknown): number {
  if (typeof blockSize !== 'number' || !Number.isInteger(blockSize) || blockSize < 1 || blockSize > MAX_BLOCK_SIZE) {
    throw new FrameError('bad_codec', `int8-block needs an integer blockSize in [1, ${MAX_BLOCK_SIZE}], got ${JSON.stringify(blockSize)}`);
  }
  return blockSize;
}

/** sha256 of `bytes` as lowercase hex. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/**
 * Encodes a float32 tensor as a frame. Throws FrameError for a shape that does
 * not match the data ('shape_mismatch'), NaN/Infinity in the data ('non_finite'),
 * or oversized meta/shape ('too_large').
 */
export function encodeFrame(tensor: Float32Array, shape: readonly number[], codec: Codec, meta?: FrameMeta, options: EncodeOptions = {}): Uint8Array {
  assertLittleEndianHost();
  if (!isCodec(codec)) throw new FrameError('bad_codec', `unknown codec ${JSON.stringify(codec)}; known: ${CODECS.join(', ')}`);
  const numel = checkShape(shape, Number.MAX_SAFE_INTEGER);
  if (numel !== tensor.length) throw new FrameError('shape_mismatch', `shape [${shape.join(', ')}] has ${numel} elements, tensor ${tensor.length}`);
  const bad = findNonFinite(tensor);
  if (bad >= 0) throw new FrameError('non_finite', `value ${bad} is ${tensor[bad]}`);
  const blockSize = codec === 'int8-block' ? checkBlockSize(options.blockSize ?? options.errorFeedback?.blockSize ?? DEFAULT_BLOCK_SIZE) : undefined;
  const ef = options.errorFeedback;
  if (ef && (codec !== 'int8-block' || ef.blockSize !== blockSize || ef.size !== numel)) {
    throw new FrameError('bad_codec', 'errorFeedback needs codec int8-block with the same block size and length');
  }
  const byteLength = payloadByteLength(codec, shape, numel, blockSize ?? 1);
  const header: FrameHeader = { sha256: '0'.repeat(64), dtype: 'f32', codec, shape: [...shape], byteLength };
  if (blockSize !== undefined) header.blockSize = blockSize;
  const m = checkMeta(meta);
  if (meta !== undefined) header.meta = m;

  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const headerLength = json.length + ((8 - ((PREFIX_BYTES + json.length) % 8)) % 8);
  if (headerLength > MAX_HEADER_BYTES) throw new FrameError('too_large', `header is ${headerLength} bytes, limit ${MAX_HEADER_BYTES}`);
  const payloadOffset = PREFIX_BYTES + headerLength;
  const frame = new Uint8Array(payloadOffset + byteLength);
  frame.set(MAGIC_BYTES, 0);
  frame[4] = FRAME_VERSION;
  new DataView(frame.buffer).setUint32(8, headerLength, true);
  frame.set(json, PREFIX_BYTES);
  frame.fill(0x20, PREFIX_BYTES + json.length, payloadOffset);
  const payload = frame.subarray(payloadOffset);
  encodePayload(codec, tensor, shape, blockSize ?? 1, payload, ef);
  // sha256 is the first header field: overwrite the placeholder `{"sha256":"000...`
  frame.set(Buffer.from(sha256Hex(payload), 'latin1'), PREFIX_BYTES + '{"sha256":"'.length);
  return frame;
}

/** A validated header plus where its payload starts. */
export interface ParsedHeader {
  header: FrameHeader;
  numel: number;
  payloadOffset: number;
}

/**
 * Reads and validates the prefix and header of a frame without touching the
 * payload (a server can route on meta before decoding). Checks limits, codec,
 * dtype, shape, and that the byte count matches exactly.
 */
export function readFrameHeader(bytes: Uint8Array, expect: FrameExpect = {}): ParsedHeader {
  const maxBytes = expect.maxBytes ?? DEFAULT_MAX_FRAME_BYTES;
  if (bytes.length > maxBytes) throw new FrameError('too_large', `frame is ${bytes.length} bytes, limit ${maxBytes}`);
  for (let i = 0; i < 4 && i < bytes.length; i++) {
    if (bytes[i] !== MAGIC_BYTES[i]) throw new FrameError('bad_magic', `frame does not start with "${FRAME_MAGIC}"`);
  }
  if (bytes.length < PREFIX_BYTES) throw new FrameError('truncated', `frame is ${bytes.length} bytes, the prefix alone is ${PREFIX_BYTES}`);
  if (bytes[4] !== FRAME_VERSION) throw new FrameError('bad_version', `frame version ${bytes[4]}, this build reads ${FRAME_VERSION}`);
  const headerLength = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(8, true);
  if (headerLength > MAX_HEADER_BYTES) throw new FrameError('too_large', `header is ${headerLength} bytes, limit ${MAX_HEADER_BYTES}`);
  const payloadOffset = PREFIX_BYTES + headerLength;
  if (bytes.length < payloadOffset) throw new FrameError('truncated', `frame is ${bytes.length} bytes, header ends at ${payloadOffset}`);

  let raw: unknown;
  try {
    raw = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + PREFIX_BYTES, headerLength).toString('utf8'));
  } catch (e) {
    throw new FrameError('bad_header', `header is not JSON (${(e as Error).message})`);
  }
  if (!isPlainObject(raw)) throw new FrameError('bad_header', 'header is not a JSON object');
  if (raw.dtype !== 'f32') throw new FrameError('bad_dtype', `dtype ${JSON.stringify(raw.dtype)}, expected "f32"`);
  if (!isCodec(raw.codec)) throw new FrameError('bad_codec', `unknown codec ${JSON.stringify(raw.codec)}; known: ${CODECS.join(', ')}`);
  const codec = raw.codec;
  if (expect.codecs && !expect.codecs.includes(codec)) throw new FrameError('bad_codec', `codec ${codec} not accepted here; accepted: ${expect.codecs.join(', ')}`);
  const blockSize = codec === 'int8-block' ? checkBlockSize(raw.blockSize) : undefined;
  const numel = checkShape(raw.shape, expect.maxElements ?? DEFAULT_MAX_ELEMENTS);
  const shape = raw.shape as number[];
  if (expect.shape) {
    const want = expect.shape;
    if (want.length !== shape.length || want.some((d, i) => d !== -1 && d !== shape[i])) {
      throw new FrameError('shape_mismatch', `shape [${shape.join(', ')}], expected [${want.join(', ')}]`);
    }
  }
  if (typeof raw.sha256 !== 'string' || !SHA256_HEX.test(raw.sha256)) throw new FrameError('bad_header', 'sha256 is not 64 lowercase hex digits');
  const meta = checkMeta(raw.meta);
  const byteLength = payloadByteLength(codec, shape, numel, blockSize ?? 1);
  if (raw.byteLength !== byteLength) {
    throw new FrameError('length_mismatch', `header byteLength ${JSON.stringify(raw.byteLength)}, but ${codec} [${shape.join(', ')}] takes ${byteLength}`);
  }
  const total = payloadOffset + byteLength;
  if (bytes.length < total) throw new FrameError('truncated', `frame is ${bytes.length} bytes, header announces ${total}`);
  if (bytes.length > total) throw new FrameError('length_mismatch', `frame is ${bytes.length} bytes, header announces ${total}`);
  const header: FrameHeader = { sha256: raw.sha256, dtype: 'f32', codec, shape, byteLength, meta };
  if (blockSize !== undefined) header.blockSize = blockSize;
  return { header, numel, payloadOffset };
}

/**
 * Decodes and fully validates a frame: limits, header, exact length, sha256,
 * finite values. Throws FrameError; `error.status` is 413 or 400.
 */
export function decodeFrame(bytes: Uint8Array, expect: FrameExpect = {}): DecodedFrame {
  const { header, numel, payload } = checkedPayload(bytes, expect);
  const data = decodePayload(header.codec, payload, header.shape, numel, header.blockSize ?? 1);
  const out: DecodedFrame = { data, shape: header.shape, codec: header.codec, meta: header.meta ?? {} };
  if (header.blockSize !== undefined) out.blockSize = header.blockSize;
  return out;
}

/** An int8 frame validated as decodeFrame does, its values left quantized (codes and scales, views of the frame's bytes). */
export interface DecodedInt8Frame extends Int8Payload {
  shape: number[];
  codec: 'int8-row' | 'int8-block';
  meta: FrameMeta;
}

/**
 * Validates an int8 frame as decodeFrame does (limits, header, exact length,
 * sha256, scales) without dequantizing it: a check that reads every value
 * once reads them from the codes, without a float32 copy of the tensor.
 */
export function decodeFrameInt8(bytes: Uint8Array, expect: FrameExpect = {}): DecodedInt8Frame {
  const { header, numel, payload } = checkedPayload(bytes, expect);
  const codec = header.codec;
  if (codec !== 'int8-row' && codec !== 'int8-block') throw new FrameError('bad_codec', `codec ${codec}, expected an int8 codec`);
  return { ...readInt8Payload(codec, payload, header.shape, numel, header.blockSize ?? 1), shape: header.shape, codec, meta: header.meta ?? {} };
}

/** The frame's header and its payload, whose sha256 is the header's. */
function checkedPayload(bytes: Uint8Array, expect: FrameExpect): { header: FrameHeader; numel: number; payload: Uint8Array } {
  assertLittleEndianHost();
  const { header, numel, payloadOffset } = readFrameHeader(bytes, expect);
  const payload = bytes.subarray(payloadOffset);
  const digest = sha256Hex(payload);
  if (digest !== header.sha256) throw new FrameError('checksum', `payload sha256 ${digest}, header says ${header.sha256}`);
  return { header, numel, payload };
}
