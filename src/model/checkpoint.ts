// Checkpoints of a GPT stage (or the whole model) as safetensors files. The
// metadata records the config and the part range, so a loader can check that a
// file fits the stage it is loaded into. A stage can also load its own parts
// out of a whole-model checkpoint.
//
// One format for every such file: a saved stage, a replica's stage state after
// a merge round (weights, the `outer.momentum` tensor and `outerStep`), and
// the whole model the orchestrator assembles. `encodeCheckpoint` writes all of
// them; `checkpointInfo` reads and validates their metadata.
//
// An MLP classifier (./mlp.ts) has the same kind of file with its own format
// name, `nimble-mlp/1`: metadata `config` is {inputs, hidden, classes}, and
// `from`/`to` are always 0/1 (an MLP is one part, never cut). Code that takes
// either kind goes through `modelCheckpointInfo`, `loadModelParams` and
// `encodeModelCheckpoint`, by model reference (./model-ref.ts); the GPT-only
// functions refuse an MLP file by name.
import { readFileSync, renameSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { Value } from '@sinclair/typebox/value';
import { GptConfig, validateGptConfig } from './config.ts';
import { type GptStage } from './gpt.ts';
import { partCount, type StageRange } from './parts.ts';
import { validateMlpConfig, type MlpConfig } from './mlp.ts';
import type { ModelRef } from './model-ref.ts';
import type { FlatTensors, ParamLayout } from './params.ts';
import { decodeSafetensors, encodeSafetensors, SafetensorsError, type NamedTensor, type SafetensorsFile } from './safetensors.ts';

export const CHECKPOINT_FORMAT = 'nimble-gpt/1';
export const MLP_CHECKPOINT_FORMAT = 'nimble-mlp/1';

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
  return encodeSafetensors(tensors, checkpointMetadata(meta));
}

/** The metadata `encodeCheckpoint` writes. */
function checkpointMetadata(meta: CheckpointMeta): Record<string, string> {
  checkMeta(meta.config, meta.range.from, meta.range.to, meta.step);
  const extra = checkExtra(meta.extra);
  return { format: CHECKPOINT_FORMAT, config: JSON.stringify(meta.config), from: String(meta.range.from), to: String(meta.range.to), step: String(meta.step), ...extra };
}

/** `extra` metadata, refused when it uses a key the encoder writes itself. */
function checkExtra(extra: Record<string, string> = {}): Record<string, string> {
  for (const key of Object.keys(extra)) {
    if (RESERVED_KEYS.includes(key)) throw new SafetensorsError(`checkpoint metadata key '${key}' is reserved`);
  }
  return extra;
}

/** The stage's parameters as named tensors (views, no copies). */
export function stageTensors(stage: { layout: ParamLayout; params: FlatTensors }): NamedTensor[] {
  return layoutTensors(stage.layout, stage.params.flat.data);
}

/** Flat weights laid out by `layout` as named tensors (views, no copies). */
export function layoutTensors(layout: ParamLayout, weights: Float32Array): NamedTensor[] {
  if (weights.length !== layout.size) throw new RangeError(`${weights.length} weights for a layout of ${layout.size}`);
  return layout.entries.map((e) => ({ name: e.name, shape: e.shape, data: weights.subarray(e.offset, e.offset + e.size) }));
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
  if (m.format === MLP_CHECKPOINT_FORMAT) throw new SafetensorsError(`an MLP classifier checkpoint (format '${MLP_CHECKPOINT_FORMAT}'), not a Nimble GPT checkpoint`);
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
  // the sizes passed; the rest of the config (an arch's fields) as the schema says
  if (!Value.Check(GptConfig, config)) {
    const first = Value.Errors(GptConfig, config).First();
    throw new SafetensorsError(`checkpoint config is invalid: ${first?.path || '/'} ${first?.message ?? 'does not match the schema'}`);
  }
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
  if (!sameGptConfig(info.config, stage.config)) {
    throw new SafetensorsError(`checkpoint config ${JSON.stringify(info.config)} differs from the stage's ${JSON.stringify(stage.config)}`);
  }
  if (info.from > stage.range.from || info.to < stage.range.to) {
    throw new SafetensorsError(`checkpoint holds parts [${info.from}, ${info.to}), the stage needs [${stage.range.from}, ${stage.range.to})`);
  }
  copyParams(stage.layout, stage.params.flat.data, file);
  return info;
}

