// Checkpoints of a GPT stage (or the whole model) as safetensors files. The
// metadata records the config and the part range, so a loader can check that a
// file fits the stage it is loaded into. A stage can also load its own parts
// out of a whole-model checkpoint.
//
// One format for every such file: a saved stage, a replica's stage state after
// a merge round (weights, the `outer.momentum` tensor and `outerStep`), and
// the whole model the orchestrator assembles. `encodeCheckpoint` writes all of
// them; `checkpointInfo` reads and validates their metadata.
import { readFileSync, renameSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { validateGptConfig, type GptConfig } from './config.ts';
import { partCount, type GptStage, type StageRange } from './gpt.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError, type NamedTensor, type SafetensorsFile } from './safetensors.ts';

export const CHECKPOINT_FORMAT = 'nimble-gpt/1';

export interface CheckpointInfo {
  config: GptConfig;
  from: number;
  to: number;
  step: number;
}

/** What a checkpoint's metadata records. */
export interface CheckpointMeta {
  config: GptConfig;
  range: StageRange;
  /** training step, or merge round for a stage state */
  step: number;
  /** further metadata, e.g. { run, rounds } or { outerStep } */
  extra?: Record<string, string>;
}

/** Metadata keys `encodeCheckpoint` writes itself; `extra` may not use them. */
const RESERVED_KEYS = ['format', 'config', 'from', 'to', 'step'];

/**
 * Encodes tensors as a checkpoint: metadata `format`, `config` (JSON), `from`,
 * `to`, `step` (decimal strings), then the `extra` keys in their order.
 */
export function encodeCheckpoint(tensors: readonly NamedTensor[], meta: CheckpointMeta): Uint8Array {
  checkMeta(meta.config, meta.range.from, meta.range.to, meta.step);
  const extra = meta.extra ?? {};
  for (const key of Object.keys(extra)) {
    if (RESERVED_KEYS.includes(key)) throw new SafetensorsError(`checkpoint metadata key '${key}' is reserved`);
  }
  return encodeSafetensors(tensors, {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(meta.config),
    from: String(meta.range.from),
    to: String(meta.range.to),
    step: String(meta.step),
    ...extra,
  });
}

/** The stage's parameters as named tensors (views, no copies). */
export function stageTensors(stage: GptStage): NamedTensor[] {
  return stage.layout.entries.map((e) => ({ name: e.name, shape: e.shape, data: stage.params.get(e.name).data }));
}

export function encodeStage(stage: GptStage, step = 0): Uint8Array {
  return encodeCheckpoint(stageTensors(stage), { config: stage.config, range: stage.range, step });
}

/** Writes atomically (temporary file, then rename). */
export function saveStage(stage: GptStage, path: string, step = 0): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, encodeStage(stage, step));
  renameSync(tmp, path);
}

/** Reads and validates a checkpoint's metadata (format, config, part range, step). */
export function checkpointInfo(file: SafetensorsFile): CheckpointInfo {
  const m = file.metadata;
  if (m.format !== CHECKPOINT_FORMAT) throw new SafetensorsError(`not a Nimble GPT checkpoint (format '${m.format ?? 'none'}')`);
  let config: unknown;
  try {
    config = JSON.parse(m.config ?? '');
  } catch {
    throw new SafetensorsError('checkpoint metadata has no valid config: not JSON');
  }
  if (typeof config !== 'object' || config === null || Array.isArray(config)) throw new SafetensorsError('checkpoint metadata has no valid config: not an object');
  const info = { config: config as GptConfig, from: metaInteger(m, 'from'), to: metaInteger(m, 'to'), step: m.step === undefined ? 0 : metaInteger(m, 'step') };
  checkMeta(info.config, info.from, info.to, info.step);
  return info;
}

/** The largest part index or step a checkpoint names (a run has at most 10 M steps). */
const MAX_META_INTEGER = 2 ** 31 - 1;

/** A metadata value that must be a non-negative integer in decimal, at most MAX_META_INTEGER. */
function metaInteger(m: Record<string, string>, key: string): number {
  const v = m[key];
  const n = typeof v === 'string' && /^[0-9]{1,10}$/.test(v) ? Number(v) : NaN;
  if (!(n <= MAX_META_INTEGER)) throw new SafetensorsError(`checkpoint metadata '${key}' is ${v === undefined ? 'missing' : `'${v.slice(0, 40)}'`}, not a non-negative integer up to ${MAX_META_INTEGER}`);
  return n;
}

/** Checks what a checkpoint's metadata describes: a valid config, a part range inside it, a step. */
function checkMeta(config: GptConfig, from: number, to: number, step: number): void {
  try {
    validateGptConfig(config);
  } catch (err) {
    throw new SafetensorsError(`checkpoint config is invalid: ${(err as Error).message}`);
  }
  if (config.init !== undefined && config.init !== 'torch' && config.init !== 'gpt2') throw new SafetensorsError(`checkpoint config is invalid: unknown init '${String(config.init)}'`);
  for (const [name, v] of [['from', from], ['to', to], ['step', step]] as const) {
    if (!Number.isSafeInteger(v) || v < 0) throw new SafetensorsError(`checkpoint ${name} ${v} is not a non-negative integer`);
  }
  const parts = partCount(config);
  if (!(from < to && to <= parts)) throw new SafetensorsError(`checkpoint parts [${from}, ${to}) do not fit a model of ${parts} parts`);
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
