// How long a stage's merge round takes on the replicas' links. The bytes are
// the real butterfly's (costs.ts stageMergeTraffic, src/merge/traffic.ts):
// every replica uploads its pseudo-gradient frames; each merger downloads the
// others' slices of its partitions and uploads the merged partitions; every
// replica downloads the merged partitions it did not compute. Each phase ends
// when its slowest replica is done, and the orchestrator moves a round on at
// a heartbeat, so a phase also waits a heartbeat and a round trip.
// Not modelled: the blob store's own bandwidth (assumed not the bottleneck,
// e.g. S3), the aggregation and outer-step compute (milliseconds against
// seconds of transfer), replicas leaving during the round.
import { mergePartitions, stageMergeTraffic } from './costs.ts';

/** The links of a replica taking part. */
export interface MergeLink {
  upMbps: number;
  downMbps: number;
  latencyMs: number;
}

export interface StageMerge {
  /** ms from the round's start to every replica holding the merged weights */
  ms: number;
  /** bytes one replica moves (upload + download), on average */
  bytesPerReplica: number;
  /** bytes all replicas move together */
  bytesTotal: number;
  /** partitions merged (each by MERGE_REDUNDANCY mergers) */
  partitions: number;
}

const transferMs = (bytes: number, mbps: number): number => (bytes * 8) / (mbps * 1e6) * 1000;

/** The merge round of a stage with `params` parameters held by `replicas`. */
export function stageMergeTime(params: number, replicas: readonly MergeLink[], heartbeatMs: number, bytesPerParam?: number): StageMerge {
  const R = replicas.length;
  if (R < 2) return { ms: heartbeatMs, bytesPerReplica: 0, bytesTotal: 0, partitions: 0 };
  const t = stageMergeTraffic(params, R, bytesPerParam);
  const phase = (f: (r: MergeLink) => number): number => Math.max(...replicas.map((r) => f(r) + 2 * r.latencyMs)) + heartbeatMs;
  const upload = phase((r) => transferMs(t.uploadPseudoGradient, r.upMbps));
  const merge = phase((r) => transferMs(t.downloadAsMerger, r.downMbps) + transferMs(t.uploadMerged, r.upMbps));
  const apply = phase((r) => transferMs(t.downloadMerged, r.downMbps));
  return { ms: upload + merge + apply, bytesPerReplica: t.total, bytesTotal: t.total * R, partitions: mergePartitions(params, R) };
}
