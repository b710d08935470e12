// The safetensors format: 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and [start, end) byte range, then the
// little-endian data. We write F32 tensors and a string metadata map, and read
// F32, F16 and BF16 tensors (widened to f32, exactly: ./hf/dtype.ts).
import { NimbleError } from '../protocol/errors.ts';
import { decodeFloats, dtypeBytes, isFloatDtype } from './hf/dtype.ts';

export interface NamedTensor {
  name: string;
  shape: number[];
  data: Float32Array;
}

export interface SafetensorsFile {
  tensors: Map<string, NamedTensor>;
  metadata: Record<string, string>;
}

/** A checkpoint file that cannot be read or does not fit: 400 when it came from a peer. */
export class SafetensorsError extends NimbleError {
  override readonly name = 'SafetensorsError';

  constructor(message: string) {
    super('bad_checkpoint', message, 400);
  }
}

const MAX_HEADER = 100 * 1024 * 1024;
/** Dimensions of a tensor, and the largest one: a model's tensors are matrices and vectors. */
const MAX_RANK = 8;
const MAX_DIM = 2 ** 31 - 1;

/** Serialises tensors (in the given order) with optional string metadata. */
export function encodeSafetensors(tensors: readonly NamedTensor[], metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) throw new SafetensorsError(`${t.name}: shape [${t.shape}] does not hold ${t.data.length} values`);
    if (t.name in header) throw new SafetensorsError(`duplicate tensor name ${t.name}`);
    header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + count * 4] };
    offset += count * 4;
  }
  let json = JSON.stringify(header);
  // pad the header with spaces so the data starts 8-byte aligned
  const pad = (8 - ((8 + Buffer.byteLength(json)) % 8)) % 8;
  json += ' '.repeat(pad);
  const headerBytes = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + headerBytes.length + offset);
  const dv = new DataView(out.buffer);
  dv.setBigUint64(0, BigInt(headerBytes.length), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const t of tensors) {
    const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    out.set(bytes, at);
    at += bytes.length;
  }
  return out;
}

/** Parses and validates a safetensors file of F32, F16 or BF16 tensors (read as f32). Throws SafetensorsError on anything malformed. */
export function decodeSafetensors(bytes: Uint8Array): SafetensorsFile {
  if (bytes.length < 8) throw new SafetensorsError(`file is ${bytes.length} bytes: too short for a safetensors header`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLen = dv.getBigUint64(0, true);
  if (headerLen > BigInt(Math.min(MAX_HEADER, bytes.length - 8))) {
    throw new SafetensorsError(`header length ${headerLen} exceeds the file (${bytes.length} bytes): truncated or corrupt`);
  }
  const hl = Number(headerLen);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(8, 8 + hl)));
  } catch {
    throw new SafetensorsError('header is not valid UTF-8 JSON');
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) throw new SafetensorsError('header is not a JSON object');
  const dataStart = 8 + hl;
  const dataLen = bytes.length - dataStart;
  const tensors = new Map<string, NamedTensor>();
  let metadata: Record<string, string> = {};
  const ranges: [number, number, string][] = [];
  for (const [name, entry] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (typeof entry !== 'object' || entry === null || Object.values(entry).some((v) => typeof v !== 'string')) {
        throw new SafetensorsError('__metadata__ must map strings to strings');
      }
      metadata = entry as Record<string, string>;
      continue;
    }
    const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const dtype = e?.dtype;
    if (!isFloatDtype(dtype)) throw new SafetensorsError(`${name}: dtype ${String(dtype).slice(0, 16)} is not supported (F32, F16 or BF16)`);
    if (!Array.isArray(e.shape) || e.shape.length > MAX_RANK || !e.shape.every((d) => Number.isSafeInteger(d) && d >= 0 && d <= MAX_DIM)) {
      throw new SafetensorsError(`${name}: bad shape (at most ${MAX_RANK} dimensions of 0 … ${MAX_DIM})`);
    }
    const off = e.data_offsets;
    if (!Array.isArray(off) || off.length !== 2 || !off.every((d) => Number.isSafeInteger(d) && d >= 0) || off[0] > off[1]) {
      throw new SafetensorsError(`${name}: bad data_offsets`);
    }
    const [start, end] = off as [number, number];
    if (end > dataLen) throw new SafetensorsError(`${name}: data [${start}, ${end}) runs past the end of the file: truncated`);
    const count = (e.shape as number[]).reduce((a, b) => a * b, 1);
    if (end - start !== count * dtypeBytes(dtype)) throw new SafetensorsError(`${name}: ${end - start} bytes do not match shape [${e.shape}] of ${dtype}`);
    const data = new Float32Array(count);
    if (dtype === 'F32') new Uint8Array(data.buffer).set(bytes.subarray(dataStart + start, dataStart + end));
    else decodeFloats(bytes.subarray(dataStart + start, dataStart + end), dtype, data);
    tensors.set(name, { name, shape: e.shape as number[], data });
    ranges.push([start, end, name]);
  }
  ranges.sort((a, b) => a[0] - b[0]);
  let cursor = 0;
  for (const [start, end, name] of ranges) {
    if (start !== cursor) throw new SafetensorsError(`${name}: data does not follow the previous tensor (gap or overlap)`);
    cursor = end;
  }
  if (cursor !== dataLen) throw new SafetensorsError(`${dataLen - cursor} bytes after the last tensor: corrupt file`);
  return { tensors, metadata };
}