/** Copies the tensors `layout` names out of a decoded checkpoint into `out` (laid out by it): each present, in its shape, finite. */
export function copyParams(layout: ParamLayout, out: Float32Array, file: SafetensorsFile): void {
  if (out.length !== layout.size) throw new RangeError(`a buffer of ${out.length} values for a layout of ${layout.size}`);
  for (const e of layout.entries) {
    const t = file.tensors.get(e.name);
    if (!t) throw new SafetensorsError(`checkpoint lacks ${e.name}`);
    if (t.shape.join(',') !== e.shape.join(',')) throw new SafetensorsError(`${e.name}: shape [${t.shape}] in file, [${e.shape}] expected`);
    for (let i = 0; i < t.data.length; i++) {
      if (!Number.isFinite(t.data[i])) throw new SafetensorsError(`${e.name}: non-finite value at ${i}`);
    }
    out.set(t.data, e.offset);
  }
}

/** Whether two configs have the same arch (or neither has one), whatever the order of their keys. */
function sameArch(a: GptConfig, b: GptConfig): boolean {
  if (!a.arch || !b.arch) return !a.arch && !b.arch;
  const x = a.arch as Record<string, unknown>, y = b.arch as Record<string, unknown>;
  const keys = new Set([...Object.keys(x), ...Object.keys(y)]);
  return [...keys].every((k) => JSON.stringify(x[k]) === JSON.stringify(y[k]));
}

/** Whether two GPT configs describe the same model (whatever the order of their keys). */
function sameGptConfig(a: GptConfig, b: GptConfig): boolean {
  const keys = ['vocabSize', 'contextLength', 'channels', 'layers', 'heads', 'mlpRatio'] as const;
  return keys.every((k) => a[k] === b[k]) && (a.init ?? 'torch') === (b.init ?? 'torch') && sameArch(a, b);
}

// ---- the MLP classifier's checkpoints, and either kind by model reference ----------------

/** What an MLP checkpoint's metadata records: the whole MLP (parts [0, 1)). */
export interface MlpCheckpointMeta {
  config: MlpConfig;
  step: number;
  extra?: Record<string, string>;
}

/** Encodes an MLP's tensors as a checkpoint: metadata `format` (nimble-mlp/1), `config`, `from` 0, `to` 1, `step`, then `extra`. */
export function encodeMlpCheckpoint(tensors: readonly NamedTensor[], meta: MlpCheckpointMeta): Uint8Array {
  return encodeSafetensors(tensors, mlpCheckpointMetadata(meta));
}

/** The metadata `encodeMlpCheckpoint` writes. */
function mlpCheckpointMetadata(meta: MlpCheckpointMeta): Record<string, string> {
  checkMlpMeta(meta.config, meta.step);
  const extra = checkExtra(meta.extra);
  const { inputs, hidden, classes } = meta.config;
  return { format: MLP_CHECKPOINT_FORMAT, config: JSON.stringify({ inputs, hidden, classes }), from: '0', to: '1', step: String(meta.step), ...extra };
}

function checkMlpMeta(config: MlpConfig, step: number): void {
  try {
    validateMlpConfig(config);
  } catch (err) {
    throw new SafetensorsError(`checkpoint config is invalid: ${(err as Error).message}`);
  }
  if (!Number.isSafeInteger(step) || step < 0) throw new SafetensorsError(`checkpoint step ${step} is not a non-negative integer`);
}

