// LoRA adapters in Hugging Face PEFT's layout: a folder with
// `adapter_config.json` and `adapter_model.safetensors`, which Python's peft
// loads (PeftModel.from_pretrained) over the base model.
//
// - adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
//   lora_dropout, target_modules, bias "none", fan_in_fan_out (true for
//   GPT-2, whose Conv1D stores its weight [in, out]: it only orients PEFT's
//   merge, the adapters' shapes are the same), base_model_name_or_path.
// - adapter_model.safetensors: per adapted module
//   `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [r, in]
//   and `…lora_B.weight` [out, r] (Llama, Qwen2), or
//   `base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight` (GPT-2):
//   PEFT's module name with the adapter's name ("default") removed, as its
//   get_peft_model_state_dict saves them. The engine keeps A and B in these
//   same orientations (../lora.ts), so a tensor is copied as it is.
//
// Reading checks everything against the base model's config: the config's
// fields (what this engine does not do, such as DoRA, rsLoRA, per-layer
// ranks or extra trained modules, is refused by name), every expected tensor
// present with its shape, no other tensor, finite values. The first problem
// is one LoraError naming the file and what is wrong.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { GptConfig } from '../config.ts';
import { loraLayout, loraParamName, loraSites, LoraError, validateLoraSpec, type LoraSite, type LoraSpec } from '../lora.ts';
import type { ParamLayout } from '../params.ts';
import { partCount } from '../parts.ts';
import { resolveArch } from '../arch.ts';
import type { FloatDtype } from './dtype.ts';
import { SafetensorsReader, writeSafetensorsFile } from './safetensors-file.ts';

export const ADAPTER_CONFIG = 'adapter_config.json';
export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';
const MAX_CONFIG_BYTES = 1 << 20;

/** PEFT's name of block `layer`'s A or B at `site`. */
export function peftTensorName(config: GptConfig, layer: number, site: LoraSite, which: 'A' | 'B'): string {
  const prefix = resolveArch(config).family === 'gpt2' ? 'base_model.model.transformer.h.' : 'base_model.model.model.layers.';
  return `${prefix}${layer}.${site.module}.lora_${which}.weight`;
}

/** The whole model's adapters: engine name, PEFT name and shape of each, in layout order. */
function adapterTensors(config: GptConfig, spec: LoraSpec): { layout: ParamLayout; tensors: { engine: string; peft: string; shape: number[] }[] } {
  const layout = loraLayout(config, spec, { from: 0, to: partCount(config) });
  const tensors: { engine: string; peft: string; shape: number[] }[] = [];
  for (let l = 0; l < config.layers; l++) {
    for (const site of loraSites(config, spec)) {
      for (const which of ['A', 'B'] as const) {
        const engine = loraParamName(l, site, which);
        tensors.push({ engine, peft: peftTensorName(config, l, site, which), shape: layout.byName.get(engine)!.shape });
      }
    }
  }
  return { layout, tensors };
}

/** adapter_config.json of a spec over a base model. */
export function peftAdapterConfig(config: GptConfig, spec: LoraSpec, baseModel: string | null): Record<string, unknown> {
  const s = validateLoraSpec(spec, config);
  return {
    peft_type: 'LORA', task_type: 'CAUSAL_LM', base_model_name_or_path: baseModel, inference_mode: true,
    r: s.rank, lora_alpha: s.alpha, lora_dropout: s.dropout, target_modules: [...s.targets], bias: 'none',
    fan_in_fan_out: resolveArch(config).family === 'gpt2', init_lora_weights: true, modules_to_save: null,
    layers_to_transform: null, layers_pattern: null, rank_pattern: {}, alpha_pattern: {}, use_rslora: false, use_dora: false,
  };
}

export interface PeftAdapterContents {
  spec: LoraSpec;
  /** the whole model's adapters, laid out by loraLayout(config, spec, every part) */
  adapters: Float32Array;
  /** what adapter_config.json names as the base (a Hugging Face id, a path, a model reference) */
  baseModel: string | null;
  dtype?: FloatDtype;
  /** replace `dir` when it exists (default: refuse a folder that is not empty) */
  overwrite?: boolean;
}

