// Whole-model checkpoints made without an engine (random weights in the
// shapes their model names), for the model store's tests: a Nimble GPT's
// (nimble-gpt/1) and an MLP classifier's (nimble-mlp/1).
import { encodeCheckpoint, encodeMlpCheckpoint } from '../../src/model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { partCount, partParams } from '../../src/model/parts.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { mlpParamSpecs, type MlpConfig } from '../../src/model/mlp.ts';
import type { ParamSpec } from '../../src/model/params.ts';
import type { NamedTensor } from '../../src/model/safetensors.ts';

/** Tensors in the shapes `specs` name, filled from `rng`. */
function randomTensors(specs: readonly ParamSpec[], rng: () => number): NamedTensor[] {
  return specs.map((spec) => {
    const data = new Float32Array(spec.shape.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = rng() - 0.5;
    return { name: spec.name, shape: spec.shape, data };
  });
}

/** The tensors of every part of `config`, filled from `seed`. */
export function wholeModelTensors(config: GptConfig, seed: number): NamedTensor[] {
  const specs: ParamSpec[] = [];
  for (let p = 0; p < partCount(config); p++) specs.push(...partParams(config, p));
  return randomTensors(specs, mulberry32(seed));
}

/** A whole gpt-micro checkpoint (about 30 KB) at `step`, different for each seed. */
export function wholeModelBytes(seed = 1, step = 7, config: GptConfig = gptConfig('gpt-micro')): Uint8Array {
  return encodeCheckpoint(wholeModelTensors(config, seed), { config, range: { from: 0, to: partCount(config) }, step });
}

/** A small MLP classifier: 64 hashed features, one hidden layer of 16, 2 classes (1,074 parameters). */
export const SMALL_MLP: MlpConfig = { inputs: 64, hidden: [16], classes: 2 };

/** The tensors of an MLP classifier, filled from `seed`. */
export function mlpModelTensors(config: MlpConfig, seed: number): NamedTensor[] {
  return randomTensors(mlpParamSpecs(config), mulberry32(seed));
}

/** A whole MLP classifier checkpoint (nimble-mlp/1, about 4 KB for SMALL_MLP) at `step`, different for each seed. */
export function mlpModelBytes(seed = 1, step = 7, config: MlpConfig = SMALL_MLP): Uint8Array {
  return encodeMlpCheckpoint(mlpModelTensors(config, seed), { config, step });
}

/**
 * A gpt-micro built against the inference spot checks (issue 33): in each
 * block the MLP's hidden units come in identical pairs whose output weights
 * are +A·w and −A·w, so they cancel in real arithmetic and leave each kernel
 * build's own rounding (about A × 6e-8), which the next normalization
 * amplifies. A = 3e4 puts the two builds ~3e-3 apart in norm (past the
 * training checks' 1e-3); A = 1e6 puts them ~1e-2 apart in cosine.
 */
export function opposingWeightsBytes(A: number, seed = 41, config: GptConfig = gptConfig('gpt-micro')): Uint8Array {
  const tensors = wholeModelTensors(config, seed);
  const get = (name: string): Float32Array => tensors.find((t) => t.name === name)!.data;
  const C = config.channels;
  const I = get('h.0.mlp.fc.b').length;
  const half = I / 2;
  for (let l = 0; l < config.layers; l++) {
    const fc = get(`h.${l}.mlp.fc.w`);
    const fb = get(`h.${l}.mlp.fc.b`);
    const proj = get(`h.${l}.mlp.proj.w`);
    for (let k = 0; k < half; k++) {
      for (let c = 0; c < C; c++) fc[c * I + k + half] = fc[c * I + k];
      fb[k + half] = fb[k];
      for (let c = 0; c < C; c++) {
        const w = proj[k * C + c];
        proj[k * C + c] = A * w;
        proj[(k + half) * C + c] = -A * w;
      }
    }
  }
  return encodeCheckpoint(tensors, { config, range: { from: 0, to: partCount(config) }, step: 1 });
}
