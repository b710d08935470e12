// The decoder family's architecture: what a Llama / Mistral, Qwen2 or GPT-2
// block is made of, beyond the sizes a GptConfig already has (vocabulary,
// context, channels, layers, query heads). A GptConfig without `arch` is the
// byte-level GPT (GPT-2's block: LayerNorm, learned positions, tanh-GELU,
// biases everywhere, heads of channels / heads, an MLP of mlpRatio ·
// channels); with `arch`, every layer of the block is as it says. One block
// serves them all (./gpt.ts for training, src/inference/stage-inference.ts
// over a KV cache); `resolveArch` is the one place the defaults live.
//
// The head is always a tensor of its own in the engine (so that the first and
// last stages share no weights): a tied checkpoint's head is loaded as the
// embedding's transpose (./hf/hf-weights.ts).
import { Type, type Static } from '@sinclair/typebox';

const Int = Type.Integer({ minimum: 1, maximum: 1 << 24 });

export const RopeScaling = Type.Union([
  Type.Object({ kind: Type.Literal('linear'), factor: Type.Number({ exclusiveMinimum: 0 }) }),
  Type.Object({
    kind: Type.Literal('llama3'),
    factor: Type.Number({ exclusiveMinimum: 0 }),
    lowFreqFactor: Type.Number({ exclusiveMinimum: 0 }),
    highFreqFactor: Type.Number({ exclusiveMinimum: 0 }),
    originalContextLength: Int,
  }),
]);
export type RopeScaling = Static<typeof RopeScaling>;

/** A block's fields besides the family: what a Hugging Face decoder config (./hf/decoder-config.ts) has too. */
export const ARCH_FIELDS = {
  /** key/value heads (grouped-query attention: heads is a multiple of it) */
  kvHeads: Int,
  /** width of one head (Llama and Qwen2 may have heads · headDim ≠ channels) */
  headDim: Int,
  /** hidden width of the MLP (SwiGLU: of gate and of up) */
  intermediateSize: Int,
  norm: Type.Union([Type.Literal('layernorm'), Type.Literal('rmsnorm')]),
  normEps: Type.Number({ exclusiveMinimum: 0, maximum: 1 }),
  /** learned position embeddings, or rotary embeddings on q and k */
  position: Type.Union([Type.Literal('learned'), Type.Literal('rope')]),
  ropeTheta: Type.Number({ exclusiveMinimum: 0, maximum: 1e12 }),
  ropeScaling: Type.Union([RopeScaling, Type.Null()]),
  /** GELU (tanh form) between two linears, or SiLU(gate) × up then down */
  mlp: Type.Union([Type.Literal('gelu'), Type.Literal('swiglu')]),
  /** biases on the q, k and v projections */
  qkvBias: Type.Boolean(),
  /** a bias on the attention's output projection */
  attnOutBias: Type.Boolean(),
  /** biases on the MLP's projections */
  mlpBias: Type.Boolean(),
  /** the checkpoint it came from tied its head to the embedding (the engine keeps both: an export may tie them again) */
  tiedEmbeddings: Type.Boolean(),
};

/** The Hugging Face families (mistral is read as llama). */
export const ArchFamily = Type.Union([Type.Literal('llama'), Type.Literal('qwen2'), Type.Literal('gpt2')]);

export const DecoderArch = Type.Object({
  /** the Hugging Face family it came from: what an export writes back */
  family: ArchFamily,
  ...ARCH_FIELDS,
});
export type DecoderArch = Static<typeof DecoderArch>;

/** The sizes a GptConfig has, with an optional arch (config.ts's GptConfig is this shape). */
export interface ArchSizes {
  vocabSize: number;
  contextLength: number;
  channels: number;
  heads: number;
  mlpRatio: number;
  arch?: DecoderArch;
}

/** The byte-level GPT's block, for a config without `arch`. */
export function byteGptArch(c: ArchSizes): DecoderArch {
  return {
    family: 'gpt2', kvHeads: c.heads, headDim: c.channels / c.heads, intermediateSize: c.channels * c.mlpRatio,
    norm: 'layernorm', normEps: 1e-5, position: 'learned', ropeTheta: 10000, ropeScaling: null, mlp: 'gelu',
    qkvBias: true, attnOutBias: true, mlpBias: true, tiedEmbeddings: false,
  };
}

/** A config's architecture, defaults included. */
export function resolveArch(c: ArchSizes): DecoderArch {
  return c.arch ?? byteGptArch(c);
}

/** The widths a block's buffers take. */
export interface BlockWidths {
  /** fused q, k, v: (H + 2·KV)·D */
  qkv: number;
  /** the attention's output, H·D */
  attn: number;
  /** the MLP's first projection: I (GELU) or 2I (SwiGLU: [gate | up]) */
  fc: number;
  /** the MLP's hidden width I */
  hidden: number;
}

export function blockWidths(c: ArchSizes): BlockWidths {
  const a = resolveArch(c);
  const I = a.intermediateSize;
  return { qkv: (c.heads + 2 * a.kvHeads) * a.headDim, attn: c.heads * a.headDim, fc: a.mlp === 'swiglu' ? 2 * I : I, hidden: I };
}

/** Whether a config's attention is the byte GPT's (multi-head, heads of C / H, no rotation): then the original kernels run it. */
export function isClassicAttention(c: ArchSizes): boolean {
  const a = resolveArch(c);
  return a.position === 'learned' && a.kvHeads === c.heads && a.headDim * c.heads === c.channels;
}

/** Checks what the kernels need of an arch; throws with the reason. */
export function validateArch(c: ArchSizes): void {
  const a = c.arch;
  if (!a) return;
  const ints: [string, number][] = [['kvHeads', a.kvHeads], ['headDim', a.headDim], ['intermediateSize', a.intermediateSize]];
  for (const [key, v] of ints) if (!(Number.isInteger(v) && v >= 1 && v <= 1 << 24)) throw new Error(`model arch: ${key} must be a positive integer, not ${v}`);
  if (c.heads % a.kvHeads !== 0) throw new Error(`model arch: ${c.heads} query heads are not a multiple of ${a.kvHeads} key/value heads`);
  if (a.headDim % 4 !== 0) throw new Error(`model arch: head width ${a.headDim} must be a multiple of 4`);
  if (!(a.normEps > 0 && a.normEps <= 1)) throw new Error(`model arch: normEps ${a.normEps} must be in (0, 1]`);
  if (!(a.ropeTheta > 0 && Number.isFinite(a.ropeTheta))) throw new Error(`model arch: ropeTheta ${a.ropeTheta} must be positive`);
  if (a.family === 'gpt2' && (a.norm !== 'layernorm' || a.position !== 'learned' || a.mlp !== 'gelu')) throw new Error('model arch: a gpt2 block has LayerNorm, learned positions and GELU');
  if (a.family !== 'gpt2' && (a.norm !== 'rmsnorm' || a.position !== 'rope' || a.mlp !== 'swiglu')) throw new Error(`model arch: a ${a.family} block has RMSNorm, rotary positions and SwiGLU`);
}
