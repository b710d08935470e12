// Where a stage's inference weights come from: a GptStage in memory (a model
// just trained, or a miner's stage), or a checkpoint file holding the stage's
// parts (a published whole model holds every part), as bytes or on disk. Either
// way the weights are copied into the stage's own buffer, laid out as the
// GptStage lays them out. From disk only the stage's own tensors are read, one
// at a time (a miner holding 1 of 4 stages of a 1.1B model reads a quarter of
// its file and never holds it whole).
import type { Engine } from '../engine/engine.ts';
import { checkpointInfo, copyParams } from '../model/checkpoint.ts';
import type { GptStage } from '../model/gpt.ts';
import type { StageRange } from '../model/parts.ts';
import { SafetensorsReader } from '../model/hf/safetensors-file.ts';
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

/**
 * The inference path of parts `range` of a Nimble GPT checkpoint on disk,
 * reading only those parts' tensors (in F32, F16 or BF16), each checked for
 * its shape and finite values, one at a time with the event loop's turns
 * between them. Rejects with a SafetensorsError naming the problem.
 */
export async function inferenceFromFile(engine: Engine, path: string, range?: StageRange, options: StageInferenceOptions = {}): Promise<StageInference> {
  const reader = SafetensorsReader.open(path);
  try {
    const info = checkpointInfo({ tensors: new Map(), metadata: { ...reader.metadata } });
    const want = range ?? { from: info.from, to: info.to };
    if (info.from > want.from || info.to < want.to) throw new SafetensorsError(`checkpoint holds parts [${info.from}, ${info.to}), the stage needs [${want.from}, ${want.to})`);
    const layout = stageParamLayout(info.config, want);
    const weights = new Float32Array(layout.size);
    for (const e of layout.entries) {
      const t = reader.entries.get(e.name);
      if (!t) throw new SafetensorsError(`checkpoint lacks ${e.name}`);
      if (t.shape.join(',') !== e.shape.join(',')) throw new SafetensorsError(`${e.name}: shape [${t.shape}] in file, [${e.shape}] expected`);
      // a turn of the event loop between tensors: a miner loading a quarter of a 1.1B model keeps heartbeating (the
      // orchestrator lets a miner go after 4 s without one)
      await new Promise((r) => setImmediate(r));
      const values = reader.read(e.name);
      for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i])) throw new SafetensorsError(`${e.name}: non-finite value at ${i}`);
      weights.set(values, e.offset);
    }
    return new StageInference(engine, info.config, want, weights, options);
  } finally {
    reader.close();
  }
}
