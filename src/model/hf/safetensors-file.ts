// A safetensors file on disk, read one tensor at a time (Hugging Face's
// weights: F32, F16 or BF16): the header is read and checked whole when the
// file is opened (each tensor's dtype, shape and byte range; ranges that tile
// the data exactly; the file's real size), then a tensor's bytes are read
// only when asked for and converted to f32, so the memory a reader holds is
// about one tensor, never the model. The writer streams likewise: the header
// first, from the tensors' names and shapes, then each tensor's bytes as its
// values are produced.
import { closeSync, fstatSync, openSync, readSync, writeSync } from 'node:fs';
import { SafetensorsError } from '../safetensors.ts';
import { decodeFloats, dtypeBytes, encodeFloats, isFloatDtype, type FloatDtype } from './dtype.ts';

/** The largest header read (the format's own reference limit is 100 MB). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;
const MAX_RANK = 8;
/** The most values one tensor may hold: its f32 copy must be one typed array. */
export const MAX_TENSOR_VALUES = 2 ** 31 - 1;

export interface TensorEntry {
  readonly name: string;
  readonly dtype: FloatDtype;
  readonly shape: readonly number[];
  /** bytes [start, end) from the start of the data */
  readonly start: number;
  readonly end: number;
}

const numel = (shape: readonly number[]): number => shape.reduce((a, b) => a * b, 1);

/** A safetensors file opened for reading; close() when done. */
export class SafetensorsReader {
  private constructor(
    readonly path: string,
    private fd: number | null,
    private readonly dataStart: number,
    readonly entries: ReadonlyMap<string, TensorEntry>,
    readonly metadata: Readonly<Record<string, string>>,
  ) {}