/**
 * Writes an adapter folder at `dir`, under a temporary name beside it renamed
 * at the end (a failure leaves nothing). Returns the bytes of adapter_model.safetensors.
 */
export function writePeftAdapter(dir: string, config: GptConfig, contents: PeftAdapterContents): number {
  const spec = validateLoraSpec(contents.spec, config);
  const { layout, tensors } = adapterTensors(config, spec);
  if (contents.adapters.length !== layout.size) throw new LoraError(`adapter export: ${contents.adapters.length} values where the spec takes ${layout.size}`);
  if (existsSync(dir) && !contents.overwrite && (!statSync(dir).isDirectory() || readdirSync(dir).length > 0)) throw new LoraError(`${dir} exists and is not empty: choose another folder, or remove it first`);
  const tmp = `${dir}.partial-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    const bytes = writeSafetensorsFile(join(tmp, ADAPTER_WEIGHTS), tensors.map((t) => {
      const e = layout.byName.get(t.engine)!;
      return { name: t.peft, shape: t.shape, values: () => contents.adapters.subarray(e.offset, e.offset + e.size) };
    }), contents.dtype ?? 'F32', { format: 'pt' });
    writeFileSync(join(tmp, ADAPTER_CONFIG), JSON.stringify(peftAdapterConfig(config, spec, contents.baseModel), null, 2) + '\n');
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
    return bytes;
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw err;
  }
}

/** A field of adapter_config.json that must be absent or have a value this engine does the same as. */
function refuseUnless(cfg: Record<string, unknown>, key: string, ok: (v: unknown) => boolean, why: string): void {
  if (key in cfg && !ok(cfg[key])) throw new LoraError(`${ADAPTER_CONFIG}: ${key} ${JSON.stringify(cfg[key]).slice(0, 80)}: ${why}`);
}

const isEmpty = (v: unknown): boolean => v === null || v === undefined || (Array.isArray(v) && v.length === 0) || (typeof v === 'object' && v !== null && Object.keys(v).length === 0);

/** The spec and base model an adapter_config.json describes, checked against the base model's config. */
export function parsePeftAdapterConfig(raw: unknown, config: GptConfig): { spec: LoraSpec; baseModel: string | null } {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new LoraError(`${ADAPTER_CONFIG}: not a JSON object`);
  const cfg = raw as Record<string, unknown>;
  if (cfg.peft_type !== 'LORA') throw new LoraError(`${ADAPTER_CONFIG}: peft_type ${JSON.stringify(cfg.peft_type)}: only LORA adapters are read`);
  refuseUnless(cfg, 'task_type', (v) => v === 'CAUSAL_LM' || v === null, 'the engine runs causal language models (CAUSAL_LM)');
  refuseUnless(cfg, 'bias', (v) => v === 'none', 'trained biases are not supported (bias "none")');
  refuseUnless(cfg, 'use_dora', (v) => v === false, 'DoRA is not supported');
  refuseUnless(cfg, 'use_rslora', (v) => v === false, 'rank-stabilised scaling is not supported');
  refuseUnless(cfg, 'rank_pattern', isEmpty, 'per-module ranks are not supported');
  refuseUnless(cfg, 'alpha_pattern', isEmpty, 'per-module alphas are not supported');
  refuseUnless(cfg, 'layers_to_transform', (v) => v === null, 'adapters on some layers only are not supported');
  refuseUnless(cfg, 'modules_to_save', isEmpty, 'extra trained modules are not supported');
  refuseUnless(cfg, 'fan_in_fan_out', (v) => typeof v === 'boolean', 'must be true or false');
  refuseUnless(cfg, 'base_model_name_or_path', (v) => v === null || (typeof v === 'string' && v.length <= 4096), 'must be a string');
  if (!Array.isArray(cfg.target_modules)) throw new LoraError(`${ADAPTER_CONFIG}: target_modules must be a list of module names (a regular expression or "all-linear" is not supported)`);
  let spec: LoraSpec;
  try {
    spec = validateLoraSpec({ rank: cfg.r, alpha: cfg.lora_alpha, dropout: cfg.lora_dropout ?? 0, targets: cfg.target_modules }, config);
  } catch (err) {
    const why = (err as Error).message.replace(/^lora spec: /, '').replace(/\/rank/, 'r').replace(/\/alpha/, 'lora_alpha').replace(/\/dropout/, 'lora_dropout').replace(/\/targets/, 'target_modules');
    throw new LoraError(`${ADAPTER_CONFIG}: ${why}`);
  }
  return { spec, baseModel: (cfg.base_model_name_or_path as string | null | undefined) ?? null };
}

export interface PeftAdapter {
  spec: LoraSpec;
  baseModel: string | null;
  /** the whole model's adapters, laid out by `layout` (loraLayout over every part) */
  adapters: Float32Array;
  layout: ParamLayout;
}

/** Reads and checks the adapter folder `dir` against the base model's config. */
export function readPeftAdapter(dir: string, config: GptConfig): PeftAdapter {
  const cfgPath = join(dir, ADAPTER_CONFIG);
  if (!existsSync(cfgPath)) throw new LoraError(`${ADAPTER_CONFIG}: missing from ${dir}`);
  const size = statSync(cfgPath).size;
  if (size > MAX_CONFIG_BYTES) throw new LoraError(`${ADAPTER_CONFIG}: ${size} bytes, more than ${MAX_CONFIG_BYTES}`);
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(cfgPath, 'utf8'));
  } catch (err) {
    throw new LoraError(`${ADAPTER_CONFIG}: not valid JSON (${(err as Error).message})`);
  }
  const { spec, baseModel } = parsePeftAdapterConfig(raw, config);
  const { layout, tensors } = adapterTensors(config, spec);
  const path = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(path)) throw new LoraError(`${ADAPTER_WEIGHTS}: missing from ${dir} (adapter_model.bin, PyTorch's pickle, is not read)`);
  let reader: SafetensorsReader;
  try {
    reader = SafetensorsReader.open(path);
  } catch (err) {
    throw new LoraError(`${ADAPTER_WEIGHTS}: ${(err as Error).message}`);
  }
  try {
    const expected = new Set(tensors.map((t) => t.peft));
    for (const name of reader.entries.keys()) {
      if (!expected.has(name)) throw new LoraError(`${ADAPTER_WEIGHTS}: unexpected tensor ${name.slice(0, 200)} (for r ${spec.rank} on ${spec.targets.join(', ')} of a ${config.layers}-layer ${resolveArch(config).family})`);
    }
    const adapters = new Float32Array(layout.size);
    for (const t of tensors) {
      const e = reader.entries.get(t.peft);
      if (!e) throw new LoraError(`${ADAPTER_WEIGHTS}: missing tensor ${t.peft}`);
      if (e.shape.length !== 2 || e.shape[0] !== t.shape[0] || e.shape[1] !== t.shape[1]) throw new LoraError(`${ADAPTER_WEIGHTS}: ${t.peft} has shape [${e.shape.join(', ')}] where the base model takes [${t.shape.join(', ')}]`);
      let values: Float32Array;
      try {
        values = reader.read(t.peft);
      } catch (err) {
        throw new LoraError(`${ADAPTER_WEIGHTS}: ${(err as Error).message}`);
      }
      for (let i = 0; i < values.length; i++) if (!Number.isFinite(values[i])) throw new LoraError(`${ADAPTER_WEIGHTS}: ${t.peft} has a non-finite value at ${i}`);
      adapters.set(values, layout.byName.get(t.engine)!.offset);
    }
    return { spec, baseModel, adapters, layout };
  } finally {
    reader.close();
  }
}
