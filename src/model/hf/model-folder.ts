// A Hugging Face model folder on disk, opened for import: `config.json` (the
// decoder, ./decoder-config.ts), the weights (`model.safetensors`, or shards
// named by `model.safetensors.index.json`), and the tokenizer files
// (`tokenizer.json`, `tokenizer_config.json`, `generation_config.json` when
// present). Opening reads every header and checks the whole tensor set
// against the config (./hf-tensors.ts) before a single weight is read; then
// tensors are read one at a time, or in rows (./safetensors-file.ts). Every problem is
// one line naming the file.
import { existsSync, readFileSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { SafetensorsError } from '../safetensors.ts';
import { decoderConfigFromHf, ModelFolderError, type DecoderConfig } from './decoder-config.ts';
import { canonicalTensorName, checkTensorSet, isBufferTensor } from './hf-tensors.ts';
import { decodeFloats, dtypeBytes, type FloatDtype } from './dtype.ts';
import { SafetensorsReader, type TensorEntry } from './safetensors-file.ts';

/** The largest JSON file of a folder read (tokenizer.json of a 150k vocabulary is about 11 MB). */
const JSON_LIMITS: Record<string, number> = {
  'config.json': 1 << 20,
  'generation_config.json': 1 << 20,
  'tokenizer_config.json': 16 << 20,
  'tokenizer.json': 64 << 20,
  'model.safetensors.index.json': 32 << 20,
};

export const INDEX_FILE = 'model.safetensors.index.json';
export const SINGLE_FILE = 'model.safetensors';

/** Reads and parses a folder's JSON file within its size limit; null when absent and optional. */
export function readFolderJson(dir: string, file: string, optional: boolean): unknown {
  const path = join(dir, file);
  if (!existsSync(path)) {
    if (optional) return null;
    throw new ModelFolderError(`${file}: missing from ${dir}`);
  }
  const size = statSync(path).size;
  const limit = JSON_LIMITS[file] ?? 1 << 20;
  if (size > limit) throw new ModelFolderError(`${file}: ${size} bytes, more than the ${limit} a model folder's ${file} may have`);
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    throw new ModelFolderError(`${file}: not valid JSON (${(err as Error).message})`);
  }
}

/** The safetensors files of a folder: the index's shards, else the single file. */
function weightFiles(dir: string): { files: string[]; declared: Map<string, string> | null } {
  const index = readFolderJson(dir, INDEX_FILE, true);
  if (index === null) {
    if (!existsSync(join(dir, SINGLE_FILE))) throw new ModelFolderError(`no weights in ${dir}: neither ${SINGLE_FILE} nor ${INDEX_FILE}`);
    return { files: [SINGLE_FILE], declared: null };
  }
  const map = (index as { weight_map?: unknown }).weight_map;
  if (typeof map !== 'object' || map === null || Array.isArray(map)) throw new ModelFolderError(`${INDEX_FILE}: weight_map must map tensor names to files`);
  const declared = new Map<string, string>();
  for (const [name, file] of Object.entries(map)) {
    if (typeof file !== 'string' || file !== basename(file) || !file.endsWith('.safetensors') || file.startsWith('.')) {
      throw new ModelFolderError(`${INDEX_FILE}: ${name} names ${JSON.stringify(file)}, not a .safetensors file in the folder`);
    }
    declared.set(name, file);
  }
  return { files: [...new Set(declared.values())].sort(), declared };
}

/** A stored tensor's undecoded bytes (ModelFolder.readStored). */
export interface StoredTensor {
  readonly file: string;
  readonly name: string;
  readonly dtype: FloatDtype;
  readonly shape: readonly number[];
  readonly view: DataView;
}

/** The error of a NaN or Inf weight: the file, the tensor, the element. */
export function nonFinite(file: string, name: string, index: number): ModelFolderError {
  return new ModelFolderError(`${file}: ${name} holds a non-finite value at ${index}`);
}

interface Located {
  readonly reader: SafetensorsReader;
  readonly entry: TensorEntry;
}

/** A model folder whose config and tensor set passed every check. */
export class ModelFolder {
  private constructor(
    readonly dir: string,
    readonly config: DecoderConfig,
    /** config.json as read: what an export writes back */
    readonly hfConfig: Readonly<Record<string, unknown>>,
    private readonly tensors: ReadonlyMap<string, Located>,
    private readonly readers: readonly SafetensorsReader[],
  ) {}