  /** Opens and checks `path`'s header; throws SafetensorsError naming the file and what is wrong. */
  static open(path: string): SafetensorsReader {
    let fd: number;
    try {
      fd = openSync(path, 'r');
    } catch (err) {
      throw new SafetensorsError(`${path}: cannot open: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
    }
    try {
      const size = fstatSync(fd).size;
      const lenBytes = Buffer.alloc(8);
      if (size >= 8) readSync(fd, lenBytes, 0, 8, 0);
      const hl = safetensorsHeaderLength(lenBytes, size, path);
      const headerBytes = Buffer.alloc(hl);
      readSync(fd, headerBytes, 0, hl, 8);
      const { dataStart, entries, metadata } = parseSafetensorsHeader(headerBytes, size, path);
      return new SafetensorsReader(path, fd, dataStart, entries, metadata);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** The tensor `name` as f32 values (converted from its stored dtype). */
  read(name: string): Float32Array {
    const e = this.entry(name);
    const out = new Float32Array(numel(e.shape));
    decodeFloats(this.readBytes(name, 0, e.end - e.start), e.dtype, out);
    return out;
  }

  /** Bytes [from, to) of the tensor `name`'s data, as stored (no conversion): a tensor read in pieces. */
  readBytes(name: string, from: number, to: number): Buffer {
    const e = this.entry(name);
    if (this.fd === null) throw new Error(`${this.path}: closed`);
    if (!(Number.isSafeInteger(from) && Number.isSafeInteger(to) && from >= 0 && from <= to && to <= e.end - e.start)) throw new RangeError(`${name}: bytes [${from}, ${to}) are outside its ${e.end - e.start}`);
    const bytes = Buffer.allocUnsafe(to - from);
    let got = 0;
    while (got < bytes.length) {
      const n = readSync(this.fd, bytes, got, bytes.length - got, this.dataStart + e.start + from + got);
      if (n === 0) throw new SafetensorsError(`${this.path}: ${e.name} ends early: the file was truncated while being read`);
      got += n;
    }
    return bytes;
  }

  private entry(name: string): TensorEntry {
    const e = this.entries.get(name);
    if (!e) throw new SafetensorsError(`${this.path}: no tensor ${name}`);
    return e;
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

function writeAll(fd: number, bytes: Uint8Array): void {
  for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at);
}

/**
 * A tensor to write: its name, shape, and its values when the writer asks for
 * them, whole or (`chunks`, used when present) as consecutive pieces in
 * row-major order, so that a large tensor need never be in memory whole.
 */
export interface TensorToWrite {
  readonly name: string;
  readonly shape: readonly number[];
  values(): Float32Array;
  chunks?(): Iterable<Float32Array>;
}

/**
 * Writes `tensors` to `path` as `dtype`, in the given order, one tensor in
 * memory at a time. Returns the bytes written.
 */
export function writeSafetensorsFile(path: string, tensors: readonly TensorToWrite[], dtype: FloatDtype, metadata: Record<string, string> = {}): number {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    if (t.name in header) throw new SafetensorsError(`duplicate tensor name ${t.name}`);
    const bytes = numel(t.shape) * dtypeBytes(dtype);
    header[t.name] = { dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const fd = openSync(path, 'w');
  try {
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
    writeAll(fd, len);
    writeAll(fd, Buffer.from(json));
    for (const t of tensors) {
      let written = 0;
      for (const piece of t.chunks ? t.chunks() : [t.values()]) {
        written += piece.length;
        if (written > numel(t.shape)) break;
        writeAll(fd, encodeFloats(piece, dtype));
      }
      if (written !== numel(t.shape)) throw new SafetensorsError(`${t.name}: ${written} values do not fill shape [${t.shape}]`);
    }
  } finally {
    closeSync(fd);
  }
  return 8 + Buffer.byteLength(json) + offset;
}

/** A safetensors file's parsed header: where the data starts, its tensors and its metadata. */
export interface SafetensorsHeader {
  readonly dataStart: number;
  readonly entries: ReadonlyMap<string, TensorEntry>;
  readonly metadata: Readonly<Record<string, string>>;
}

/**
 * Checks the header's length word (the file's first 8 bytes) against the
 * file's size and returns the header's byte length.
 */
export function safetensorsHeaderLength(lenBytes: Uint8Array, size: number, what: string): number {
  if (size < 8 || lenBytes.length < 8) throw new SafetensorsError(`${what}: ${size} bytes: too short for a safetensors header`);
  const headerLen = new DataView(lenBytes.buffer, lenBytes.byteOffset, 8).getBigUint64(0, true);
  if (headerLen > BigInt(MAX_HEADER_BYTES)) throw new SafetensorsError(`${what}: header of ${headerLen} bytes is larger than ${MAX_HEADER_BYTES}`);
  if (headerLen > BigInt(size - 8)) throw new SafetensorsError(`${what}: header of ${headerLen} bytes runs past the end of the file (${size} bytes): truncated`);
  return Number(headerLen);
}

/**
 * Parses and checks the header of a safetensors file of `size` bytes (its
 * JSON, after the 8-byte length): each tensor's dtype, shape and byte range,
 * ranges that tile the data exactly. Throws a SafetensorsError naming `what`.
 */
export function parseSafetensorsHeader(headerBytes: Uint8Array, size: number, what: string): SafetensorsHeader {
  const fail = (problem: string): never => {
    throw new SafetensorsError(`${what}: ${problem}`);
  };
  const hl = headerBytes.length;
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(headerBytes));
  } catch {
    fail('header is not valid UTF-8 JSON');
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) fail('header is not a JSON object');
  const dataStart = 8 + hl;
  const dataLen = size - dataStart;
  const entries = new Map<string, TensorEntry>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (typeof raw !== 'object' || raw === null || Array.isArray(raw) || Object.values(raw).some((v) => typeof v !== 'string')) fail('__metadata__ must map strings to strings');
      metadata = raw as Record<string, string>;
      continue;
    }
    const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown } | null;
    if (typeof e !== 'object' || e === null) fail(`${name}: not a tensor entry`);
    if (!isFloatDtype(e!.dtype)) fail(`${name}: dtype ${JSON.stringify(e!.dtype)} is not supported (F32, F16 or BF16)`);
    const shape = e!.shape;
    if (!Array.isArray(shape) || shape.length > MAX_RANK || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) fail(`${name}: bad shape ${JSON.stringify(shape)}`);
    const count = numel(shape as number[]);
    if (count > MAX_TENSOR_VALUES) fail(`${name}: ${count} values, more than ${MAX_TENSOR_VALUES}`);
    const off = e!.data_offsets;
    if (!Array.isArray(off) || off.length !== 2 || !off.every((d) => Number.isSafeInteger(d) && d >= 0) || off[0] > off[1]) fail(`${name}: bad data_offsets`);
    const [start, end] = off as [number, number];
    if (end > dataLen) fail(`${name}: data [${start}, ${end}) runs past the end of the file (${dataLen} data bytes): truncated`);
    const dtype = e!.dtype as FloatDtype;
    if (end - start !== count * dtypeBytes(dtype)) fail(`${name}: ${end - start} bytes do not hold shape [${shape}] of ${dtype}`);
    entries.set(name, { name, dtype, shape: shape as number[], start, end });
  }
  const ranges = [...entries.values()].sort((a, b) => a.start - b.start || a.end - b.end);
  let cursor = 0;
  for (const r of ranges) {
    if (r.start !== cursor) fail(`${r.name}: data does not follow the previous tensor (gap or overlap at byte ${cursor})`);
    cursor = r.end;
  }
  if (cursor !== dataLen) fail(`${dataLen - cursor} bytes after the last tensor: corrupt or oversized file`);
  return { dataStart, entries, metadata };
}
