// Small Hugging Face model folders made here for tests: a config.json of each
// architecture (Llama, Qwen2, GPT-2), random weights of the shapes
// transformers stores, and a byte-level tokenizer learned from a text.
import type { FloatDtype } from '../../src/model/hf/dtype.ts';
import { decoderConfigFromHf } from '../../src/model/hf/decoder-config.ts';
import { writeModelFolder } from '../../src/model/hf/folder-writer.ts';
import { hfTensorSpecs } from '../../src/model/hf/hf-tensors.ts';
import { byteLevelBpe } from './hf-tokenizers.ts';

export const TINY_LLAMA_CONFIG = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  vocab_size: 512,
  hidden_size: 64,
  intermediate_size: 160,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  max_position_embeddings: 128,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  hidden_act: 'silu',
  tie_word_embeddings: false,
  bos_token_id: 0,
  eos_token_id: 2,
};

export const TINY_QWEN2_CONFIG = {
  architectures: ['Qwen2ForCausalLM'],
  model_type: 'qwen2',
  vocab_size: 512,
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 1,
  max_position_embeddings: 128,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000,
  hidden_act: 'silu',
  tie_word_embeddings: true,
  use_sliding_window: false,
};

export const TINY_GPT2_CONFIG = {
  architectures: ['GPT2LMHeadModel'],
  model_type: 'gpt2',
  vocab_size: 512,
  n_embd: 64,
  n_layer: 2,
  n_head: 4,
  n_positions: 128,
  layer_norm_epsilon: 1e-5,
  activation_function: 'gelu_new',
};

/** A deterministic generator of values in [-scale, scale). */
export function randomValues(n: number, seed: number, scale = 0.1): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = ((s >>> 0) / 2 ** 32 - 0.5) * 2 * scale;
  }
  return out;
}

const CORPUS = 'Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing particular to interest me on shore. '.repeat(4);

/** Writes a random-weight folder of `hfConfig` into `dir`; norms' weights near 1. */
export function writeRandomFolder(dir: string, hfConfig: Record<string, unknown>, options: { dtype?: FloatDtype; maxShardBytes?: number; seed?: number; scale?: number } = {}): void {
  const config = decoderConfigFromHf(hfConfig);
  const tokenizer = byteLevelBpe(CORPUS, 100);
  let seed = options.seed ?? 1;
  writeModelFolder(dir, {
    hfConfig,
    dtype: options.dtype ?? 'F32',
    maxShardBytes: options.maxShardBytes,
    overwrite: true,
    tensors: hfTensorSpecs(config).map((spec) => {
      const s = seed++;
      return {
        name: spec.name,
        shape: spec.shape,
        values: () => {
          const n = spec.shape.reduce((a, b) => a * b, 1);
          const v = randomValues(n, s * 7919, options.scale ?? 0.1);
          if (/norm|ln_/.test(spec.name) && spec.name.endsWith('weight')) for (let i = 0; i < n; i++) v[i] += 1;
          return v;
        },
      };
    }),
    files: { 'tokenizer.json': tokenizer.tokenizerJson, 'tokenizer_config.json': tokenizer.tokenizerConfig, 'generation_config.json': { eos_token_id: 2 } },
  });
}
