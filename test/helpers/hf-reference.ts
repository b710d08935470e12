// The cases of the PyTorch reference fixtures (test/fixtures/hf-reference/,
// written by scripts/hf-reference-fixtures.ts through scripts/hf_reference.py):
// which random-weight folder each is, so that a test can make it again.
import type { FloatDtype } from '../../src/model/hf/dtype.ts';
import { TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG } from './hf-folder.ts';

export interface ReferenceCase {
  readonly name: string;
  readonly hfConfig: Record<string, unknown>;
  readonly dtype: FloatDtype;
  readonly seed: number;
  /** the random weights' range: wide enough that the greedy tokens are far from ties */
  readonly scale: number;
}

const LLAMA3_SCALED = { ...TINY_LLAMA_CONFIG, rope_theta: 500000, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } };

export const REFERENCE_CASES: readonly ReferenceCase[] = [
  { name: 'llama-f32', hfConfig: TINY_LLAMA_CONFIG, dtype: 'F32', seed: 11, scale: 0.25 },
  { name: 'llama-bf16', hfConfig: TINY_LLAMA_CONFIG, dtype: 'BF16', seed: 11, scale: 0.25 },
  { name: 'llama3-rope-f32', hfConfig: LLAMA3_SCALED, dtype: 'F32', seed: 12, scale: 0.25 },
  { name: 'qwen2-f32', hfConfig: TINY_QWEN2_CONFIG, dtype: 'F32', seed: 13, scale: 0.25 },
  { name: 'qwen2-bf16', hfConfig: TINY_QWEN2_CONFIG, dtype: 'BF16', seed: 13, scale: 0.25 },
  { name: 'gpt2-f32', hfConfig: TINY_GPT2_CONFIG, dtype: 'F32', seed: 14, scale: 0.25 },
  { name: 'gpt2-bf16', hfConfig: TINY_GPT2_CONFIG, dtype: 'BF16', seed: 14, scale: 0.25 },
];

export const REFERENCE_PROMPT: readonly number[] = [1, 17, 300, 42, 7, 511, 256, 99];
export const REFERENCE_GREEDY_STEPS = 32;
