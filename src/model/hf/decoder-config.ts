// One decoder family, read from a Hugging Face `config.json`: the shape of a
// Llama / Mistral, Qwen2 or GPT-2 model as the engine needs it. Everything the
// architectures differ in is a field here (the norm, the position encoding,
// the MLP, grouped-query heads, which projections carry biases, a tied head),
// so that one decoder layer serves them all. A config that asks for something
// the engine does not do (another model_type, activation, rope scaling, a
// quantized checkpoint, attention limited to a sliding window shorter than
// the context) is refused with one line naming the field.
import { Type, type Static } from '@sinclair/typebox';
import { NimbleError } from '../../protocol/errors.ts';
import { ARCH_FIELDS, ArchFamily, type ArchSizes, type DecoderArch, type RopeScaling } from '../arch.ts';

const Int = Type.Integer({ minimum: 1, maximum: 1 << 24 });


export const DecoderConfig = Type.Object({
  /** the Hugging Face model_type it came from (mistral is read as llama) */
  architecture: ArchFamily,
  vocabSize: Int,
  /** longest sequence served or trained */
  contextLength: Int,
  /** width of the residual stream (hidden_size, n_embd) */
  channels: Int,
  layers: Int,
  /** query heads */
  heads: Int,
  ...ARCH_FIELDS,
});
export type DecoderConfig = Static<typeof DecoderConfig>;

/** A model folder the engine cannot run (its config, weights or tokenizer), in one line that names the file and field. */
export class ModelFolderError extends NimbleError {
  override readonly name = 'ModelFolderError';

  constructor(message: string) {
    super('bad_model', message, 400);
  }
}

type Json = Record<string, unknown>;

const fail = (msg: string): never => {
  throw new ModelFolderError(`config.json: ${msg}`);
};

function int(c: Json, key: string, fallback?: number): number {
  const v = c[key] ?? fallback;
  if (v === undefined || v === null) return fail(`${key} is missing`);
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) return fail(`${key} must be a positive integer, not ${JSON.stringify(v)}`);
  return v;
}

function num(c: Json, key: string, fallback: number): number {
  const v = c[key] ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) return fail(`${key} must be a positive number, not ${JSON.stringify(v)}`);
  return v;
}

function bool(c: Json, key: string, fallback: boolean): boolean {
  const v = c[key] ?? fallback;
  if (typeof v !== 'boolean') return fail(`${key} must be true or false, not ${JSON.stringify(v)}`);
  return v;
}

function ropeScaling(c: Json, contextLength: number): RopeScaling | null {
  const raw = c.rope_scaling;
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== 'object' || Array.isArray(raw)) return fail('rope_scaling must be an object or null');
  const r = raw as Json;
  const kind = r.rope_type ?? r.type;
  if (kind === 'default') return null;
  if (kind === 'linear') return { kind: 'linear', factor: num(r, 'factor', NaN) };
  if (kind === 'llama3') {
    return {
      kind: 'llama3',
      factor: num(r, 'factor', NaN),
      lowFreqFactor: num(r, 'low_freq_factor', NaN),
      highFreqFactor: num(r, 'high_freq_factor', NaN),
      originalContextLength: int(r, 'original_max_position_embeddings', contextLength),
    };
  }
  return fail(`rope_scaling type ${JSON.stringify(kind)} is not supported (none, linear or llama3)`);
}

function refuseQuantized(c: Json): void {
  if (c.quantization_config !== undefined && c.quantization_config !== null) fail('quantized checkpoints (quantization_config) are not supported: use F32, F16 or BF16 weights');
}

/** Llama, Mistral and Qwen2: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention. */
function llamaLike(c: Json, architecture: 'llama' | 'qwen2'): DecoderConfig {
  const act = c.hidden_act ?? 'silu';
  if (act !== 'silu') fail(`hidden_act ${JSON.stringify(act)} is not supported (silu)`);
  const channels = int(c, 'hidden_size');
  const heads = int(c, 'num_attention_heads');
  const kvHeads = int(c, 'num_key_value_heads', heads);
  if (heads % kvHeads !== 0) fail(`num_attention_heads ${heads} is not a multiple of num_key_value_heads ${kvHeads}`);
  const headDim = int(c, 'head_dim', channels % heads === 0 ? channels / heads : undefined);
  if (headDim % 2 !== 0) fail(`head_dim ${headDim} must be even for rotary embeddings`);
  let contextLength = int(c, 'max_position_embeddings');
  // Mistral's and Qwen2's sliding window: attention over the whole context matches it while the context fits the window
  const slides = architecture === 'qwen2' ? c.use_sliding_window === true : c.sliding_window !== undefined && c.sliding_window !== null;
  if (slides) contextLength = Math.min(contextLength, int(c, 'sliding_window'));
  return {
    architecture,
    vocabSize: int(c, 'vocab_size'),
    contextLength,
    channels,
    layers: int(c, 'num_hidden_layers'),
    heads,
    kvHeads,
    headDim,
    intermediateSize: int(c, 'intermediate_size'),
    norm: 'rmsnorm',
    normEps: num(c, 'rms_norm_eps', 1e-6),
    position: 'rope',
    ropeTheta: num(c, 'rope_theta', 10000),
    ropeScaling: ropeScaling(c, contextLength),
    mlp: 'swiglu',
    qkvBias: architecture === 'qwen2' ? true : bool(c, 'attention_bias', false),
    attnOutBias: architecture === 'qwen2' ? false : bool(c, 'attention_bias', false),
    mlpBias: bool(c, 'mlp_bias', false),
    tiedEmbeddings: bool(c, 'tie_word_embeddings', architecture === 'qwen2'),
  };
}

