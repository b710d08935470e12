// Between a Hugging Face checkpoint's tensors and the engine's parameters
// (src/model/parts.ts's names), for every family: which stored tensors make
// each engine tensor, and how.
//
// - GPT-2 stores Conv1D weights [in, out], as the engine stores its linears:
//   name for name.
// - Llama and Qwen2 store Linear weights [out, in]: transposed. q_proj,
//   k_proj and v_proj become the fused attn.qkv ([q | k | v] columns, their
//   biases side by side); gate_proj and up_proj the fused mlp.fc ([gate | up]).
// - The engine's head is a tensor of its own; a tied checkpoint has none, so
//   it is loaded as the embedding's transpose. An export writes the head
//   back only when the model was not tied (a tied model's head is the
//   embedding's: trained apart, an export unties it).
//
// Import reads one stored tensor at a time (ModelFolder.read), or writes an
// engine tensor in pieces of rows (engineTensorChunks); export makes one
// stored tensor at a time from the engine's flat weights.
import type { ParamEntry, ParamLayout } from '../params.ts';
import { ModelFolderError, type DecoderConfig } from './decoder-config.ts';
import { floatAt } from './dtype.ts';
import { nonFinite, type ModelFolder } from './model-folder.ts';

/** A stored tensor's part of an engine tensor: its columns [col, col + cols) of the engine's [in, out] matrix (or elements, for a vector). */
export interface TensorSource {
  /** the stored (canonical) name */
  tensor: string;
  /** stored [out, in] (a Linear): the engine's [in, out] is its transpose */
  transpose: boolean;
  /** first column (matrix) or element (vector) of the engine tensor it fills */
  col: number;
}

const GPT2_BLOCK: Record<string, string> = {
  'ln1.w': 'ln_1.weight', 'ln1.b': 'ln_1.bias', 'attn.qkv.w': 'attn.c_attn.weight', 'attn.qkv.b': 'attn.c_attn.bias',
  'attn.proj.w': 'attn.c_proj.weight', 'attn.proj.b': 'attn.c_proj.bias', 'ln2.w': 'ln_2.weight', 'ln2.b': 'ln_2.bias',
  'mlp.fc.w': 'mlp.c_fc.weight', 'mlp.fc.b': 'mlp.c_fc.bias', 'mlp.proj.w': 'mlp.c_proj.weight', 'mlp.proj.b': 'mlp.c_proj.bias',
};

/** The stored tensors that make the engine's tensor `name`, in column order. */
export function sourcesOf(c: DecoderConfig, name: string): TensorSource[] {
  const one = (tensor: string, transpose = false): TensorSource[] => [{ tensor, transpose, col: 0 }];
  const gpt2 = c.architecture === 'gpt2';
  const embed = gpt2 ? 'wte.weight' : 'model.embed_tokens.weight';
  if (name === 'wte') return one(embed);
  if (name === 'wpe' && gpt2) return one('wpe.weight');
  if (name === 'lnf.w') return one(gpt2 ? 'ln_f.weight' : 'model.norm.weight');
  if (name === 'lnf.b' && gpt2) return one('ln_f.bias');
  if (name === 'lm_head.w') return one(c.tiedEmbeddings ? embed : 'lm_head.weight', true);
  const m = /^h\.(\d+)\.(.+)$/.exec(name);
  if (m && gpt2 && m[2] in GPT2_BLOCK) return one(`h.${m[1]}.${GPT2_BLOCK[m[2]]}`);
  if (m && !gpt2) {
    const p = `model.layers.${m[1]}.`;
    const q = c.heads * c.headDim, kv = c.kvHeads * c.headDim, I = c.intermediateSize;
    const fused = (parts: [string, number][], suffix: string, transpose: boolean): TensorSource[] => {
      let col = 0;
      return parts.map(([t, width]) => {
        const s = { tensor: p + t + suffix, transpose, col };
        col += width;
        return s;
      });
    };
    const qkv: [string, number][] = [['self_attn.q_proj', q], ['self_attn.k_proj', kv], ['self_attn.v_proj', kv]];
    const gateUp: [string, number][] = [['mlp.gate_proj', I], ['mlp.up_proj', I]];
    switch (m[2]) {
      case 'ln1.w': return one(p + 'input_layernorm.weight');
      case 'ln2.w': return one(p + 'post_attention_layernorm.weight');
      case 'attn.qkv.w': return fused(qkv, '.weight', true);
      case 'attn.qkv.b': return fused(qkv, '.bias', false);
      case 'attn.proj.w': return one(p + 'self_attn.o_proj.weight', true);
      case 'attn.proj.b': return one(p + 'self_attn.o_proj.bias');
      case 'mlp.fc.w': return fused(gateUp, '.weight', true);
      case 'mlp.fc.b': return fused(gateUp, '.bias', false);
      case 'mlp.proj.w': return one(p + 'mlp.down_proj.weight', true);
      case 'mlp.proj.b': return one(p + 'mlp.down_proj.bias');
    }
  }
  throw new ModelFolderError(`no ${c.architecture} tensor for the engine's ${name}`);
}

