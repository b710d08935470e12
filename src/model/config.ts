// Model configurations are plain objects: a new size is one line. The shape is
// a TypeBox schema too, for configs read back from checkpoints or peers
// (`parse(GptConfig, value)` from src/protocol/messages.ts, then
// validateGptConfig for the constraints between fields).
import { Type, type Static } from '@sinclair/typebox';
import { blockWidths, DecoderArch, validateArch } from './arch.ts';

const Size = Type.Integer({ minimum: 1, maximum: 1 << 20 });

export const GptConfig = Type.Object({
  /** tokens (bytes: 256) */
  vocabSize: Size,
  /** longest sequence */
  contextLength: Size,
  /** width of the residual stream */
  channels: Size,
  layers: Size,
  heads: Size,
  /** hidden width of the MLP, as a multiple of channels */
  mlpRatio: Size,
  /**
   * Initialisation: 'torch' (the default: PyTorch's layer defaults, linear
   * weights and biases uniform in ±1/sqrt(fan_in), embeddings normal 1) or
   * 'gpt2' (normal 0.02, residual projections scaled by 1/sqrt(2L)). On the
   * reference recipe 'torch' reaches a held-out loss of 1.713 after 2,000
   * steps, 'gpt2' 1.767-1.777 (README).
   */
  init: Type.Optional(Type.Union([Type.Literal('gpt2'), Type.Literal('torch')])),
  /**
   * The block's architecture (./arch.ts): absent for the byte-level GPT;
   * Llama, Qwen2 and GPT-2 models imported from Hugging Face folders carry
   * theirs (then mlpRatio is not read: arch.intermediateSize is the MLP's
   * width).
   */
  arch: Type.Optional(DecoderArch),
});
export type GptConfig = Static<typeof GptConfig>;

export const GPT_CONFIGS: Record<string, GptConfig> = {
  'gpt-tiny': { vocabSize: 256, contextLength: 64, channels: 128, layers: 4, heads: 4, mlpRatio: 4 },
  'gpt-small': { vocabSize: 256, contextLength: 128, channels: 256, layers: 6, heads: 8, mlpRatio: 4 },
  'gpt-micro': { vocabSize: 256, contextLength: 16, channels: 16, layers: 2, heads: 2, mlpRatio: 4 },
};

export function gptConfig(name: string): GptConfig {
  const c = GPT_CONFIGS[name];
  if (!c) throw new Error(`unknown model '${name}' (known: ${Object.keys(GPT_CONFIGS).join(', ')})`);
  return c;
}

/** The largest value of each size a config may have: far beyond the models here, far below what overflows an allocation. */
export const GPT_LIMITS: Readonly<Record<'vocabSize' | 'contextLength' | 'channels' | 'layers' | 'heads' | 'mlpRatio', number>> = {
  vocabSize: 1 << 20,
  contextLength: 1 << 16,
  channels: 1 << 15,
  layers: 1024,
  heads: 1024,
  mlpRatio: 16,
};
/** The most parameters a config may have (about 17 billion). */
export const MAX_GPT_PARAMS = 2 ** 34;

/** Checks the constraints the kernels rely on, that every size is within GPT_LIMITS, and that the parameters fit MAX_GPT_PARAMS. */
export function validateGptConfig(c: GptConfig): void {
  validateGptShape(c);
  // embeddings (and the head), and per layer attention and MLP weights: the bulk of the parameters
  const w = blockWidths(c);
  const params = (2 * c.vocabSize + c.contextLength) * c.channels + c.layers * c.channels * (w.qkv + w.attn + w.fc + w.hidden);
  if (params > MAX_GPT_PARAMS) throw new Error(`gpt config: about ${params.toExponential(2)} parameters, more than ${MAX_GPT_PARAMS}`);
}

/**
 * validateGptConfig without the parameter cap: for code that only counts a
 * model (the planner's cost model, the simulator), never allocates it.
 */
export function validateGptShape(c: GptConfig): void {
  const ints = [c.vocabSize, c.contextLength, c.channels, c.layers, c.heads, c.mlpRatio];
  if (!ints.every((n) => Number.isInteger(n) && n > 0)) throw new Error('gpt config: every size must be a positive integer');
  for (const [key, max] of Object.entries(GPT_LIMITS)) {
    const v = c[key as keyof typeof GPT_LIMITS];
    if (v > max) throw new Error(`gpt config: ${key} ${v} exceeds ${max}`);
  }
  if (c.arch) {
    validateArch(c);
  } else {
    if (c.channels % c.heads !== 0) throw new Error('gpt config: channels must divide into heads');
    if ((c.channels / c.heads) % 4 !== 0) throw new Error('gpt config: head size must be a multiple of 4');
  }
  // the byte GPT's WebGPU kernels need it; the WASM kernels any arch runs on take any vocabulary (GPT-2's 50,257)
  if (!c.arch && c.vocabSize % 4 !== 0) throw new Error('gpt config: vocabulary size must be a multiple of 4');
}
