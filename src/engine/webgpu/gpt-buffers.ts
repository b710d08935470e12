// The GPU buffers of a GPT stage (gpt-stage.ts): the flat parameter and
// gradient buffers, laid out by the model's own ParamLayout
// (src/model/params.ts: the caller passes it, e.g. a GptStage's `layout`, so
// the engine neither repeats the layout nor imports the model layer), the
// activations each slot keeps between forward and backward, one buffer each,
// and the backward scratch. One
// buffer per activation is what WebGPU needs: a written binding may not share
// a buffer with any other binding of its dispatch, and the WASM layers write
// one activation while reading others of the same block.
import { createArray, type GpuArray } from './buffers.ts';
import type { GpuRef } from './program.ts';
import { recorderOf } from './recorder.ts';

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

/**
 * Which parts of a GPT a stage holds (src/model/gpt.ts StageRange, resolved):
 * the embeddings (first stage), these blocks by their index in the whole
 * model, and the head (last stage).
 */
export interface GptParts {
  first: boolean;
  last: boolean;
  blocks: readonly number[];
}

/** The whole model's parts. */
export function wholeModel(c: GptShape): GptParts {
  return { first: true, last: true, blocks: Array.from({ length: c.layers }, (_, l) => l) };
}

/** The tensors a stage of these parts reads, with their sizes, named as src/model/gpt.ts partParams names them. */
export function gptTensorSizes(c: GptShape, parts: GptParts = wholeModel(c)): Map<string, number> {
  const { vocabSize: V, contextLength: T, channels: C } = c;
  const H = C * c.mlpRatio;
  const sizes = new Map<string, number>();
  if (parts.first) sizes.set('wte', V * C).set('wpe', T * C);
  const block: [string, number][] = [
    ['ln1.w', C], ['ln1.b', C], ['attn.qkv.w', C * 3 * C], ['attn.qkv.b', 3 * C], ['attn.proj.w', C * C], ['attn.proj.b', C],
    ['ln2.w', C], ['ln2.b', C], ['mlp.fc.w', C * H], ['mlp.fc.b', H], ['mlp.proj.w', H * C], ['mlp.proj.b', C],
  ];
  for (const l of parts.blocks) for (const [name, n] of block) sizes.set(`h.${l}.${name}`, n);
  if (parts.last) sizes.set('lnf.w', C).set('lnf.b', C).set('lm_head.w', C * V);
  return sizes;
}

/** Throws unless `layout` holds exactly the tensors of `parts` of `config`, in their sizes. */
export function checkLayout(layout: FlatLayout, config: GptShape, parts: GptParts = wholeModel(config)): void {
  const sizes = gptTensorSizes(config, parts);
  for (const [name, n] of sizes) {
    const e = layout.byName.get(name);
    if (!e) throw new RangeError(`gpt stage: the layout has no ${name}`);
    if (e.size !== n) throw new RangeError(`gpt stage: ${name} holds ${e.size} floats in the layout, the config needs ${n}`);
  }
  if (layout.entries.length !== sizes.size) throw new RangeError(`gpt stage: the layout has ${layout.entries.length} tensors, the parts ${sizes.size}`);
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

/** One block's activations; `input` is the previous block's `out` (or the stage's input). */
export type GpuBlockActs = Record<BlockActName | 'input', GpuArray>;

/** The head's activations, kept from the forward to the backward of a last stage. */
export type GpuHeadActs = Record<'lnf' | 'lnfMean' | 'lnfRstd' | 'logits' | 'probs' | 'losses', GpuArray>;

/** What one microbatch keeps between its forward and its backward: the stage's input, each block's activations, the head's. */
export interface GpuSlotActs {
  /** the embedding's output (first stage) or the activation received */
  inputAct: GpuArray;
  blocks: GpuBlockActs[];
  head: GpuHeadActs | null;
  /** every buffer, to destroy */
  all: GpuArray[];
}

/**
 * Backward scratch shared by the slots: dres (d of the residual stream),
 * dsmall, dqkv, dbig (d of the GELU's output) and dbig2 (d of its input,
 * which the WASM kernel writes in place and WebGPU cannot), tmp (a block's
 * projection outputs), and dlogits on a last stage.
 */
export type GpuScratch = Record<'dres' | 'dsmall' | 'dqkv' | 'dbig' | 'dbig2' | 'tmp', GpuArray> & { dlogits: GpuArray | null; all: GpuArray[] };

/** Creates arrays into `all`, and into `owned` too when given (the caller's list, which keeps what was made before a later array fails). */
function allocator(device: GPUDevice, all: GpuArray[], owned?: GpuArray[]): (length: number, label: string) => GpuArray {
  return (length, label) => {
    const a = createArray(device, length, label);
    all.push(a);
    owned?.push(a);
    return a;
  };
}

/** Allocates one slot's activations for batches of up to B sequences of the config's context length. */
export function createSlotActs(device: GPUDevice, config: GptShape, B: number, parts: GptParts, owned?: GpuArray[]): GpuSlotActs {
  const { contextLength: T, channels: C, vocabSize: V } = config;
  const N = B * T;
  const all: GpuArray[] = [];
  const t = allocator(device, all, owned);
  const inputAct = t(N * C, 'stage input');
  const blocks: GpuBlockActs[] = [];
  let input = inputAct;
  for (const l of parts.blocks) {
    const sizes = Object.entries(blockActSizes(config, B)).map(([name, n]) => [name, t(n, `h.${l}.${name}`)]);
    const a = { input, ...Object.fromEntries(sizes) } as GpuBlockActs;
    blocks.push(a);
    input = a.out;
  }
  const head = parts.last
    ? { lnf: t(N * C, 'lnf'), lnfMean: t(N, 'lnf mean'), lnfRstd: t(N, 'lnf rstd'), logits: t(N * V, 'logits'), probs: t(N * V, 'probs'), losses: t(N, 'losses') }
    : null;
  return { inputAct, blocks, head, all };
}

/** Allocates the backward scratch of a stage for batches of up to B sequences. */
export function createScratch(device: GPUDevice, config: GptShape, B: number, parts: GptParts, owned?: GpuArray[]): GpuScratch {
  const { contextLength: T, channels: C, vocabSize: V } = config;
  const N = B * T, H = C * config.mlpRatio;
  const all: GpuArray[] = [];
  const t = allocator(device, all, owned);
  return {
    dres: t(N * C, 'dres'), dsmall: t(N * C, 'dsmall'), dqkv: t(N * 3 * C, 'dqkv'),
    dbig: t(N * H, 'dbig'), dbig2: t(N * H, 'dbig2'), tmp: t(N * C, 'tmp'),
    dlogits: parts.last ? t(N * V, 'dlogits') : null,
    all,
  };
}

/** Records zeroes over `length` floats of `ref` (recorder.ts: in order with the kernels). */
export function clearRef(device: GPUDevice, ref: GpuRef, length: number): void {
  const array = 'array' in ref ? ref.array : ref;
  const offset = 'array' in ref ? ref.offset : 0;
  if (length === 0) return;
  recorderOf(device).clear(array.buffer, offset * 4, length * 4);
}
