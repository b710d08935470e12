// A stage's inference weights from a model file read by byte ranges: the
// orchestrator's spot checks load a deployment's stage from the model store
// this way (./load.ts loads from bytes or from a file on disk). The whole file
// streams through once, a chunk at a time, so that its sha256 is checked
// against the id it is stored under (a file that rotted at rest must not
// become the reference honest miners are judged by); only the stage's own
// tensors are kept, each decoded to f32 and checked (shape, finite values) as
// soon as its last byte has gone by. Memory: the stage's f32 weights, one
// chunk, and the stored bytes of the tensors the current chunk cuts through,
// never the whole model (a quarter of a 1.1B model, not 2.2 GB).
import { createHash } from 'node:crypto';
import type { Engine } from '../engine/engine.ts';
import { checkpointInfo } from '../model/checkpoint.ts';
import { decodeFloats } from '../model/hf/dtype.ts';
import { parseSafetensorsHeader, safetensorsHeaderLength, type TensorEntry } from '../model/hf/safetensors-file.ts';
import type { StageRange } from '../model/parts.ts';
import { SafetensorsError } from '../model/safetensors.ts';
import { StageInference, stageParamLayout, type StageInferenceOptions } from './stage-inference.ts';

/** Bytes of a stored file, read by ranges. */
export interface RangeSource {
  /** the file's size in bytes */
  readonly size: number;
  /** bytes [start, end) (fewer only when the file is shorter than it claimed) */
  read(start: number, end: number): Promise<Uint8Array>;
}

/** Bytes read at once while streaming the file. */
export const RANGE_CHUNK_BYTES = 16 << 20;

/** A tensor being gathered from the chunks that cross it. */
interface Gathering {
  readonly entry: TensorEntry;
  /** where its values go in the stage's weights */
  readonly offset: number;
  /** absolute byte range in the file */
  readonly from: number;
  readonly to: number;
  bytes: Uint8Array | null;
}

export interface RangeLoadOptions {
  /** the sha256 the file must hash to (lowercase hex) */
  sha256: string;
  /** the parts to load (default: every part the file holds) */
  range?: StageRange;
  stage?: StageInferenceOptions;
  /** names the file in errors (default: `model <sha256 prefix>`) */
  what?: string;
  /** bytes read at once (default RANGE_CHUNK_BYTES) */
  chunkBytes?: number;
}

/**
 * The inference path of parts `range` of a Nimble GPT model file that must
 * hash to `sha256`, streamed from `source`. Rejects with a SafetensorsError
 * naming the file and the problem (format, config, missing parts or tensors,
 * shapes, non-finite values, a file shorter than its size, a hash that is not
 * `sha256`).
 */
export async function inferenceFromRanges(engine: Engine, source: RangeSource, o: RangeLoadOptions): Promise<StageInference> {
  const { sha256, range } = o;
  const what = o.what ?? `model ${sha256.slice(0, 12)}`;
  const chunkBytes = o.chunkBytes ?? RANGE_CHUNK_BYTES;
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 1) throw new RangeError(`chunkBytes ${chunkBytes} is not a positive integer`);
  const read = async (start: number, end: number): Promise<Uint8Array> => {
    const bytes = await source.read(start, end);
    if (bytes.length !== end - start) throw new SafetensorsError(`${what}: bytes [${start}, ${end}) end early: the file is shorter than its ${source.size} bytes`);
    return bytes;
  };
  const hl = safetensorsHeaderLength(source.size >= 8 ? await read(0, 8) : new Uint8Array(0), source.size, what);
  const header = parseSafetensorsHeader(await read(8, 8 + hl), source.size, what);
  const info = checkpointInfo({ tensors: new Map(), metadata: { ...header.metadata } });
  const want = range ?? { from: info.from, to: info.to };
  if (info.from > want.from || info.to < want.to) throw new SafetensorsError(`${what}: holds parts [${info.from}, ${info.to}), the stage needs [${want.from}, ${want.to})`);
  const layout = stageParamLayout(info.config, want);
  const pending: Gathering[] = layout.entries.map((e) => {
    const t = header.entries.get(e.name);
    if (!t) throw new SafetensorsError(`${what}: lacks ${e.name}`);
    if (t.shape.join(',') !== e.shape.join(',')) throw new SafetensorsError(`${what}: ${e.name}: shape [${t.shape}] in file, [${e.shape}] expected`);
    return { entry: t, offset: e.offset, from: header.dataStart + t.start, to: header.dataStart + t.end, bytes: null };
  }).sort((a, b) => a.from - b.from);

  const weights = new Float32Array(layout.size);
  const hash = createHash('sha256');
  let next = 0; // the first tensor not yet complete
  for (let at = 0; at < source.size; at += chunkBytes) {
    const end = Math.min(source.size, at + chunkBytes);
    const chunk = await read(at, end);
    hash.update(chunk);
    for (let i = next; i < pending.length && pending[i].from < end; i++) {
      const g = pending[i];
      if (g.to <= at) continue;
      g.bytes ??= new Uint8Array(g.to - g.from);
      const lo = Math.max(g.from, at);
      const hi = Math.min(g.to, end);
      g.bytes.set(chunk.subarray(lo - at, hi - at), lo - g.from);
      if (g.to <= end) finish(g, weights, what);
    }
    while (next < pending.length && pending[next].bytes === null && pending[next].to <= end) next++;
    // a turn of the event loop between chunks: the orchestrator keeps answering while a stage loads
    await new Promise((r) => setImmediate(r));
  }
  const digest = hash.digest('hex');
  if (digest !== sha256) throw new SafetensorsError(`${what}: its bytes hash to ${digest}, not the ${sha256} it is stored under: the stored file is corrupt`);
  return new StageInference(engine, info.config, want, weights, o.stage);
}

/** Decodes a gathered tensor into the stage's weights, checked finite, and lets its bytes go. */
function finish(g: Gathering, weights: Float32Array, what: string): void {
  const n = g.entry.shape.reduce((a, b) => a * b, 1);
  const values = weights.subarray(g.offset, g.offset + n);
  decodeFloats(g.bytes!, g.entry.dtype, values);
  for (let i = 0; i < n; i++) if (!Number.isFinite(values[i])) throw new SafetensorsError(`${what}: ${g.entry.name}: non-finite value at ${i}`);
  g.bytes = null;
}