/** Writes a stored tensor's values into the engine tensor `out` (offset `at`, shape `shape`) at its columns. */
function place(out: Float32Array, at: number, shape: readonly number[], src: TensorSource, values: Float32Array, what: string): void {
  if (shape.length === 1) {
    if (src.col + values.length > shape[0]) throw new ModelFolderError(`${src.tensor}: ${values.length} values do not fit the engine's ${what} of ${shape[0]}`);
    out.set(values, at + src.col);
    return;
  }
  const [rows, cols] = shape;
  const width = values.length / rows;
  if (!Number.isInteger(width) || src.col + width > cols) throw new ModelFolderError(`${src.tensor}: ${values.length} values do not fit the engine's ${what} [${rows}, ${cols}]`);
  if (src.transpose) {
    // stored [width, rows] → columns [col, col + width) of [rows, cols]
    for (let j = 0; j < width; j++) for (let i = 0; i < rows; i++) out[at + i * cols + src.col + j] = values[j * rows + i];
  } else {
    for (let i = 0; i < rows; i++) out.set(values.subarray(i * width, (i + 1) * width), at + i * cols + src.col);
  }
}

/** Fills the engine tensor `e` (at e.offset of `out`) from a model folder, one stored tensor read at a time. */
function fill(folder: ModelFolder, e: ParamEntry, out: Float32Array, at: number): void {
  const sources = sourcesOf(folder.config, e.name);
  let filled = 0;
  for (const src of sources) {
    const values = folder.read(src.tensor);
    place(out, at, e.shape, src, values, e.name);
    filled += values.length;
  }
  if (filled !== e.size) throw new ModelFolderError(`${sources.map((s) => s.tensor).join(' + ')}: ${filled} values where the engine's ${e.name} takes ${e.size}`);
}

/** The weights of `layout` (a stage's parameters) filled from a model folder, one stored tensor read at a time. */
export function hfWeights(folder: ModelFolder, layout: ParamLayout): Float32Array {
  const out = new Float32Array(layout.size);
  for (const e of layout.entries) fill(folder, e, out, e.offset);
  return out;
}

/** Values per piece of an engine matrix an import writes (16 MiB as f32). */
const CHUNK_VALUES = 4 << 20;

/**
 * One engine tensor of `layout` made from a model folder in pieces of whole
 * rows (about `chunkValues` values each), in order: what an import writes,
 * so that no f32 copy of a large tensor is ever whole in memory. A stored
 * tensor placed as is is read a piece of rows at a time; one that is
 * transposed ([out, in] to the engine's [in, out]) is held undecoded (its
 * stored bytes) while its columns are gathered piece by piece.
 */
