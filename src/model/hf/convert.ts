// A Hugging Face model folder to the network's model file and back
// (`nbcli model import` and `nbcli model export`, docs/models.md).
//
// The model file is a whole-model Nimble checkpoint (src/model/checkpoint.ts,
// format nimble-gpt/1): the engine's tensors (src/model/parts.ts's names:
// fused q/k/v and gate/up, linears [in, out], the head a tensor of its own),
// in the folder's stored dtype (F32, F16 or BF16) unless told otherwise, and
// in its metadata the engine config with its arch, the folder's config.json
// (`hf_config`) and its tokenizer (`tokenizer`: tokenizer.json,
// tokenizer_config.json and generation_config.json as one JSON object). One
// file is one model: its sha256, which the ModelRegistry attests and miners
// check, covers the weights and the tokenizer alike.
//
// Both directions stream, so the peak is about the largest tensor, not the
// model: an import writes each engine tensor in pieces of rows (holding at
// most a transposed tensor's stored bytes), an export one stored tensor at a
// time.
// A failure leaves nothing behind (the file is written aside and renamed).
import { renameSync, rmSync } from 'node:fs';
import { hfConfigOfDecoder } from './config-json.ts';
import { decoderOfGptConfig, gptConfigOfDecoder, ModelFolderError } from './decoder-config.ts';
import { CHECKPOINT_FORMAT, checkpointInfo } from '../checkpoint.ts';
import type { GptConfig } from '../config.ts';
import { gptModelRef } from '../model-ref.ts';
import { ParamLayout, type ParamSpec } from '../params.ts';
import { partCount, partParams } from '../parts.ts';
import { SafetensorsError } from '../safetensors.ts';
import type { FloatDtype } from './dtype.ts';
import { writeModelFolder } from './folder-writer.ts';
import { readPeftAdapter } from './peft.ts';
import { addLoraUpdate } from '../lora-merge.ts';
import { hfTensorSpecs } from './hf-tensors.ts';
import { engineNameOf, engineTensor, engineTensorChunks, storedTensor } from './hf-weights.ts';
import { ModelFolder, readFolderJson } from './model-folder.ts';
import { MAX_HEADER_BYTES, SafetensorsReader, writeSafetensorsFile } from './safetensors-file.ts';
import { TextTokenizer, type TokenizerBundle } from './tokenizer.ts';

/** The metadata keys a model file adds to a checkpoint's. */
export const HF_CONFIG_KEY = 'hf_config';
export const TOKENIZER_KEY = 'tokenizer';


export interface ImportResult {
  config: GptConfig;
  /** the model reference (llama:v…) */
  model: string;
  dtype: FloatDtype;
  /** bytes of the file written */
  bytes: number;
  params: number;
  /** the largest tensor's f32 bytes: about the memory the import held at once */
  largestTensorBytes: number;
}

const numel = (shape: readonly number[]): number => shape.reduce((a, b) => a * b, 1);

/** The dtype most of a folder's weights are stored in. */
function storedDtype(folder: ModelFolder): FloatDtype {
  const bytes = new Map<FloatDtype, number>();
  for (const e of folder.entries.values()) bytes.set(e.dtype, (bytes.get(e.dtype) ?? 0) + numel(e.shape));
  return [...bytes].sort((a, b) => b[1] - a[1])[0]?.[0] ?? 'F32';
}

/** The whole model's parameter specs, in the order a file holds them. */
function wholeLayout(config: GptConfig): ParamLayout {
  const specs: ParamSpec[] = [];
  for (let p = 0; p < partCount(config); p++) specs.push(...partParams(config, p));
  return new ParamLayout(specs);
}

/**
 * Reads the folder `dir` (config, weights, tokenizer: every check of
 * ./model-folder.ts and ./tokenizer.ts) and writes its model file to `out`.
 * Throws a ModelFolderError naming the file and problem; nothing is left at
 * `out` then.
 */
export function importFolder(dir: string, out: string, options: { dtype?: FloatDtype } = {}): ImportResult {
  const folder = ModelFolder.open(dir);
  const tmp = `${out}.partial-${process.pid}`;
  try {
    const config = gptConfigOfDecoder(folder.config);
    const model = gptModelRef(config);
    // the tokenizer is checked against the model before any weight is read
    TextTokenizer.fromFolder(dir, config.vocabSize);
    const bundle: TokenizerBundle = {
      'tokenizer.json': readFolderJson(dir, 'tokenizer.json', false) as Record<string, unknown>,
      'tokenizer_config.json': (readFolderJson(dir, 'tokenizer_config.json', true) ?? {}) as Record<string, unknown>,
      'generation_config.json': (readFolderJson(dir, 'generation_config.json', true) ?? {}) as Record<string, unknown>,
    };
    const dtype = options.dtype ?? storedDtype(folder);
    const layout = wholeLayout(config);
    const metadata = {
      format: CHECKPOINT_FORMAT, config: JSON.stringify(config), from: '0', to: String(partCount(config)), step: '0',
      [HF_CONFIG_KEY]: JSON.stringify(folder.hfConfig), [TOKENIZER_KEY]: JSON.stringify(bundle),
    };
    const tensors = layout.entries.map((e) => ({ name: e.name, shape: e.shape, values: () => engineTensor(folder, e), chunks: () => engineTensorChunks(folder, e) }));
    rmSync(tmp, { force: true });
    const bytes = writeSafetensorsFile(tmp, tensors, dtype, metadata);
    renameSync(tmp, out);
    const largest = Math.max(...layout.entries.map((e) => e.size * 4));
    return { config, model, dtype, bytes, params: layout.size, largestTensorBytes: Math.max(largest, folder.largestTensorBytes) };
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  } finally {
    folder.close();
  }
}

