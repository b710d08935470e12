// A model reference: the one string a run, a stage assignment and a view carry
// to say what is trained. Three forms, each canonical (one string per model):
//
//   gpt-tiny                    a named GPT (GPT_CONFIGS in ./config.ts)
//   gpt:v256.t64.c128.l4.h4.r4  an inline GPT: vocabulary, context, channels,
//                               layers, heads, MLP ratio, in that order
//   mlp:4096-64-2               an MLP classifier: inputs, hidden widths…, classes
//                               (`mlp:4096-2` has no hidden layer)
//   llama:v…, qwen2:v…, gpt2:v…  a decoder with an arch (Llama, Qwen2, GPT-2
//                               from a Hugging Face folder): ./arch-ref.ts
//
// `parseModelRef` is the only way from a string to a model: it validates what
// the network sends (length, form, integer sizes without leading zeros, the
// limits and divisibility the kernels rely on) and throws a ModelRefError
// naming the problem. `modelRefOf` builds the string from a job's resolved
// model. Whatever needs a model's sizes (parts, parameters of a range of
// parts, its parameter layout, items per microbatch) asks this module, so a
// GPT and an MLP answer the same questions: an MLP is one part, never cut into
// stages; a run of it has one stage, its replicas data-parallel.
import { NimbleError } from '../protocol/errors.ts';
import { archModelRef, isArchRef, parseArchRef } from './arch-ref.ts';
import { GPT_CONFIGS, validateGptConfig, type GptConfig } from './config.ts';
import { partCount, partParams, rangeParamCount, type StageRange } from './parts.ts';
import { initParams } from './init.ts';
import { mlpParamCountOf, mlpParamSpecs, validateMlpConfig, type MlpConfig } from './mlp.ts';
import { ParamLayout, type ParamSpec } from './params.ts';

/** A parsed model reference. `ref` is its canonical string. */
export type ModelRef =
  | { kind: 'gpt'; ref: string; /** the GPT_CONFIGS name, or null for an inline config */ name: string | null; config: GptConfig }
  | { kind: 'mlp'; ref: string; config: MlpConfig };

/** A model as a job resolves it (src/jobs/spec.ts `JobModel`). */
export type ModelDescription = { kind: 'gpt'; name: string | null; config: GptConfig } | { kind: 'mlp'; inputs: number; hidden: number[]; classes: number };

/** The longest reference: an MLP with 16 hidden layers of the largest widths is about 115 characters, a Llama with llama3 rope scaling about 110. */
export const MAX_MODEL_REF_LENGTH = 160;

/** A model reference that names no model this build can run: a 400 'invalid'. */
export class ModelRefError extends NimbleError {
  override readonly name = 'ModelRefError';
  constructor(message: string) {
    super('invalid', message);
  }
}

const GPT_PREFIX = 'gpt:';
const MLP_PREFIX = 'mlp:';
/** A size in a reference: decimal, no sign, no leading zero, at most 7 digits (every limit is below 10⁷). */
const SIZE = /^[1-9][0-9]{0,6}$/;
const GPT_FIELDS = [
  ['v', 'vocabSize'],
  ['t', 'contextLength'],
  ['c', 'channels'],
  ['l', 'layers'],
  ['h', 'heads'],
  ['r', 'mlpRatio'],
] as const;

/** The canonical reference of an inline GPT config (a named config's inline form too). */
export function gptModelRef(config: GptConfig): string {
  if (config.arch) return archModelRef(config);
  if (config.init !== undefined) throw new ModelRefError(`a model reference carries no init rule (got '${config.init}'): only the default initialisation trains on the network`);
  return GPT_PREFIX + GPT_FIELDS.map(([letter, key]) => `${letter}${config[key]}`).join('.');
}

/** The canonical reference of an MLP. */
export function mlpModelRef(config: MlpConfig): string {
  return MLP_PREFIX + [config.inputs, ...config.hidden, config.classes].join('-');
}

/** The reference of a job's resolved model: its name for a named GPT, else the inline form. */
export function modelRefOf(model: ModelDescription): string {
  if (model.kind === 'mlp') return parseModelRef(mlpModelRef({ inputs: model.inputs, hidden: model.hidden, classes: model.classes })).ref;
  if (model.name !== null && GPT_CONFIGS[model.name]) return model.name;
  return parseModelRef(gptModelRef(model.config)).ref;
}

function size(text: string, what: string, ref: string): number {
  if (!SIZE.test(text)) throw new ModelRefError(`model '${ref}': ${what} '${text.slice(0, 16)}' is not a positive integer (decimal, no leading zero)`);
  return Number(text);
}

