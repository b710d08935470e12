// The GPU buffers of a whole-GPT training step (gpt-step.ts): the flat
// parameter, gradient and AdamW moment buffers, laid out by the model's own
// ParamLayout (src/model/params.ts: the caller passes it, e.g. a whole-model
// GptStage's `layout`, so the engine neither repeats the layout nor imports
// the model layer), and the activations of one batch, one buffer each. One
// buffer per activation is what WebGPU needs: a written binding may not share
// a buffer with any other binding of its dispatch, and the WASM layers write
// one activation while reading others of the same block.
import { createArray, type GpuArray } from './buffers.ts';
import type { GpuRef } from './program.ts';

/** The sizes of a GPT (src/model/config.ts GptConfig is one). */
export interface GptShape {
  vocabSize: number;
  contextLength: number;
  channels: number;
  layers: number;
  heads: number;
  mlpRatio: number;
}

/** A flat layout of named tensors (src/model/params.ts ParamLayout is one): floats [0, decaySize) take weight decay. */
export interface FlatLayout {
  readonly entries: readonly { readonly name: string; readonly offset: number; readonly size: number }[];
  readonly byName: ReadonlyMap<string, { readonly offset: number; readonly size: number }>;
  readonly size: number;
  readonly decaySize: number;
}

/** The tensors the step reads, with their sizes, named as src/model/gpt.ts partParams names them. */
export function gptTensorSizes(c: GptShape): Map<string, number> {
  const { vocabSize: V, contextLength: T, channels: C } = c;
  const H = C * c.mlpRatio;
  const sizes = new Map<string, number>([['wte', V * C], ['wpe', T * C], ['lnf.w', C], ['lnf.b', C], ['lm_head.w', C * V]]);
  const block: [string, number][] = [
    ['ln1.w', C], ['ln1.b', C], ['attn.qkv.w', C * 3 * C], ['attn.qkv.b', 3 * C], ['attn.proj.w', C * C], ['attn.proj.b', C],
    ['ln2.w', C], ['ln2.b', C], ['mlp.fc.w', C * H], ['mlp.fc.b', H], ['mlp.proj.w', H * C], ['mlp.proj.b', C],
  ];
  for (let l = 0; l < c.layers; l++) for (const [name, n] of block) sizes.set(`h.${l}.${name}`, n);
  return sizes;
}

/** Throws unless `layout` holds exactly the tensors of `config`, in their sizes. */
export function checkLayout(layout: FlatLayout, config: GptShape): void {
  const sizes = gptTensorSizes(config);
  for (const [name, n] of sizes) {
    const e = layout.byName.get(name);
    if (!e) throw new RangeError(`gpt step: the layout has no ${name}`);
    if (e.size !== n) throw new RangeError(`gpt step: ${name} holds ${e.size} floats in the layout, the config needs ${n}`);
  }
  if (layout.entries.length !== sizes.size) throw new RangeError(`gpt step: the layout has ${layout.entries.length} tensors, the config ${sizes.size}`);
}

/** A flat buffer (parameters or gradients) and its named windows. */
export class GpuFlat {
  constructor(
    readonly layout: FlatLayout,
    readonly array: GpuArray,
  ) {}

  /** The window of one named tensor. */
  ref(name: string): { array: GpuArray; offset: number } {
    return { array: this.array, offset: this.offset(name) };
  }

  /** Float offset of one named tensor (for sgemm, which takes array and offset apart). */
  offset(name: string): number {
    const e = this.layout.byName.get(name);
    if (!e) throw new Error(`no parameter named ${name}`);
    return e.offset;
  }
}

type BlockActName = 'ln1' | 'ln1Mean' | 'ln1Rstd' | 'qkv' | 'stats' | 'atty' | 'res2' | 'ln2' | 'ln2Mean' | 'ln2Rstd' | 'fch' | 'fchGelu' | 'out';

/** Floats of each activation one block keeps between forward and backward (the WASM BlockActs, with attention's stats in place of att). */
function blockActSizes(c: GptShape, B: number): Record<BlockActName, number> {
  const T = c.contextLength, C = c.channels, N = B * T, H = C * c.mlpRatio;
  return {
    ln1: N * C, ln1Mean: N, ln1Rstd: N, qkv: N * 3 * C, stats: B * c.heads * T * 2, atty: N * C, res2: N * C,
    ln2: N * C, ln2Mean: N, ln2Rstd: N, fch: N * H, fchGelu: N * H, out: N * C,
  };
}

/** One block's activations; `input` is the previous block's `out` (or the embedding's). */
export type GpuBlockActs = Record<BlockActName | 'input', GpuArray>;

/** Activations and backward scratch for batches of up to B×T rows. */
// The head's activations (lnf…losses), the backward scratch (dlogits…tmp: dbig
// holds d(gelu out), dbig2 d(fch), which the WASM kernel writes in place and
// WebGPU cannot) and the gradient norm's chunk partials.
type ActName = 'inputAct' | 'lnf' | 'lnfMean' | 'lnfRstd' | 'logits' | 'probs' | 'losses' | 'dlogits' | 'dres' | 'dsmall' | 'dqkv' | 'dbig' | 'dbig2' | 'tmp' | 'partials';
export type GpuActs = Record<ActName, GpuArray> & {
  blocks: GpuBlockActs[];
  /** every buffer, to destroy */
  all: GpuArray[];
};

/** Allocates the activations of a batch of B sequences of the config's context length. */
export function createActs(device: GPUDevice, config: GptShape, B: number, paramCount: number, normChunk: number): GpuActs {
  const { contextLength: T, channels: C, vocabSize: V, layers } = config;
  const N = B * T, H = C * config.mlpRatio;
  const all: GpuArray[] = [];
  const t = (length: number, label: string): GpuArray => {
    const a = createArray(device, length, label);
    all.push(a);
    return a;
  };
  const inputAct = t(N * C, 'embedding out');
  const blocks: GpuBlockActs[] = [];
  let input = inputAct;
  for (let l = 0; l < layers; l++) {
    const sizes = Object.entries(blockActSizes(config, B)).map(([name, n]) => [name, t(n, `h.${l}.${name}`)]);
    const a = { input, ...Object.fromEntries(sizes) } as GpuBlockActs;
    blocks.push(a);
    input = a.out;
  }
  return {
    inputAct, blocks,
    lnf: t(N * C, 'lnf'), lnfMean: t(N, 'lnf mean'), lnfRstd: t(N, 'lnf rstd'),
    logits: t(N * V, 'logits'), probs: t(N * V, 'probs'), losses: t(N, 'losses'),
    dlogits: t(N * V, 'dlogits'),
    dres: t(N * C, 'dres'), dsmall: t(N * C, 'dsmall'), dqkv: t(N * 3 * C, 'dqkv'),
    dbig: t(N * H, 'dbig'), dbig2: t(N * H, 'dbig2'),
    tmp: t(N * C, 'tmp'),
    partials: t(Math.ceil(paramCount / normChunk), 'grad norm partials'),
    all,
  };
}

/** Queues zeroes over `length` floats of `ref` (one submission; ordered with the kernels' submissions). */
export function clearRef(device: GPUDevice, ref: GpuRef, length: number): void {
  const array = 'array' in ref ? ref.array : ref;
  const offset = 'array' in ref ? ref.offset : 0;
  if (length === 0) return;
  const encoder = device.createCommandEncoder({ label: 'clear' });
  encoder.clearBuffer(array.buffer, offset * 4, length * 4);
  device.queue.submit([encoder.finish()]);
}
