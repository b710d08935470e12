// Checkpoints of a GPT stage (or the whole model) as safetensors files. The
// metadata records the config and the part range, so a loader can check that a
// file fits the stage it is loaded into. A stage can also load its own parts
// out of a whole-model checkpoint.
import { readFileSync, renameSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type { GptConfig } from './config.ts';
import type { GptStage } from './gpt.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError, type NamedTensor, type SafetensorsFile } from './safetensors.ts';

export const CHECKPOINT_FORMAT = 'nimble-gpt/1';

export interface CheckpointInfo {
  config: GptConfig;
  from: number;
  to: number;
  step: number;
}

/** The stage's parameters as named tensors (views, no copies). */
export function stageTensors(stage: GptStage): NamedTensor[] {
  return stage.layout.entries.map((e) => ({ name: e.name, shape: e.shape, data: stage.params.get(e.name).data }));
}

export function encodeStage(stage: GptStage, step = 0): Uint8Array {
  return encodeSafetensors(stageTensors(stage), {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(stage.config),
    from: String(stage.range.from),
    to: String(stage.range.to),
    step: String(step),
  });
}

/** Writes atomically (temporary file, then rename). */
export function saveStage(stage: GptStage, path: string, step = 0): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, encodeStage(stage, step));
  renameSync(tmp, path);
}

export function checkpointInfo(file: SafetensorsFile): CheckpointInfo {
  const m = file.metadata;
  if (m.format !== CHECKPOINT_FORMAT) throw new SafetensorsError(`not a Nimble GPT checkpoint (format '${m.format ?? 'none'}')`);
  let config: GptConfig;
  try {
    config = JSON.parse(m.config) as GptConfig;
  } catch {
    throw new SafetensorsError('checkpoint metadata has no valid config');
  }
  return { config, from: Number(m.from), to: Number(m.to), step: Number(m.step ?? 0) };
}

/** Copies the stage's parameters out of a decoded checkpoint that covers its parts. */
export function loadStageFrom(stage: GptStage, file: SafetensorsFile): CheckpointInfo {
  const info = checkpointInfo(file);
  if (JSON.stringify(info.config) !== JSON.stringify(stage.config)) {
    throw new SafetensorsError(`checkpoint config ${JSON.stringify(info.config)} differs from the stage's ${JSON.stringify(stage.config)}`);
  }
  if (info.from > stage.range.from || info.to < stage.range.to) {
    throw new SafetensorsError(`checkpoint holds parts [${info.from}, ${info.to}), the stage needs [${stage.range.from}, ${stage.range.to})`);
  }
  for (const e of stage.layout.entries) {
    const t = file.tensors.get(e.name);
    if (!t) throw new SafetensorsError(`checkpoint lacks ${e.name}`);
    if (t.shape.join(',') !== e.shape.join(',')) throw new SafetensorsError(`${e.name}: shape [${t.shape}] in file, [${e.shape}] expected`);
    for (let i = 0; i < t.data.length; i++) {
      if (!Number.isFinite(t.data[i])) throw new SafetensorsError(`${e.name}: non-finite value at ${i}`);
    }
    stage.params.get(e.name).data.set(t.data);
  }
  return info;
}

export function loadStage(stage: GptStage, path: string): CheckpointInfo {
  let bytes: Uint8Array;
  try {
    bytes = new Uint8Array(readFileSync(path));
  } catch {
    throw new SafetensorsError(`cannot read checkpoint ${path}`);
  }
  return loadStageFrom(stage, decodeSafetensors(bytes));
}

/** Reads only the checkpoint's metadata and validates the file. */
export function readCheckpoint(path: string): { info: CheckpointInfo; file: SafetensorsFile } {
  const file = decodeSafetensors(new Uint8Array(readFileSync(path)));
  return { info: checkpointInfo(file), file };
}