/** Reads and validates an MLP checkpoint's metadata. */
function mlpCheckpointInfo(file: SafetensorsFile): { config: MlpConfig; from: number; to: number; step: number } {
  const m = file.metadata;
  let raw: unknown;
  try {
    raw = JSON.parse(m.config ?? '');
  } catch {
    throw new SafetensorsError('checkpoint metadata has no valid config: not JSON');
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new SafetensorsError('checkpoint metadata has no valid config: not an object');
  const keys = Object.keys(raw).sort().join(',');
  if (keys !== 'classes,hidden,inputs') throw new SafetensorsError(`checkpoint config is invalid: an MLP config has exactly inputs, hidden and classes (got ${keys.slice(0, 80)})`);
  const config = raw as MlpConfig;
  const step = m.step === undefined ? 0 : metaInteger(m, 'step');
  checkMlpMeta(config, step);
  const from = metaInteger(m, 'from');
  const to = metaInteger(m, 'to');
  if (from !== 0 || to !== 1) throw new SafetensorsError(`checkpoint parts [${from}, ${to}) do not fit an MLP (one part: [0, 1))`);
  return { config: { inputs: config.inputs, hidden: [...config.hidden], classes: config.classes }, from, to, step };
}

/** A checkpoint of either kind, its metadata validated. */
export type ModelCheckpointInfo = ({ kind: 'gpt'; config: GptConfig } | { kind: 'mlp'; config: MlpConfig }) & { from: number; to: number; step: number };

/** Reads and validates a GPT or MLP checkpoint's metadata (by its format). */
export function modelCheckpointInfo(file: SafetensorsFile): ModelCheckpointInfo {
  if (file.metadata.format === MLP_CHECKPOINT_FORMAT) return { kind: 'mlp', ...mlpCheckpointInfo(file) };
  return { kind: 'gpt', ...checkpointInfo(file) };
}

/** Whether a checkpoint's model is `model` (kind and config). */
function sameModel(info: ModelCheckpointInfo, model: ModelRef): boolean {
  if (info.kind === 'gpt' && model.kind === 'gpt') return sameGptConfig(info.config, model.config);
  if (info.kind === 'mlp' && model.kind === 'mlp') {
    const a = info.config, b = model.config;
    return a.inputs === b.inputs && a.classes === b.classes && a.hidden.length === b.hidden.length && a.hidden.every((h, i) => h === b.hidden[i]);
  }
  return false;
}

/**
 * Loads the parts `range` of `model` out of a checkpoint of that model that
 * covers them, into `out` (laid out by `layout`, i.e. stageLayout(model,
 * range)). Throws a SafetensorsError naming the first problem.
 */
export function loadModelParams(model: ModelRef, range: StageRange, layout: ParamLayout, out: Float32Array, file: SafetensorsFile): ModelCheckpointInfo {
  const info = modelCheckpointInfo(file);
  if (!sameModel(info, model)) {
    const what = info.kind === 'mlp' ? 'an MLP classifier' : 'a GPT';
    throw new SafetensorsError(`the checkpoint is of ${what} ${JSON.stringify(info.config)}, not of '${model.ref}'`);
  }
  if (info.from > range.from || info.to < range.to) throw new SafetensorsError(`checkpoint holds parts [${info.from}, ${info.to}), the stage needs [${range.from}, ${range.to})`);
  copyParams(layout, out, file);
  return info;
}

/** Encodes the tensors of parts `range` of `model` as a checkpoint of its kind. */
export function encodeModelCheckpoint(model: ModelRef, tensors: readonly NamedTensor[], meta: ModelCheckpointMeta): Uint8Array {
  return encodeSafetensors(tensors, modelCheckpointMetadata(model, meta));
}

/**
 * A stage's state after merge round `round` (what a replica or, for a merged
 * round, the orchestrator saves): the stage's named tensors, the
 * `outer.momentum` tensor and `outerStep` in the metadata.
 */
export function encodeStageState(model: ModelRef, range: StageRange, tensors: readonly NamedTensor[], state: { momentum: Float32Array; outerStep: number }, round: number): Uint8Array {
  return encodeModelCheckpoint(model, [...tensors, { name: 'outer.momentum', shape: [state.momentum.length], data: state.momentum }], {
    range,
    step: round,
    extra: { outerStep: String(state.outerStep) },
  });
}

/** What a checkpoint of either kind records: its parts, its step, further metadata. */
export interface ModelCheckpointMeta {
  range: StageRange;
  step: number;
  extra?: Record<string, string>;
}

/** The metadata `encodeModelCheckpoint` writes (what a loader validates), for a checkpoint held decoded. */
export function modelCheckpointMetadata(model: ModelRef, meta: ModelCheckpointMeta): Record<string, string> {
  if (model.kind === 'gpt') return checkpointMetadata({ config: model.config, range: meta.range, step: meta.step, extra: meta.extra });
  if (meta.range.from !== 0 || meta.range.to !== 1) throw new SafetensorsError(`an MLP is one part: parts [${meta.range.from}, ${meta.range.to}) do not fit it`);
  return mlpCheckpointMetadata({ config: model.config, step: meta.step, extra: meta.extra });
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
