// Where a stage's inference weights come from: a GptStage in memory (a model
// just trained, or a miner's stage), or a checkpoint file holding the stage's
// parts (a published whole model holds every part). Either way the weights are
// copied into the stage's own buffer, laid out as the GptStage lays them out.
import type { Engine } from '../engine/engine.ts';
import { checkpointInfo, copyParams } from '../model/checkpoint.ts';
import type { GptStage } from '../model/gpt.ts';
import type { StageRange } from '../model/parts.ts';
import { decodeSafetensors, SafetensorsError, type SafetensorsFile } from '../model/safetensors.ts';
import { StageInference, stageParamLayout, type StageInferenceOptions } from './stage-inference.ts';

/** The inference path of a GptStage's parts, with a copy of its current weights. */
export function inferenceFromStage(engine: Engine, stage: GptStage, options: StageInferenceOptions = {}): StageInference {
  return new StageInference(engine, stage.config, stage.range, stage.params.flat.data, options);
}

/**
 * The inference path of parts `range` (default: every part the file holds)
 * of a Nimble GPT checkpoint, given as bytes or decoded. Throws a
 * SafetensorsError naming the first problem (format, config, missing parts,
 * shapes, non-finite values).
 */
export function inferenceFromCheckpoint(
  engine: Engine, checkpoint: Uint8Array | SafetensorsFile, range?: StageRange, options: StageInferenceOptions = {},
): StageInference {
  const file = checkpoint instanceof Uint8Array ? decodeSafetensors(checkpoint) : checkpoint;
  const info = checkpointInfo(file);
  const want = range ?? { from: info.from, to: info.to };
  if (info.from > want.from || info.to < want.to) throw new SafetensorsError(`checkpoint holds parts [${info.from}, ${info.to}), the stage needs [${want.from}, ${want.to})`);
  const layout = stageParamLayout(info.config, want);
  const weights = new Float32Array(layout.size);
  copyParams(layout, weights, file);
  return new StageInference(engine, info.config, want, weights, options);
}
