// Batches drawn deterministically from (seed, shard id): any process that
// holds the same corpus loads the same batch for a shard, which is what lets a
// microbatch be named by its shard alone.
import { hashSeed, mulberry32 } from '../model/init.ts';

export interface TokenBatch {
  /** B·T input token ids */
  inputs: Int32Array;
  /** B·T next-token targets */
  targets: Int32Array;
  B: number;
  T: number;
}

/**
 * B windows of T+1 bytes at offsets drawn from hash(seed, shard): inputs are
 * the first T bytes of each window, targets the last T.
 */
export function batchForShard(bytes: Uint8Array, seed: number, shard: number, B: number, T: number): TokenBatch {
  if (bytes.length < T + 1) throw new Error(`corpus of ${bytes.length} bytes is shorter than a window of ${T + 1}`);
  if (!Number.isInteger(shard) || shard < 0) throw new RangeError(`shard id must be a non-negative integer, got ${shard}`);
  const rand = mulberry32(hashSeed(seed, `shard:${shard}`));
  const inputs = new Int32Array(B * T);
  const targets = new Int32Array(B * T);
  const span = bytes.length - T;
  for (let b = 0; b < B; b++) {
    const off = Math.floor(rand() * span);
    for (let t = 0; t < T; t++) {
      inputs[b * T + t] = bytes[off + t];
      targets[b * T + t] = bytes[off + t + 1];
    }
  }
  return { inputs, targets, B, T };
}
