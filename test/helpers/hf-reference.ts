// The cases of the PyTorch reference fixtures (test/fixtures/hf-reference/,
// written by scripts/hf-reference-fixtures.ts through scripts/hf_reference.py):
// which random-weight folder each is, so that a test can make it again; and
// the LoRA cases, a random adapter in PEFT's layout over one of them.
import type { GptConfig } from '../../src/model/config.ts';
import type { FloatDtype } from '../../src/model/hf/dtype.ts';
import { writePeftAdapter } from '../../src/model/hf/peft.ts';
import { loraLayout, type LoraSpec } from '../../src/model/lora.ts';
import { partCount } from '../../src/model/parts.ts';
import { randomValues, TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG } from './hf-folder.ts';

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

/** A LoRA case: a random adapter in PEFT's layout (A and B random, so the update is far from zero) over one of REFERENCE_CASES' folders. */
export interface LoraReferenceCase {
  readonly name: string;
  /** the base folder's case */
  readonly base: ReferenceCase;
  readonly spec: LoraSpec;
  readonly seed: number;
  readonly scale: number;
}

const baseCase = (name: string): ReferenceCase => REFERENCE_CASES.find((c) => c.name === name)!;

export const LORA_REFERENCE_CASES: readonly LoraReferenceCase[] = [
  { name: 'llama-lora-f32', base: baseCase('llama-f32'), spec: { rank: 4, alpha: 8, dropout: 0.05, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] }, seed: 21, scale: 0.1 },
  { name: 'qwen2-lora-f32', base: baseCase('qwen2-f32'), spec: { rank: 2, alpha: 4, dropout: 0, targets: ['q_proj', 'v_proj'] }, seed: 22, scale: 0.2 },
  { name: 'gpt2-lora-f32', base: baseCase('gpt2-f32'), spec: { rank: 4, alpha: 16, dropout: 0.1, targets: ['c_attn', 'c_proj', 'c_fc'] }, seed: 23, scale: 0.05 },
];

/** Writes a LoRA case's random adapter folder (PEFT's layout) for the base `config` into `dir`. */
export function writeRandomAdapter(dir: string, config: GptConfig, c: LoraReferenceCase): void {
  const size = loraLayout(config, c.spec, { from: 0, to: partCount(config) }).size;
  writePeftAdapter(dir, config, { spec: c.spec, adapters: randomValues(size, c.seed * 104729, c.scale), baseModel: c.base.name, overwrite: true });
}
