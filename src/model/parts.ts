// A decoder as a list of parts: [embedding, block 0 … block L−1, final norm +
// head]. A stage is any contiguous range of parts; the whole model is the
// stage [0, L+2). This module names each part's parameters (as checkpoints
// store them), counts them, and cuts the parts into stages; ./gpt.ts runs a
// range of them for training, src/inference/stage-inference.ts for serving.
//
// Parameter names, for every architecture (./arch.ts): `wte` [V, C] (and
// `wpe` [T, C] with learned positions); per block `h.l.ln1.w` (`.b` for a
// LayerNorm), `attn.qkv.w` [C, (H + 2·KV)·D] (q, k then v heads; `.b` with
// q/k/v biases), `attn.proj.w` [H·D, C], `ln2`, `mlp.fc.w` [C, I] or, for
// SwiGLU, [C, 2I] ([gate | up]), `mlp.proj.w` [I, C]; the head `lnf` and
// `lm_head.w` [C, V]. Linear weights are [in, out], as GPT-2's Conv1D.
import { Type, type Static } from '@sinclair/typebox';
import { numel } from '../engine/tensor.ts';
import { blockWidths, resolveArch } from './arch.ts';
import type { GptConfig } from './config.ts';
import type { InitKind, ParamSpec } from './params.ts';

/** The parts [from, to) a stage holds; a schema too, for plans and assignments read back from storage or peers. */
export const StageRange = Type.Object({
  /** first part, inclusive */
  from: Type.Integer({ minimum: 0 }),
  /** last part, exclusive */
  to: Type.Integer({ minimum: 1 }),
});
export type StageRange = Static<typeof StageRange>;

/** Number of parts: embedding, the blocks, the head. */
export function partCount(config: GptConfig): number {
  return config.layers + 2;
}

/** The last part (final norm + head). Part 0 is the embedding; the blocks are parts 1 … headPart − 1. */
export function headPart(config: GptConfig): number {
  return partCount(config) - 1;
}

/** What a range holds: the embedding (first stage), the blocks by index, the head (last stage). */
export function rangeParts(config: GptConfig, range: StageRange): { first: boolean; last: boolean; blocks: number[] } {
  const blocks: number[] = [];
  for (let p = Math.max(1, range.from); p < Math.min(range.to, headPart(config)); p++) blocks.push(p - 1);
  return { first: range.from === 0, last: range.to === partCount(config), blocks };
}

export function partName(config: GptConfig, part: number): string {
  if (part === 0) return 'embedding';
  if (part === headPart(config)) return 'head';
  return `block ${part - 1}`;
}

const STD = 0.02;

/** Parameter specs of one part, named as in the checkpoint. */
export function partParams(config: GptConfig, part: number): ParamSpec[] {
  const { vocabSize: V, contextLength: T, channels: C, layers } = config;
  const arch = resolveArch(config);
  const w = blockWidths(config);
  const torch = (config.init ?? 'torch') === 'torch';
  const zeros = { kind: 'zeros' } as const;
  const ones = { kind: 'ones' } as const;
  const embedding: InitKind = torch ? { kind: 'normal', std: 1 } : { kind: 'normal', std: STD };
  /** a linear layer's weight and bias inits, by fan-in */
  const linear = (fanIn: number, residual = false): [InitKind, InitKind] => {
    if (torch) {
      const bound = 1 / Math.sqrt(fanIn);
      return [{ kind: 'uniform', bound }, { kind: 'uniform', bound }];
    }
    return [{ kind: 'normal', std: residual ? STD / Math.sqrt(2 * layers) : STD }, zeros];
  };
  /** a norm's weight, and its bias when it is a LayerNorm */
  const norm = (name: string): ParamSpec[] => [
    { name: name + '.w', shape: [C], decay: false, init: ones },
    ...(arch.norm === 'layernorm' ? [{ name: name + '.b', shape: [C], decay: false, init: zeros }] : []),
  ];
  /** a linear [fanIn, out] and, when it has one, its bias */
  const dense = (name: string, fanIn: number, out: number, bias: boolean, residual = false): ParamSpec[] => {
    const [wi, bi] = linear(fanIn, residual);
    return [
      { name: name + '.w', shape: [fanIn, out], decay: true, init: wi },
      ...(bias ? [{ name: name + '.b', shape: [out], decay: false, init: bi }] : []),
    ];
  };
  if (part === 0) {
    return [
      { name: 'wte', shape: [V, C], decay: true, init: embedding },
      ...(arch.position === 'learned' ? [{ name: 'wpe', shape: [T, C], decay: true, init: embedding }] : []),
    ];
  }
  if (part === headPart(config)) return [...norm('lnf'), ...dense('lm_head', C, V, false)];
  if (part < 0 || part >= partCount(config)) throw new RangeError(`no part ${part}`);
  const p = `h.${part - 1}.`;
  return [
    ...norm(p + 'ln1'),
    ...dense(p + 'attn.qkv', C, w.qkv, arch.qkvBias),
    ...dense(p + 'attn.proj', w.attn, C, arch.attnOutBias, true),
    ...norm(p + 'ln2'),
    ...dense(p + 'mlp.fc', C, w.fc, arch.mlpBias),
    ...dense(p + 'mlp.proj', w.hidden, C, arch.mlpBias, true),
  ];
}

/** Parameter count of one part. */
export function partParamCount(config: GptConfig, part: number): number {
  let n = 0;
  for (const s of partParams(config, part)) n += numel(s.shape);
  return n;
}

/** Parameter count of a range of parts. */
export function rangeParamCount(config: GptConfig, range: StageRange): number {
  let n = 0;
  for (let p = range.from; p < range.to; p++) n += partParamCount(config, p);
  return n;
}

/** Splits the parts into `stages` contiguous ranges of near-equal parameter count. */
export function splitEvenly(config: GptConfig, stages: number): StageRange[] {
  const parts = partCount(config);
  if (!Number.isInteger(stages) || stages < 1 || stages > parts) {
    throw new RangeError(`cannot cut ${parts} parts into ${stages} stages`);
  }
  const sizes = Array.from({ length: parts }, (_, p) => partParamCount(config, p));
  const total = sizes.reduce((a, b) => a + b, 0);
  const ranges: StageRange[] = [];
  let from = 0;
  let acc = 0;
  for (let s = 0; s < stages; s++) {
    const left = stages - s - 1;
    let to = from + 1;
    acc += sizes[from];
    const target = (total * (s + 1)) / stages;
    while (to < parts - left && acc + sizes[to] / 2 <= target) acc += sizes[to++];
    if (s === stages - 1) to = parts;
    ranges.push({ from, to });
    from = to;
  }
  return ranges;
}
