// GPT sizes the simulator knows by name: the project's real configs
// (src/model/config.ts) and larger ones up to 100B parameters, shaped like
// published GPTs (a BPE vocabulary of 50,304 = GPT-2's 50,257 padded to a
// multiple of 64, context 2048, head size 128 from 1B up, MLP ratio 4).
// Only the planner's cost model reads them: nothing here is allocated.
import { GPT_CONFIGS, validateGptShape, type GptConfig } from '../model/config.ts';
import { partCount, partParamCount } from '../model/parts.ts';

/** Sizes beyond the trainable configs (parameters as counted by src/model/gpt.ts). */
export const LARGE_GPT_CONFIGS: Record<string, GptConfig> = {
  /** 163 M parameters: GPT-2 small's shape (124 M) with the head untied from the embedding, as here */
  'gpt-125m': { vocabSize: 50_304, contextLength: 1024, channels: 768, layers: 12, heads: 12, mlpRatio: 4 },
  /** 1.22 B */
  'gpt-1b': { vocabSize: 50_304, contextLength: 2048, channels: 2048, layers: 20, heads: 16, mlpRatio: 4 },
  /** 10.59 B */
  'gpt-10b': { vocabSize: 50_304, contextLength: 2048, channels: 5120, layers: 32, heads: 40, mlpRatio: 4 },
  /** 101.7 B */
  'gpt-100b': { vocabSize: 50_304, contextLength: 2048, channels: 10_240, layers: 80, heads: 80, mlpRatio: 4 },
};

/** Every model name the simulator accepts. */
export function simModelNames(): string[] {
  return [...Object.keys(GPT_CONFIGS), ...Object.keys(LARGE_GPT_CONFIGS)];
}

/** The config of a named model; throws naming the known ones. */
export function simModel(name: string): GptConfig {
  const config = GPT_CONFIGS[name] ?? LARGE_GPT_CONFIGS[name];
  if (!config) throw new Error(`unknown model '${name}' (known: ${simModelNames().join(', ')})`);
  validateGptShape(config);
  return config;
}

/** Parameters of the whole model. */
export function modelParams(config: GptConfig): number {
  let n = 0;
  for (let p = 0; p < partCount(config); p++) n += partParamCount(config, p);
  return n;
}
