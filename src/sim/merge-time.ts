// How long a stage's merge round takes on the replicas' links. The bytes are
// the real butterfly's (costs.ts stageMergeTraffic, src/merge/traffic.ts):
// every replica uploads its pseudo-gradient frames; each merger downloads the
// others' slices of its partitions and uploads the merged partitions; every
// replica downloads the merged partitions it did not compute. The
// orchestrator writes the stage's new state itself while they apply
// (src/orchestrator/merges.ts writeState); a stage of one replica merges
// nothing and uploads its own state instead (src/miner/merge-round.ts
// saveState), 8 bytes a parameter.
// The protocol's clocks (src/orchestrator/merges.ts, src/miner/miner.ts):
// a replica learns of a phase on its next heartbeat, and the orchestrator
// moves the round on at its next tick (every tickMs) after the phase's last
// replica is done; applying is reported on the replica's heartbeat after it.
// With heartbeat phases spread evenly, the last of n replicas' heartbeats
// comes heartbeatMs·n/(n+1) after the phase opens on average, and the tick
// tickMs/2 after the work is done; so a phase takes
//   heartbeatMs·n/(n+1) + the slowest replica's transfers and 2 latencies + tickMs/2
// and applying one heartbeatMs more.
// Not modelled: the blob store's own bandwidth (assumed not the bottleneck,
// e.g. S3), the aggregation and outer-step compute, the orchestrator's
// included (milliseconds against seconds of transfer), replicas leaving
// during the round.
import { mergePartitions, STATE_BYTES_PER_PARAM, stageMergeTraffic } from './costs.ts';

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

/** The orchestrator's clock, how often it moves merge rounds on (src/orchestrator/server.ts tickMs). */
export const ORCHESTRATOR_TICK_MS = 200;

/** Mean wait from a phase's opening to the last of `n` replicas' heartbeats (phases spread evenly over the period). */
export const lastHeartbeatMs = (heartbeatMs: number, n: number): number => (heartbeatMs * n) / (n + 1);

/** Options of stageMergeTime beyond the stage and its replicas. */
export interface MergeTimeOptions {
  heartbeatMs: number;
  /** merge frames' bytes per parameter; undefined = the real int8-block frames */
  bytesPerParam?: number;
  tickMs?: number;
}

/** The merge round of a stage with `params` parameters held by `replicas`. */
export function stageMergeTime(params: number, replicas: readonly MergeLink[], options: MergeTimeOptions): StageMerge {
  const { heartbeatMs, bytesPerParam, tickMs = ORCHESTRATOR_TICK_MS } = options;
  const R = replicas.length;
  if (R === 0) return { ms: 0, bytesPerReplica: 0, bytesTotal: 0, partitions: 0 };
  if (R < 2) {
    // one replica: straight to applying, and it uploads its own state
    const state = params * STATE_BYTES_PER_PARAM;
    return { ms: lastHeartbeatMs(heartbeatMs, 1) + heartbeatMs + tickMs / 2 + transferMs(state, replicas[0].upMbps), bytesPerReplica: 0, bytesTotal: state, partitions: 0 };
  }
  const t = stageMergeTraffic(params, R, bytesPerParam);
  const phase = (f: (r: MergeLink) => number): number => lastHeartbeatMs(heartbeatMs, R) + Math.max(...replicas.map((r) => f(r) + 2 * r.latencyMs)) + tickMs / 2;
  const upload = phase((r) => transferMs(t.uploadPseudoGradient, r.upMbps));
  const merge = phase((r) => transferMs(t.downloadAsMerger, r.downMbps) + transferMs(t.uploadMerged, r.upMbps));
  const apply = phase((r) => transferMs(t.downloadMerged, r.downMbps)) + heartbeatMs;
  return { ms: upload + merge + apply, bytesPerReplica: t.total, bytesTotal: t.total * R, partitions: mergePartitions(params, R) };
}
