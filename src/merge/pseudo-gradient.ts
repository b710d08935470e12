// Pseudo-gradients and their per-partition frames.
//
// After H inner steps a replica's pseudo-gradient is Δ = θ_start − θ_current
// (the direction the replica moved, with the sign of a gradient). It is sent
// as one 'int8-block' tensor frame per partition; partitions are aligned to
// the int8 blocks, so the frames hold exactly the scales and codes the whole
// vector would have. Error feedback is carried across rounds in one residual
// buffer over the whole vector (an `ErrorFeedback` of length n): each
// partition's frame quantizes its slice of Δ + residual and writes back its
// slice of the new residual.

import { ErrorFeedback } from '../protocol/error-feedback.ts';
import { decodeFrame, decodeFrameInt8, encodeFrame, type FrameExpect, type FrameMeta } from '../protocol/frame.ts';
import { DEFAULT_BLOCK_SIZE, findNonFinite, type Codec, type Int8Payload } from '../protocol/codec.ts';
import { MergeError } from './errors.ts';
import { checkPartitions, type Partition } from './partition.ts';

/** Meta a partition frame carries (besides the caller's meta). */
export interface PartitionFrameMeta {
  /** Partition index. */
  partition: number;
  /** First element of the partition in the flat vector. */
  start: number;
  /** One past its last element. */
  end: number;
}

/** Options of decodePartitionFrame. */
export interface DecodePartitionOptions {
  /** Accepted codecs (default ['int8-block']). */
  codecs?: readonly Codec[];
  /** Largest accepted frame in bytes (decodeFrame's default otherwise). */
  maxBytes?: number;
}

/**
 * Pseudo-gradient `start − current`, elementwise, into `out` (allocated when
 * absent; may alias either input). Throws MergeError 'length_mismatch'.
 */
export function pseudoGradient(start: Float32Array, current: Float32Array, out?: Float32Array): Float32Array {
  const n = start.length;
  if (current.length !== n) throw new MergeError('length_mismatch', `start has ${n} values, current ${current.length}`);
  const o = out ?? new Float32Array(n);
  if (o.length !== n) throw new MergeError('length_mismatch', `out has ${o.length} values, expected ${n}`);
  for (let i = 0; i < n; i++) o[i] = start[i] - current[i];
  return o;
}

/**
 * Encodes `pg` as one 'int8-block' frame per partition, quantizing
 * pg + feedback.residual and keeping the new residual in `feedback` (which
 * spans the whole vector: feedback.size === pg.length). Partition boundaries
 * must be aligned to feedback.blockSize (MergeError 'misaligned'). Each frame
 * has shape [end − start] and meta `{...meta, partition, start, end}`.
 */
export function encodePseudoGradientPartitions(pg: Float32Array, partitions: readonly Partition[], feedback: ErrorFeedback, meta: FrameMeta = {}): Uint8Array[] {
  const n = pg.length;
  if (feedback.size !== n) throw new MergeError('length_mismatch', `error feedback spans ${feedback.size} values, pseudo-gradient ${n}`);
  checkPartitions(partitions, n, feedback.blockSize);
  const bad = findNonFinite(pg);
  if (bad >= 0) throw new MergeError('non_finite', `pseudo-gradient value ${bad} is ${pg[bad]}`);
  return partitions.map((p) =>
    encodeFrame(pg.subarray(p.start, p.end), [p.end - p.start], 'int8-block', partitionMeta(meta, p), {
      errorFeedback: new ErrorFeedbackWindow(feedback, p.start, p.end),
    }),
  );
}

/**
 * Encodes a merged partition (the aggregate of the replicas' slices) as a
 * frame with meta `{...meta, partition, start, end}`. Default codec
 * 'int8-block' without error feedback (mergers change between rounds).
 * Every replica must apply the *decoded* frame, the merger included, so that
 * all replicas apply bitwise the same Δ.
 */