/** GPT-2: LayerNorm, learned positions, tanh-GELU, biases everywhere, tied head. */
function gpt2(c: Json): DecoderConfig {
  const act = c.activation_function ?? 'gelu_new';
  if (act !== 'gelu_new' && act !== 'gelu_pytorch_tanh') fail(`activation_function ${JSON.stringify(act)} is not supported (gelu_new)`);
  const channels = int(c, 'n_embd');
  const heads = int(c, 'n_head');
  if (channels % heads !== 0) fail(`n_embd ${channels} is not a multiple of n_head ${heads}`);
  if (c.scale_attn_weights === false) fail('scale_attn_weights false is not supported');
  if (c.scale_attn_by_inverse_layer_idx === true || c.reorder_and_upcast_attn === true) fail('scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn are not supported');
  return {
    architecture: 'gpt2',
    vocabSize: int(c, 'vocab_size'),
    contextLength: int(c, 'n_positions', typeof c.n_ctx === 'number' ? c.n_ctx : undefined),
    channels,
    layers: int(c, 'n_layer'),
    heads,
    kvHeads: heads,
    headDim: channels / heads,
    intermediateSize: c.n_inner === undefined || c.n_inner === null ? 4 * channels : int(c, 'n_inner'),
    norm: 'layernorm',
    normEps: num(c, 'layer_norm_epsilon', 1e-5),
    position: 'learned',
    ropeTheta: 10000,
    ropeScaling: null,
    mlp: 'gelu',
    qkvBias: true,
    attnOutBias: true,
    mlpBias: true,
    tiedEmbeddings: bool(c, 'tie_word_embeddings', true),
  };
}

/** The decoder a parsed config.json describes; ModelFolderError for anything the engine does not run. */
export function decoderConfigFromHf(raw: unknown): DecoderConfig {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) fail('not a JSON object');
  const c = raw as Json;
  refuseQuantized(c);
  const type = c.model_type;
  if (type === 'llama' || type === 'mistral') return llamaLike(c, 'llama');
  if (type === 'qwen2') return llamaLike(c, 'qwen2');
  if (type === 'gpt2') return gpt2(c);
  return fail(`model_type ${JSON.stringify(type)} is not supported (llama, mistral, qwen2, gpt2)`);
}

/** Parameters of the whole model (every tensor of its checkpoint). */
export function decoderParamCount(c: DecoderConfig): number {
  const q = c.heads * c.headDim;
  const kv = c.kvHeads * c.headDim;
  const norm = c.norm === 'layernorm' ? 2 * c.channels : c.channels;
  const attn = c.channels * (q + 2 * kv) + (c.qkvBias ? q + 2 * kv : 0) + q * c.channels + (c.attnOutBias ? c.channels : 0);
  const I = c.intermediateSize;
  const mlp = c.mlp === 'swiglu' ? 3 * c.channels * I + (c.mlpBias ? 2 * I + c.channels : 0) : 2 * c.channels * I + (c.mlpBias ? I + c.channels : 0);
  const block = 2 * norm + attn + mlp;
  const embed = c.vocabSize * c.channels + (c.position === 'learned' ? c.contextLength * c.channels : 0);
  return embed + c.layers * block + norm + (c.tiedEmbeddings ? 0 : c.vocabSize * c.channels);
}

/** The engine's config of a Hugging Face decoder: the sizes, and the block as an arch (../arch.ts). */
export function gptConfigOfDecoder(d: DecoderConfig): {
  vocabSize: number; contextLength: number; channels: number; layers: number; heads: number; mlpRatio: number; arch: DecoderArch;
} {
  return {
    vocabSize: d.vocabSize,
    contextLength: d.contextLength,
    channels: d.channels,
    layers: d.layers,
    heads: d.heads,
    // not read when arch is set (arch.intermediateSize is the MLP's width); kept a positive integer for the schema
    mlpRatio: Math.max(1, Math.round(d.intermediateSize / d.channels)),
    arch: {
      family: d.architecture, kvHeads: d.kvHeads, headDim: d.headDim, intermediateSize: d.intermediateSize,
      norm: d.norm, normEps: d.normEps, position: d.position, ropeTheta: d.ropeTheta, ropeScaling: d.ropeScaling, mlp: d.mlp,
      qkvBias: d.qkvBias, attnOutBias: d.attnOutBias, mlpBias: d.mlpBias, tiedEmbeddings: d.tiedEmbeddings,
    },
  };
}

/** The Hugging Face decoder config of an engine config with an arch (the inverse of gptConfigOfDecoder): what an export describes. */
export function decoderOfGptConfig(c: ArchSizes & { layers: number }): DecoderConfig {
  const a = c.arch;
  if (!a) throw new Error('the byte-level GPT has no Hugging Face architecture: only a model with an arch exports');
  return {
    architecture: a.family, vocabSize: c.vocabSize, contextLength: c.contextLength, channels: c.channels, layers: c.layers, heads: c.heads,
    kvHeads: a.kvHeads, headDim: a.headDim, intermediateSize: a.intermediateSize, norm: a.norm, normEps: a.normEps, position: a.position,
    ropeTheta: a.ropeTheta, ropeScaling: a.ropeScaling, mlp: a.mlp, qkvBias: a.qkvBias, attnOutBias: a.attnOutBias, mlpBias: a.mlpBias, tiedEmbeddings: a.tiedEmbeddings,
  };
}
