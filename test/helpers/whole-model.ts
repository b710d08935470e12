// A whole-model Nimble GPT checkpoint made without an engine (random weights
// in the shapes its parts name), for the model store's tests.
import { encodeCheckpoint } from '../../src/model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { partCount, partParams } from '../../src/model/gpt.ts';
import { mulberry32 } from '../../src/model/init.ts';
import type { NamedTensor } from '../../src/model/safetensors.ts';

/** The tensors of every part of `config`, filled from `seed`. */
export function wholeModelTensors(config: GptConfig, seed: number): NamedTensor[] {
  const rng = mulberry32(seed);
  const tensors: NamedTensor[] = [];
  for (let p = 0; p < partCount(config); p++) {
    for (const spec of partParams(config, p)) {
      const data = new Float32Array(spec.shape.reduce((a, b) => a * b, 1));
      for (let i = 0; i < data.length; i++) data[i] = rng() - 0.5;
      tensors.push({ name: spec.name, shape: spec.shape, data });
    }
  }
  return tensors;
}

/** A whole gpt-micro checkpoint (about 30 KB) at `step`, different for each seed. */
export function wholeModelBytes(seed = 1, step = 7, config: GptConfig = gptConfig('gpt-micro')): Uint8Array {
  return encodeCheckpoint(wholeModelTensors(config, seed), { config, range: { from: 0, to: partCount(config) }, step });
}
