// LoRA (Hu et al., 2021), as Hugging Face's PEFT builds it: a frozen linear
// y = x Wᵀ + b gains a low-rank update, y += (alpha / r) · dropout(x) Aᵀ Bᵀ,
// with A [r, in] (kaiming-uniform, a = √5: uniform ±1/√in) and B [out, r]
// (zeros, so a new adapter leaves the model as it was). Only A and B train.
//
// This module is the spec and the names: which engine linear (and which of
// its output columns) each target adapts, the adapters' parameter specs per
// block, and their layout. The engine fuses q, k and v into one attn.qkv and
// gate and up into one mlp.fc (./parts.ts), so an adapter on q_proj is an
// adapter on q's column block of the fused output: its B has q's rows only.
// The forward and backward are ./lora-linear.ts's; merging into the base
// weights ./lora-merge.ts's; PEFT's files ./hf/peft.ts's.
//
// Engine names: `h.{l}.lora.{module}.A` and `.B`, with module the Hugging
// Face module inside the block (`self_attn.q_proj`, `mlp.down_proj`,
// `attn.c_attn`, `mlp.c_proj`, …): PEFT's name is a prefix away.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { NimbleError } from '../protocol/errors.ts';
import { blockWidths, resolveArch, type DecoderArch } from './arch.ts';
import type { GptConfig } from './config.ts';
import { ParamLayout, type ParamSpec } from './params.ts';
import { rangeParts, type StageRange } from './parts.ts';

/** How a fine-tune adapts a model: the rank r, alpha (the update is scaled by alpha / r), the dropout on the adapters' input, the modules adapted. */
export const LoraSpec = Type.Object({
  rank: Type.Integer({ minimum: 1, maximum: 4096 }),
  alpha: Type.Number({ exclusiveMinimum: 0, maximum: 1e6 }),
  dropout: Type.Number({ minimum: 0, exclusiveMaximum: 1 }),
  targets: Type.Array(Type.String({ maxLength: 32 }), { minItems: 1, maxItems: 8 }),
});
export type LoraSpec = Static<typeof LoraSpec>;

/** An adapter file or spec that does not fit the model: 400 when it came from a peer. */
export class LoraError extends NimbleError {
  override readonly name = 'LoraError';
  constructor(message: string) {
    super('bad_adapter', message, 400);
  }
}

/** The engine's linears of a block (./parts.ts: `h.l.{linear}.w`). */
export type LinearName = 'attn.qkv' | 'attn.proj' | 'mlp.fc' | 'mlp.proj';

/** One adapted module of a block: the engine linear it adds to, and where. */
export interface LoraSite {
  /** the spec's target (q_proj, c_proj, …) */
  target: string;
  /** the Hugging Face module inside the block (self_attn.q_proj, mlp.c_proj, …) */
  module: string;
  linear: LinearName;
  /** the first output column of the engine linear it adds to, and how many (B's rows) */
  col: number;
  width: number;
  /** the linear's input width (A's columns) */
  inFeatures: number;
}

/** The targets a family's spec may name, in the order a block's adapters are laid out. */
export function loraTargets(arch: DecoderArch): readonly string[] {
  return arch.family === 'gpt2' ? ['c_attn', 'c_proj', 'c_fc'] : ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];
}

/** Every module a target may adapt in one block, in layout order (gpt2's c_proj is two: attention's and the MLP's, as PEFT's suffix match finds both). */
function allSites(config: GptConfig): LoraSite[] {
  const arch = resolveArch(config);
  const w = blockWidths(config);
  const C = config.channels;
  if (arch.family === 'gpt2') {
    return [
      { target: 'c_attn', module: 'attn.c_attn', linear: 'attn.qkv', col: 0, width: w.qkv, inFeatures: C },
      { target: 'c_proj', module: 'attn.c_proj', linear: 'attn.proj', col: 0, width: C, inFeatures: w.attn },
      { target: 'c_fc', module: 'mlp.c_fc', linear: 'mlp.fc', col: 0, width: w.fc, inFeatures: C },
      { target: 'c_proj', module: 'mlp.c_proj', linear: 'mlp.proj', col: 0, width: C, inFeatures: w.hidden },
    ];
  }
  const q = w.attn, kv = arch.kvHeads * arch.headDim, I = w.hidden;
  return [
    { target: 'q_proj', module: 'self_attn.q_proj', linear: 'attn.qkv', col: 0, width: q, inFeatures: C },
    { target: 'k_proj', module: 'self_attn.k_proj', linear: 'attn.qkv', col: q, width: kv, inFeatures: C },
    { target: 'v_proj', module: 'self_attn.v_proj', linear: 'attn.qkv', col: q + kv, width: kv, inFeatures: C },
    { target: 'o_proj', module: 'self_attn.o_proj', linear: 'attn.proj', col: 0, width: C, inFeatures: w.attn },
    { target: 'gate_proj', module: 'mlp.gate_proj', linear: 'mlp.fc', col: 0, width: I, inFeatures: C },
    { target: 'up_proj', module: 'mlp.up_proj', linear: 'mlp.fc', col: I, width: I, inFeatures: C },
    { target: 'down_proj', module: 'mlp.down_proj', linear: 'mlp.proj', col: 0, width: C, inFeatures: I },
  ];
}

