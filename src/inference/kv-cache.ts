// A session's KV cache on one stage: for each block of the stage's range, the
// keys and values of every token the session has fed so far, up to the
// model's context length. It lives in the engine's memory, one block per
// session, because the attention kernel reads it in place: a decode step then
// writes one row of keys and values per layer and copies nothing else (a cache
// in JavaScript arrays would have to be copied into the engine's memory on
// every step, O(T·C) per layer per token, which is what the cache saves).
//
// Layout of one layer (assembly/attention-cached.ts, assembly/attention-gqa.ts),
// with KD = key/value heads × head width (C for the byte GPT; fewer with
// grouped-query attention):
//   keys    KD × Tp floats, channel-major (Tp = T rounded up to 4): the layout the
//           attention kernel transposes keys to, so scores run the same sums;
//   values  T × KD floats, row-major.
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import { resolveArch } from '../model/arch.ts';
import type { GptConfig } from '../model/config.ts';

/** T rounded up to a multiple of 4 (the keys' row stride). */
function pad4(n: number): number {
  return (n + 3) & ~3;
}

/** Where one layer's keys and values sit in a session's cache, in bytes from its start. */
export interface KvLayerOffsets {
  keys: number;
  values: number;
}

/** Floats per cached position of one layer's keys (or values): key/value heads × head width. */
export function kvWidth(config: GptConfig): number {
  const a = resolveArch(config);
  return a.kvHeads * a.headDim;
}

/** Floats one layer of a session's cache takes. */
export function kvLayerFloats(config: GptConfig): number {
  const T = config.contextLength, KD = kvWidth(config);
  return KD * pad4(T) + T * KD;
}

/** Where block `layer` (0-based within the stage) keeps its keys and values, in bytes from the start of a session's cache. */
export function kvLayerOffsets(config: GptConfig, layer: number): KvLayerOffsets {
  const keys = layer * kvLayerFloats(config) * 4;
  return { keys, values: keys + kvWidth(config) * pad4(config.contextLength) * 4 };
}

/** Bytes a session's cache takes on a stage holding `blocks` blocks. */
export function kvCacheBytes(config: GptConfig, blocks: number): number {
  return kvLayerFloats(config) * blocks * 4;
}

export class KvCache {
  /** Tokens cached so far: the position the next token takes. */
  private length = 0;
  private readonly buffer: Tensor | null;
  private released = false;

  constructor(
    private readonly engine: Engine,
    readonly config: GptConfig,
    /** blocks of the stage (0 for a stage holding only the embedding or the head: nothing to cache) */
    readonly blocks: number,
  ) {
    this.buffer = blocks > 0 ? engine.tensor([kvLayerFloats(config) * blocks]) : null;
  }

  /** The position the next token takes (tokens cached so far). */
  get position(): number {
    return this.length;
  }

  /** Tokens the cache can still take before the context is full. */
  get room(): number {
    return this.config.contextLength - this.length;
  }

  /** Byte offset of the cache in the engine memory (0 for a cache of no blocks). */
  get ptr(): number {
    this.checkAlive();
    return this.buffer?.ptr ?? 0;
  }

  /** Records that `count` more tokens were written (by the stage, after the kernels ran). */
  advance(count: number): void {
    this.checkAlive();
    if (!(Number.isInteger(count) && count >= 0 && count <= this.room)) throw new RangeError(`cannot advance a cache at ${this.length} of ${this.config.contextLength} by ${count}`);
    this.length += count;
  }

  /** Gives the memory back to the engine. */
  release(): void {
    if (this.released) return;
    this.released = true;
    if (this.buffer) this.engine.free(this.buffer);
  }

  private checkAlive(): void {
    if (this.released) throw new Error('KV cache was released');
  }
}
