// Bytes on the wire, as the transport really sends them: activation and
// gradient frames in the run's codec (src/protocol/frame.ts and codec.ts; the
// orchestrator's default is f16, src/orchestrator/training/run-planner.ts), and a
// merge round's int8-block frames with their butterfly traffic
// (src/merge/traffic.ts).
import type { GptConfig } from '../model/config.ts';
import { partitionVector, maxPartitions } from '../merge/partition.ts';
import { mergeTrafficPerReplica, type MergeTraffic } from '../merge/traffic.ts';
import { DEFAULT_BLOCK_SIZE, payloadByteLength, type Codec } from '../protocol/codec.ts';
import { encodeFrame } from '../protocol/frame.ts';
import type { ActivationCodec } from '../protocol/messages.ts';

/** Partitions per replica of a merge round: mirrors PARTITIONS_PER_REPLICA in src/orchestrator/training/merges.ts (startRound). */
export const PARTITIONS_PER_REPLICA = 2;
/** Mergers per partition (the butterfly's redundancy, src/merge/partition.ts assignMergers). */
export const MERGE_REDUNDANCY = 2;
/** Bytes per parameter of a stage's saved state a joining or moving replica downloads: float32 weights and outer momentum. */
export const STATE_BYTES_PER_PARAM = 8;

/** The header of a real frame: encode a one-row frame with a typical meta and subtract its payload (the shape's digits change it by a few bytes at most). */
function headerBytes(codec: Codec, rowWidth: number, meta: Record<string, string | number>): number {
  const frame = encodeFrame(new Float32Array(rowWidth), [1, rowWidth], codec, meta, codec === 'int8-block' ? { blockSize: DEFAULT_BLOCK_SIZE } : {});
  return frame.length - payloadByteLength(codec, [1, rowWidth], rowWidth, DEFAULT_BLOCK_SIZE);
}

/** A forward frame's meta as the miner sends it (src/protocol/messages.ts ForwardMeta), with realistic lengths. */
const FORWARD_META = { runId: 'run-0123456789abcdef', microbatch: 123456, attempt: 1, shard: 123456, step: 123456, stage: 3, ticket: '0x' + 'ab'.repeat(65) };

/**
 * Bytes of one activation (or activation gradient) frame of a microbatch:
 * [B·T, C] values in `codec`, plus the header. `ratio` (a what-if, default 1)
 * divides the payload: a compression beyond the codec that no engine has.
 */
export function activationFrameBytes(config: GptConfig, batchSize: number, codec: ActivationCodec, ratio = 1): number {
  if (!(ratio >= 1 && Number.isFinite(ratio))) throw new RangeError(`activation compression ratio must be a finite number ≥ 1, got ${ratio}`);
  const rows = batchSize * config.contextLength;
  const C = config.channels;
  return Math.ceil(payloadByteLength(codec, [rows, C], rows * C, 1) / ratio) + headerBytes(codec, C, FORWARD_META);
}

/** Partitions of a stage's merge round with R replicas (the orchestrator's rule: none for one replica). */
export function mergePartitions(params: number, replicas: number): number {
  return replicas >= 2 ? Math.min(maxPartitions(params), PARTITIONS_PER_REPLICA * replicas) : 0;
}

/** Bytes of a stage's int8-block frames over all partitions (a replica's pseudo-gradient, or the merged result). */
export function int8PartitionBytes(params: number, partitions: number): number {
  if (partitions === 0) return 0;
  const header = headerBytes('int8-block', DEFAULT_BLOCK_SIZE, { runId: 'run-0123456789abcdef', stage: 3, round: 123, partition: 12, start: 123456789, end: 123456789 });
  let total = 0;
  for (const p of partitionVector(params, partitions)) {
    const n = p.end - p.start;
    total += payloadByteLength('int8-block', [n], n, DEFAULT_BLOCK_SIZE) + header;
  }
  return total;
}

/** What one replica of a stage moves in a merge round with R replicas (src/merge/traffic.ts). */
export function stageMergeTraffic(params: number, replicas: number, bytesPerParamOverride?: number): MergeTraffic {
  const P = mergePartitions(params, replicas);
  const F = bytesPerParamOverride !== undefined ? Math.ceil(params * bytesPerParamOverride) : int8PartitionBytes(params, P);
  return mergeTrafficPerReplica({ replicas, redundancy: MERGE_REDUNDANCY, pseudoGradientBytes: F, mergedBytes: F });
}