/**
 * Checks a spec (its schema, and its targets against the model's family) and
 * returns it with its targets in layout order. Throws a LoraError with the reason.
 */
export function validateLoraSpec(spec: unknown, config: GptConfig): LoraSpec {
  if (!Value.Check(LoraSpec, spec)) {
    const e = [...Value.Errors(LoraSpec, spec)][0];
    throw new LoraError(`lora spec: ${e ? `${e.path || '/'} ${e.message}` : 'not an object'} (rank: integer 1..4096, alpha > 0, dropout in [0, 1), targets: 1 to 8 module names)`);
  }
  const arch = resolveArch(config);
  const known = loraTargets(arch);
  const seen = new Set<string>();
  for (const t of spec.targets) {
    if (!known.includes(t)) throw new LoraError(`lora spec: target ${JSON.stringify(t)} is not a module of a ${arch.family} block (one of ${known.join(', ')})`);
    if (seen.has(t)) throw new LoraError(`lora spec: target ${t} is named twice`);
    seen.add(t);
  }
  return { rank: spec.rank, alpha: spec.alpha, dropout: spec.dropout, targets: known.filter((t) => seen.has(t)) };
}

/** The modules a (valid) spec adapts in each block, in layout order. */
export function loraSites(config: GptConfig, spec: LoraSpec): LoraSite[] {
  return allSites(config).filter((s) => spec.targets.includes(s.target));
}

/** The factor of the low-rank update: alpha / r (PEFT without rsLoRA). */
export function loraScale(spec: LoraSpec): number {
  return spec.alpha / spec.rank;
}

/** The engine name of block `layer`'s adapter matrix A or B at `site`. */
export function loraParamName(layer: number, site: LoraSite, which: 'A' | 'B'): string {
  return `h.${layer}.lora.${site.module}.${which}`;
}

/** The adapters' parameter specs of block `layer`: A [r, in] (uniform ±1/√in, PEFT's kaiming_uniform_(a=√5)), B [out, r] (zeros). */
export function loraBlockParams(config: GptConfig, spec: LoraSpec, layer: number): ParamSpec[] {
  const r = spec.rank;
  return loraSites(config, spec).flatMap((site): ParamSpec[] => [
    { name: loraParamName(layer, site, 'A'), shape: [r, site.inFeatures], decay: true, init: { kind: 'uniform', bound: 1 / Math.sqrt(site.inFeatures) } },
    { name: loraParamName(layer, site, 'B'), shape: [site.width, r], decay: true, init: { kind: 'zeros' } },
  ]);
}

/** The flat layout of the adapters of the blocks a stage range holds (the embedding and head have none). */
export function loraLayout(config: GptConfig, spec: LoraSpec, range: StageRange): ParamLayout {
  return new ParamLayout(rangeParts(config, range).blocks.flatMap((l) => loraBlockParams(config, spec, l)));
}

/** `to`'s tensors copied by name from `from` (a stage's adapters out of the whole model's, or back). Throws when `from` lacks one. */
export function copyByName(fromLayout: ParamLayout, from: Float32Array, toLayout: ParamLayout, to: Float32Array = new Float32Array(toLayout.size)): Float32Array {
  for (const e of toLayout.entries) {
    const src = fromLayout.byName.get(e.name);
    if (!src || src.size !== e.size) throw new LoraError(`no adapter tensor ${e.name} of ${e.size} values to copy`);
    to.set(from.subarray(src.offset, src.offset + src.size), e.offset);
  }
  return to;
}
