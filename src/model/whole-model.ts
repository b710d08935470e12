// A whole-model checkpoint, as a developer publishes it: a Nimble GPT
// checkpoint (`nimble-gpt/1`, ./checkpoint.ts) that holds every part of its
// model, or an MLP classifier's (`nimble-mlp/1`, one part); either way exactly
// the tensors its model names with their shapes, all values finite. What the
// model store accepts from an upload (src/orchestrator/models/models.ts), and from a
// job's checkpoint. Besides its config and step, a whole model is known by
// its model reference (./model-ref.ts), which the store records: what serves
// models tells a classifier from a GPT by it.
import { CHECKPOINT_FORMAT, MLP_CHECKPOINT_FORMAT, modelCheckpointInfo, type ModelCheckpointInfo } from './checkpoint.ts';
import { GPT_CONFIGS, type GptConfig } from './config.ts';
import { partCount } from './parts.ts';
import { modelRefOf, stageParamSpecs } from './model-ref.ts';
import type { MlpConfig } from './mlp.ts';
import type { ParamSpec } from './params.ts';
import { SafetensorsReader } from './hf/safetensors-file.ts';
import { decodeSafetensors, SafetensorsError } from './safetensors.ts';

/** A model of either kind, by its config. */
export type WholeModelConfig = { kind: 'gpt'; config: GptConfig } | { kind: 'mlp'; config: MlpConfig };

/** A checked whole model: its kind and config, its parts (all of them), its step, and its model reference. */
export type WholeModel = ModelCheckpointInfo & {
  /** `gpt-micro`, `gpt:v256.t32.c32.l2.h4.r4`, `mlp:4096-64-2` (wholeModelRef) */
  model: string;
};

const GPT_SIZES = ['vocabSize', 'contextLength', 'channels', 'layers', 'heads', 'mlpRatio'] as const;

/**
 * The model reference of a model of either kind: a named GPT's name when its
 * sizes are that config's, else the inline form. A GPT's init rule is not
 * part of it (a reference names an architecture; trained weights are what
 * they are). Throws a ModelRefError for a config no reference can name.
 */
export function wholeModelRef(m: WholeModelConfig): string {
  if (m.kind === 'mlp') return modelRefOf({ kind: 'mlp', inputs: m.config.inputs, hidden: m.config.hidden, classes: m.config.classes });
  if (m.config.arch) return modelRefOf({ kind: 'gpt', name: null, config: m.config });
  const { vocabSize, contextLength, channels, layers, heads, mlpRatio } = m.config;
  const sizes: GptConfig = { vocabSize, contextLength, channels, layers, heads, mlpRatio };
  const name = Object.keys(GPT_CONFIGS).find((n) => GPT_SIZES.every((k) => GPT_CONFIGS[n][k] === sizes[k])) ?? null;
  return modelRefOf({ kind: 'gpt', name, config: sizes });
}

/**
 * Decodes and checks a whole-model checkpoint of either kind; a
 * SafetensorsError (400) names the first problem.
 */
export function checkWholeModel(bytes: Uint8Array): WholeModel {
  const file = decodeSafetensors(bytes);
  const { whole, specs } = checkWholeMeta(file.metadata, { names: () => file.tensors.keys(), shape: (name) => file.tensors.get(name)?.shape });
  for (const spec of specs) checkFinite(spec.name, file.tensors.get(spec.name)!.data);
  return whole;
}

/**
 * checkWholeModel of a file on disk, read one tensor at a time with the event
 * loop's turns between them (a model of gigabytes, received by an orchestrator
 * that must keep answering heartbeats: src/orchestrator/models/model-uploads.ts);
 * every value is checked, the file is never held whole.
 */
export async function checkWholeModelFile(path: string): Promise<WholeModel> {
  const reader = SafetensorsReader.open(path);
  try {
    const { whole, specs } = checkWholeMeta(reader.metadata, { names: () => reader.entries.keys(), shape: (name) => reader.entries.get(name)?.shape });
    for (const spec of specs) {
      await new Promise((r) => setImmediate(r));
      checkFinite(spec.name, reader.read(spec.name));
    }
    return whole;
  } finally {
    reader.close();
  }
}

/** The tensors of a checkpoint, however they are held: their names and shapes. */
interface TensorSet {
  names(): Iterable<string>;
  shape(name: string): readonly number[] | undefined;
}

/** The metadata (a whole model of a reference) and the tensor set (every tensor its model names, in its shape, no other), nothing read. */
function checkWholeMeta(metadata: Readonly<Record<string, string>>, tensors: TensorSet): { whole: WholeModel; specs: readonly ParamSpec[] } {
  const format = metadata.format;
  if (format !== CHECKPOINT_FORMAT && format !== MLP_CHECKPOINT_FORMAT) {
    throw new SafetensorsError(`not a Nimble checkpoint (format '${format?.slice(0, 40) ?? 'none'}'): a published model is a ${CHECKPOINT_FORMAT} (GPT) or ${MLP_CHECKPOINT_FORMAT} (MLP classifier) file`);
  }
  const info = modelCheckpointInfo({ tensors: new Map(), metadata: { ...metadata } });
  const parts = info.kind === 'gpt' ? partCount(info.config) : 1;
  if (info.from !== 0 || info.to !== parts) throw new SafetensorsError(`the checkpoint holds parts [${info.from}, ${info.to}) of ${parts}: a published model must hold all of them`);
  let model: string;
  try {
    model = wholeModelRef(info);
  } catch (err) {
    throw new SafetensorsError(`the checkpoint's model has no model reference: ${(err as Error).message}`);
  }
  const specs = stageParamSpecs(model, { from: 0, to: parts });
  const expected = new Set(specs.map((s) => s.name));
  for (const name of tensors.names()) {
    if (!expected.has(name)) throw new SafetensorsError(`the checkpoint has a tensor its model does not name: ${name.slice(0, 80)}`);
  }
  for (const spec of specs) {
    const shape = tensors.shape(spec.name);
    if (!shape) throw new SafetensorsError(`the checkpoint lacks ${spec.name}`);
    if (shape.join(',') !== spec.shape.join(',')) throw new SafetensorsError(`${spec.name}: shape [${shape.join(', ')}] in the file, [${spec.shape.join(', ')}] expected`);
  }
  return { whole: { ...info, model }, specs };
}

function checkFinite(name: string, data: Float32Array): void {
  for (let i = 0; i < data.length; i++) {
    if (!Number.isFinite(data[i])) throw new SafetensorsError(`${name}: non-finite value at ${i}`);
  }
}