export function encodeMergedPartition(
  merged: Float32Array,
  partition: Partition,
  meta: FrameMeta = {},
  codec: Codec = 'int8-block',
  blockSize: number = DEFAULT_BLOCK_SIZE,
): Uint8Array {
  const len = partition.end - partition.start;
  if (merged.length !== len) throw new MergeError('length_mismatch', `partition ${partition.index} has ${len} values, merged slice ${merged.length}`);
  const bad = findNonFinite(merged);
  if (bad >= 0) throw new MergeError('non_finite', `merged value ${bad} of partition ${partition.index} is ${merged[bad]}`);
  return encodeFrame(merged, [len], codec, partitionMeta(meta, partition), codec === 'int8-block' ? { blockSize } : {});
}

/**
 * Decodes one partition frame (a replica's pseudo-gradient slice or a merged
 * slice) and checks it is that partition: shape [end − start], codec
 * accepted, meta partition/start/end equal to `partition`'s. Throws FrameError
 * for a malformed frame and MergeError 'bad_frame' for the wrong partition.
 */
export function decodePartitionFrame(frame: Uint8Array, partition: Partition, options: DecodePartitionOptions = {}): Float32Array {
  const decoded = decodeFrame(frame, partitionExpect(partition, options.codecs ?? ['int8-block'], options.maxBytes));
  checkPartitionMeta(decoded.meta, partition);
  return decoded.data;
}

/**
 * A replica's pseudo-gradient slice of `partition` ('int8-block'), validated
 * as decodePartitionFrame does but left quantized: its codes and block
 * scales, views of `frame`.
 */
export function readPartitionInt8(frame: Uint8Array, partition: Partition): Int8Payload {
  const decoded = decodeFrameInt8(frame, partitionExpect(partition, ['int8-block']));
  checkPartitionMeta(decoded.meta, partition);
  return { scales: decoded.scales, codes: decoded.codes, groupSize: decoded.groupSize };
}

function partitionExpect(partition: Partition, codecs: readonly Codec[], maxBytes?: number): FrameExpect {
  const expect: FrameExpect = { shape: [partition.end - partition.start], codecs };
  if (maxBytes !== undefined) expect.maxBytes = maxBytes;
  return expect;
}

function checkPartitionMeta(m: FrameMeta, partition: Partition): void {
  if (m.partition !== partition.index || m.start !== partition.start || m.end !== partition.end) {
    throw new MergeError(
      'bad_frame',
      `frame is partition ${JSON.stringify(m.partition)} [${JSON.stringify(m.start)}, ${JSON.stringify(m.end)}), expected ${partition.index} [${partition.start}, ${partition.end})`,
    );
  }
}

/**
 * Decodes one frame per partition (in partition order) into the flat vector
 * `out` (allocated when absent, length = last partition's end).
 */
export function decodePartitionFrames(
  frames: readonly Uint8Array[],
  partitions: readonly Partition[],
  out?: Float32Array,
  options: DecodePartitionOptions = {},
): Float32Array {
  if (frames.length !== partitions.length) throw new MergeError('length_mismatch', `${frames.length} frames for ${partitions.length} partitions`);
  const n = partitions.length === 0 ? 0 : partitions[partitions.length - 1].end;
  const o = out ?? new Float32Array(n);
  if (o.length !== n) throw new MergeError('length_mismatch', `out has ${o.length} values, partitions cover ${n}`);
  partitions.forEach((p, i) => o.set(decodePartitionFrame(frames[i], p, options), p.start));
  return o;
}

/** Total bytes of `frames`. */
export function framesByteLength(frames: readonly Uint8Array[]): number {
  let total = 0;
  for (const f of frames) total += f.length;
  return total;
}

/** Bytes per parameter of `frames` carrying `params` values. */
export function bytesPerParameter(frames: readonly Uint8Array[], params: number): number {
  return framesByteLength(frames) / params;
}

function partitionMeta(meta: FrameMeta, p: Partition): FrameMeta {
  const extra: PartitionFrameMeta = { partition: p.index, start: p.start, end: p.end };
  return { ...meta, ...extra };
}

/**
 * An ErrorFeedback over the window [start, end) of a larger one: its residual
 * is a view into the parent's, so the protocol's own compress() updates the
 * parent's residual in place (no copy, no second implementation).
 */
class ErrorFeedbackWindow extends ErrorFeedback {
  override readonly residual: Float32Array;

  constructor(parent: ErrorFeedback, start: number, end: number) {
    super(end - start, parent.blockSize);
    this.residual = parent.residual.subarray(start, end);
  }
}