/** Parses and validates a model reference (see the file header); throws a ModelRefError. */
export function parseModelRef(ref: unknown): ModelRef {
  if (typeof ref !== 'string' || ref.length === 0) throw new ModelRefError('a model reference must be a non-empty string');
  const shown = ref.length > 48 ? `${ref.slice(0, 48)}…` : ref;
  if (ref.length > MAX_MODEL_REF_LENGTH) throw new ModelRefError(`model '${shown}' is ${ref.length} characters; a model reference has at most ${MAX_MODEL_REF_LENGTH}`);
  const named = Object.hasOwn(GPT_CONFIGS, ref) ? GPT_CONFIGS[ref] : undefined;
  if (named) return { kind: 'gpt', ref, name: ref, config: named };
  if (ref.startsWith(GPT_PREFIX)) {
    const fields = ref.slice(GPT_PREFIX.length).split('.');
    if (fields.length !== GPT_FIELDS.length) throw new ModelRefError(`model '${shown}': an inline GPT is gpt:v<vocab>.t<context>.c<channels>.l<layers>.h<heads>.r<mlp ratio>`);
    const config = {} as Record<(typeof GPT_FIELDS)[number][1], number>;
    GPT_FIELDS.forEach(([letter, key], i) => {
      if (fields[i][0] !== letter) throw new ModelRefError(`model '${shown}': field ${i + 1} must start with '${letter}' (${key})`);
      config[key] = size(fields[i].slice(1), key, shown);
    });
    try {
      validateGptConfig(config);
    } catch (err) {
      throw new ModelRefError(`model '${shown}': ${(err as Error).message}`);
    }
    return { kind: 'gpt', ref, name: null, config };
  }
  if (isArchRef(ref)) {
    let config: GptConfig;
    try {
      config = parseArchRef(ref);
      validateGptConfig(config);
    } catch (err) {
      throw new ModelRefError(`model '${shown}': ${(err as Error).message}`);
    }
    return { kind: 'gpt', ref, name: null, config };
  }
  if (ref.startsWith(MLP_PREFIX)) {
    const widths = ref.slice(MLP_PREFIX.length).split('-');
    if (widths.length < 2) throw new ModelRefError(`model '${shown}': an MLP is mlp:<inputs>-<hidden>-…-<classes>`);
    const sizes = widths.map((w, i) => size(w, i === 0 ? 'inputs' : i === widths.length - 1 ? 'classes' : `hidden width ${i}`, shown));
    const config: MlpConfig = { inputs: sizes[0], hidden: sizes.slice(1, -1), classes: sizes[sizes.length - 1] };
    try {
      validateMlpConfig(config);
    } catch (err) {
      throw new ModelRefError(`model '${shown}': ${(err as Error).message}`);
    }
    return { kind: 'mlp', ref, config };
  }
  throw new ModelRefError(`unknown model '${shown}' (a named GPT: ${Object.keys(GPT_CONFIGS).join(', ')}; an inline GPT: gpt:v…; an MLP: mlp:…; a Hugging Face decoder: llama:v…, qwen2:v…, gpt2:v…)`);
}

/** `model` parsed unless it is already. */
function asRef(model: ModelRef | string): ModelRef {
  return typeof model === 'string' ? parseModelRef(model) : model;
}

/** The GPT config of a GPT reference; a ModelRefError for an MLP. */
export function gptConfigOf(model: ModelRef | string): GptConfig {
  const m = asRef(model);
  if (m.kind !== 'gpt') throw new ModelRefError(`model '${m.ref}' is an MLP classifier, not a GPT`);
  return m.config;
}

/** Parts a model is made of: the embedding, blocks and head of a GPT; 1 for an MLP (never cut). */
export function modelParts(model: ModelRef | string): number {
  const m = asRef(model);
  return m.kind === 'gpt' ? partCount(m.config) : 1;
}

/** Checks that `range` is parts of the model. */
function checkRange(m: ModelRef, range: StageRange): void {
  const parts = modelParts(m);
  if (!(Number.isInteger(range.from) && Number.isInteger(range.to) && 0 <= range.from && range.from < range.to && range.to <= parts)) {
    throw new ModelRefError(`parts [${range.from}, ${range.to}) are not parts of '${m.ref}' (${parts} part${parts === 1 ? '' : 's'})`);
  }
}

/** Parameter specs of the parts [from, to) of the model, named as in its checkpoints. */
export function stageParamSpecs(model: ModelRef | string, range: StageRange): ParamSpec[] {
  const m = asRef(model);
  checkRange(m, range);
  if (m.kind === 'mlp') return mlpParamSpecs(m.config);
  const specs: ParamSpec[] = [];
  for (let p = range.from; p < range.to; p++) specs.push(...partParams(m.config, p));
  return specs;
}

/** The flat parameter layout of the parts [from, to), as the stage holding them lays out its buffer. */
export function stageLayout(model: ModelRef | string, range: StageRange): ParamLayout {
  return new ParamLayout(stageParamSpecs(model, range));
}

/** The parts' layout and their initial weights from `seed`, in host memory: the values the WASM stage (or MLP) starts from, whichever backend trains it. */
export function stageWeights(model: ModelRef | string, range: StageRange, seed: number): { layout: ParamLayout; weights: Float32Array } {
  const layout = stageLayout(model, range);
  const weights = new Float32Array(layout.size);
  initParams(layout, weights, seed);
  return { layout, weights };
}

/** Parameters of the parts [from, to). */
export function rangeParams(model: ModelRef | string, range: StageRange): number {
  const m = asRef(model);
  checkRange(m, range);
  return m.kind === 'gpt' ? rangeParamCount(m.config, range) : mlpParamCountOf(m.config);
}

/** Items one microbatch of `batchSize` trains on: tokens for a GPT (sequences × context), examples for an MLP. */
export function itemsPerMicrobatch(model: ModelRef | string, batchSize: number): number {
  const m = asRef(model);
  return m.kind === 'gpt' ? batchSize * m.config.contextLength : batchSize;
}

/** How messages name the model: `gpt-tiny`, `GPT gpt:v…`, `MLP 4096→64→2`. */
export function modelLabel(model: ModelRef | string): string {
  const m = asRef(model);
  if (m.kind === 'mlp') return `MLP ${[m.config.inputs, ...m.config.hidden, m.config.classes].join('→')}`;
  return m.name ?? `GPT ${m.ref}`;
}