  static open(dir: string): ModelFolder {
    if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new ModelFolderError(`${dir}: not a folder`);
    const hfConfig = readFolderJson(dir, 'config.json', false) as Record<string, unknown>;
    const config = decoderConfigFromHf(hfConfig);
    const { files, declared } = weightFiles(dir);
    const readers: SafetensorsReader[] = [];
    try {
      const tensors = new Map<string, Located>();
      for (const file of files) {
        let reader: SafetensorsReader;
        try {
          reader = SafetensorsReader.open(join(dir, file));
        } catch (err) {
          if (err instanceof SafetensorsError) throw new ModelFolderError(`${file}: ${err.message.replace(`${join(dir, file)}: `, '')}`);
          throw err;
        }
        readers.push(reader);
        for (const entry of reader.entries.values()) {
          if (declared && declared.get(entry.name) !== file) throw new ModelFolderError(`${file}: holds ${entry.name}, which ${INDEX_FILE} puts ${declared.has(entry.name) ? `in ${declared.get(entry.name)}` : 'nowhere'}`);
          const name = canonicalTensorName(config, entry.name);
          if (tensors.has(name)) throw new ModelFolderError(`${file}: ${name} is stored twice`);
          tensors.set(name, { reader, entry });
        }
      }
      if (declared) for (const [name, file] of declared) if (!tensors.has(canonicalTensorName(config, name))) throw new ModelFolderError(`${INDEX_FILE}: ${name} is not in ${file}`);
      const problems = checkTensorSet(config, new Map([...tensors].map(([n, t]) => [n, t.entry.shape])));
      const lines = [
        ...problems.missing.slice(0, 3).map((n) => `missing tensor ${n}`),
        ...problems.misshapen.slice(0, 3),
        ...problems.unexpected.slice(0, 3).map((n) => `unexpected tensor ${n}`),
      ];
      const count = problems.missing.length + problems.misshapen.length + problems.unexpected.length;
      if (count > 0) throw new ModelFolderError(`${dir}: the weights do not match config.json (${config.architecture}): ${lines.join('; ')}${count > lines.length ? `; and ${count - lines.length} more` : ''}`);
      for (const name of [...tensors.keys()]) if (isBufferTensor(name)) tensors.delete(name);
      return new ModelFolder(dir, config, hfConfig, tensors, readers);
    } catch (err) {
      for (const r of readers) r.close();
      throw err;
    }
  }

  /** The stored dtype and shape of each parameter tensor, by canonical name. */
  get entries(): ReadonlyMap<string, TensorEntry> {
    return new Map([...this.tensors].map(([n, t]) => [n, t.entry]));
  }

  /** The bytes of the largest tensor as f32: about what reading the folder holds in memory at once. */
  get largestTensorBytes(): number {
    let max = 0;
    for (const { entry } of this.tensors.values()) max = Math.max(max, entry.shape.reduce((a, b) => a * b, 1) * 4);
    return max;
  }

  /** One tensor as f32, checked finite (a NaN or Inf weight is refused, naming the tensor). */
  read(name: string): Float32Array {
    const t = this.located(name);
    const values = t.reader.read(t.entry.name);
    this.checkFinite(t, name, values, 0);
    return values;
  }

  /** Rows [r0, r1) of a tensor (its first dimension; elements of a vector) as f32, checked finite. */
  readRows(name: string, r0: number, r1: number): Float32Array {
    const t = this.located(name);
    const rowValues = t.entry.shape.slice(1).reduce((a, b) => a * b, 1);
    const size = dtypeBytes(t.entry.dtype);
    const values = new Float32Array((r1 - r0) * rowValues);
    decodeFloats(t.reader.readBytes(t.entry.name, r0 * rowValues * size, r1 * rowValues * size), t.entry.dtype, values);
    this.checkFinite(t, name, values, r0 * rowValues);
    return values;
  }

  /**
   * A tensor's bytes as stored, undecoded (half the memory of f32 for BF16
   * and F16): what a transposed gather reads in pieces (./hf-weights.ts).
   * Values are checked finite as they are taken (`floatAt`).
   */
  readStored(name: string): StoredTensor {
    const t = this.located(name);
    const bytes = t.reader.readBytes(t.entry.name, 0, t.entry.end - t.entry.start);
    return { file: basename(t.reader.path), name, dtype: t.entry.dtype, shape: t.entry.shape, view: new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength) };
  }

  private located(name: string): Located {
    const t = this.tensors.get(name);
    if (!t) throw new ModelFolderError(`${this.dir}: no tensor ${name}`);
    return t;
  }

  private checkFinite(t: Located, name: string, values: Float32Array, first: number): void {
    for (let i = 0; i < values.length; i++) {
      if (!Number.isFinite(values[i])) throw nonFinite(basename(t.reader.path), name, first + i);
    }
  }

  close(): void {
    for (const r of this.readers) r.close();
  }
}