/** What a model file holds besides its weights (read from its header alone). */
export interface ModelFileInfo {
  config: GptConfig;
  hfConfig: Record<string, unknown> | null;
  tokenizer: TokenizerBundle | null;
}

function jsonMeta(m: Readonly<Record<string, string>>, key: string): unknown {
  const v = m[key];
  if (v === undefined) return null;
  try {
    return JSON.parse(v);
  } catch {
    throw new SafetensorsError(`model file metadata '${key}' is not JSON`);
  }
}

/** The config, config.json and tokenizer of a model file's metadata (a SafetensorsError when it is not a whole model). */
export function modelFileInfo(metadata: Readonly<Record<string, string>>): ModelFileInfo {
  const info = checkpointInfo({ tensors: new Map(), metadata: { ...metadata } });
  if (info.from !== 0 || info.to !== partCount(info.config)) throw new SafetensorsError(`the file holds parts [${info.from}, ${info.to}), not the whole model`);
  const hf = jsonMeta(metadata, HF_CONFIG_KEY);
  const tok = jsonMeta(metadata, TOKENIZER_KEY);
  if (hf !== null && (typeof hf !== 'object' || Array.isArray(hf))) throw new SafetensorsError(`model file metadata '${HF_CONFIG_KEY}' is not an object`);
  if (tok !== null && (typeof tok !== 'object' || Array.isArray(tok) || !('tokenizer.json' in tok))) throw new SafetensorsError(`model file metadata '${TOKENIZER_KEY}' is not a tokenizer bundle`);
  return { config: info.config, hfConfig: hf as Record<string, unknown> | null, tokenizer: tok as TokenizerBundle | null };
}

/**
 * Writes a model file (a whole Nimble checkpoint of a model with an arch) back
 * as a Hugging Face folder at `dir`: config.json, the weights in `dtype`
 * (default: the file's), the tokenizer files. With `mergeAdapter` (a PEFT
 * adapter folder of this model) the weights written are the base's with the
 * adapter merged in, as PEFT's merge_and_unload gives them. Returns the data
 * bytes written.
 */
export function exportModelFile(path: string, dir: string, options: { dtype?: FloatDtype; overwrite?: boolean; mergeAdapter?: string } = {}): { bytes: number; dtype: FloatDtype; config: GptConfig } {
  const reader = SafetensorsReader.open(path);
  try {
    const { config, hfConfig, tokenizer } = modelFileInfo(reader.metadata);
    if (!config.arch) throw new ModelFolderError(`${path} holds the byte-level GPT, which has no Hugging Face layout: only imported models (Llama, Qwen2, GPT-2) export`);
    const decoder = decoderOfGptConfig(config);
    const engineNames = [...reader.entries.keys()];
    const dtype = options.dtype ?? [...reader.entries.values()][0]?.dtype ?? 'F32';
    // a PEFT adapter folder merged in (W' = W + (alpha / r) B A), read and checked (names, shapes, finite values) against this model before a weight is written
    const adapter = options.mergeAdapter === undefined ? null : readPeftAdapter(options.mergeAdapter, config);
    // one engine tensor read at a time: the stored tensors of a fused one (q, k, v) are cut from it in turn
    let cached: { name: string; values: Float32Array } | null = null;
    const engine = (name: string): Float32Array => {
      if (cached?.name !== name) {
        const values = reader.read(name);
        if (adapter) addLoraUpdate(config, adapter.spec, name, reader.entries.get(name)!.shape, values, adapter.layout, adapter.adapters);
        cached = { name, values };
      }
      return cached.values;
    };
    const tensors = hfTensorSpecs(decoder).map((spec) => {
      const name = engineNameOf(decoder, spec.name, engineNames);
      const entry = reader.entries.get(name)!;
      return { name: spec.name, shape: spec.shape, values: () => storedTensor(decoder, name, entry.shape, engine(name), spec.name, spec.shape) };
    });
    const files: Record<string, unknown> = tokenizer ? { ...tokenizer } : {};
    // a model trained from an inline reference has no config.json of its own: the one its decoder reads back from
    const base = hfConfig ?? hfConfigOfDecoder(decoder);
    const bytes = writeModelFolder(dir, { hfConfig: { ...base, tie_word_embeddings: decoder.tiedEmbeddings }, tensors, dtype, files, overwrite: options.overwrite });
    return { bytes, dtype, config };
  } finally {
    reader.close();
  }
}

/**
 * A safetensors file's metadata read by ranges (a blob in the store, a file
 * on a server): its 8-byte length, then the header alone, never the tensors.
 */
export async function readFileMetadata(read: (start: number, end: number) => Promise<Uint8Array>, what: string): Promise<Record<string, string>> {
  const len = await read(0, 8);
  if (len.length < 8) throw new SafetensorsError(`${what}: too short for a safetensors header`);
  const n = new DataView(len.buffer, len.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) throw new SafetensorsError(`${what}: a header of ${n} bytes is larger than ${MAX_HEADER_BYTES}`);
  const bytes = await read(8, 8 + Number(n));
  if (bytes.length !== Number(n)) throw new SafetensorsError(`${what}: the header is cut short`);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch {
    throw new SafetensorsError(`${what}: the header is not UTF-8 JSON`);
  }
  const m = (header as { __metadata__?: unknown } | null)?.__metadata__;
  if (m === undefined) return {};
  if (typeof m !== 'object' || m === null || Array.isArray(m) || Object.values(m).some((v) => typeof v !== 'string')) throw new SafetensorsError(`${what}: __metadata__ must map strings to strings`);
  return m as Record<string, string>;
}