export function* engineTensorChunks(folder: ModelFolder, e: ParamEntry, chunkValues = CHUNK_VALUES): Generator<Float32Array> {
  if (e.shape.length !== 2) {
    yield engineTensor(folder, e);
    return;
  }
  const [rows, cols] = e.shape;
  const sources = sourcesOf(folder.config, e.name);
  const entries = folder.entries;
  const widths = sources.map((src) => {
    const entry = entries.get(src.tensor);
    if (!entry) throw new ModelFolderError(`${folder.dir}: no tensor ${src.tensor}`);
    const [a, b] = entry.shape;
    const width = src.transpose ? a : b;
    if (entry.shape.length !== 2 || (src.transpose ? b : a) !== rows || src.col + width > cols) throw new ModelFolderError(`${src.tensor}: shape [${entry.shape}] does not fit the engine's ${e.name} [${rows}, ${cols}]`);
    return width;
  });
  const filled = widths.reduce((a, b) => a + b, 0);
  if (filled !== cols) throw new ModelFolderError(`${sources.map((s) => s.tensor).join(' + ')}: ${filled * rows} values where the engine's ${e.name} takes ${e.size}`);
  const stored = sources.map((src) => (src.transpose ? folder.readStored(src.tensor) : null));
  const step = Math.max(1, Math.floor(chunkValues / cols));
  for (let r0 = 0; r0 < rows; r0 += step) {
    const r1 = Math.min(rows, r0 + step);
    const out = new Float32Array((r1 - r0) * cols);
    for (let k = 0; k < sources.length; k++) {
      const col = sources[k].col, width = widths[k], raw = stored[k];
      if (raw) {
        // stored [width, rows]: its columns [r0, r1) are the engine's rows
        for (let j = 0; j < width; j++) {
          const base = j * rows;
          for (let i = r0; i < r1; i++) {
            const v = floatAt(raw.view, raw.dtype, base + i);
            if (!Number.isFinite(v)) throw nonFinite(raw.file, raw.name, base + i);
            out[(i - r0) * cols + col + j] = v;
          }
        }
      } else {
        const values = folder.readRows(sources[k].tensor, r0, r1);
        if (width === cols) out.set(values);
        else for (let i = 0; i < r1 - r0; i++) out.set(values.subarray(i * width, (i + 1) * width), i * cols + col);
      }
    }
    yield out;
  }
}

/** One engine tensor of `layout` made from a model folder, whole (a stage's load; an import writes engineTensorChunks). */
export function engineTensor(folder: ModelFolder, e: ParamEntry): Float32Array {
  const out = new Float32Array(e.size);
  fill(folder, e, out, 0);
  return out;
}

/**
 * One stored tensor (`stored`, of `storedShape`) made from the engine tensor
 * `engineName` (its shape and values): the inverse of an import's placing.
 */
export function storedTensor(c: DecoderConfig, engineName: string, engineShape: readonly number[], engine: Float32Array, stored: string, storedShape: readonly number[]): Float32Array {
  const src = sourcesOf(c, engineName).find((s) => s.tensor === stored);
  if (!src) throw new Error(`${stored} is not part of ${engineName}`);
  const n = storedShape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  if (engineShape.length === 1) {
    out.set(engine.subarray(src.col, src.col + n));
    return out;
  }
  const [rows, cols] = engineShape;
  const width = n / rows;
  if (src.transpose) {
    for (let j = 0; j < width; j++) for (let i = 0; i < rows; i++) out[j * rows + i] = engine[i * cols + src.col + j];
  } else {
    for (let i = 0; i < rows; i++) out.set(engine.subarray(i * cols + src.col, i * cols + src.col + width), i * width);
  }
  return out;
}

/** The engine tensor a stored tensor is part of (an export asks it for every stored tensor). */
export function engineNameOf(c: DecoderConfig, stored: string, engineNames: readonly string[]): string {
  for (const name of engineNames) if (sourcesOf(c, name).some((s) => s.tensor === stored)) return name;
  throw new Error(`no engine tensor holds ${stored}`);
}
