// How long a stage's merge round takes on the replicas' links. The bytes are
// the real butterfly's (costs.ts stageMergeTraffic, src/merge/traffic.ts):
// every replica uploads its pseudo-gradient frames; each merger downloads the
// others' slices of its partitions and uploads the merged partitions; every
// replica downloads the merged partitions it did not compute. The
// orchestrator writes the stage's new state itself while they apply
// (src/orchestrator/training/merges.ts writeState); a stage of one replica merges
// nothing and uploads its own state instead (src/miner/merge-round.ts
// saveState), 8 bytes a parameter.
// The protocol's clocks (src/orchestrator/training/merges.ts, src/miner/miner.ts):
// the round opens at one of the orchestrator's ticks (every tickMs); a
// replica learns of a phase on its next heartbeat (every heartbeatMs, at a
// phase of its own) and does its part; the orchestrator moves the round on
// at its first tick after the phase's last replica is done; a replica
// reports that it applied on the heartbeat after it did. With an `rng`, the
// replicas' heartbeat phases are drawn for the round (a miner's timer drifts
// by its own lateness from one round to the next) and the phases are walked
// on these clocks: a round lasts a whole number of ticks, and the slowest
// stage sets the network's round. Without one, each wait is its mean: the
// last of n replicas' heartbeats comes heartbeatMs·n/(n+1) after the phase
// opens, and the tick tickMs/2 after the work is done.
// The round's compute, when `work` is given (measured on this machine,
// src/sim/merge-work.ts measureMergeWork): each replica's on its own path at
// a core of its own, with its requests one after another (mergeRequests);
// the orchestrator's, one process for every stage of the network, delays a
// phase's end to at least its opening plus that phase's work (checking the
// uploads, decoding the merged partitions, writing the states, its share of
// serving every request: orchestratorRoundMs).
// Not modelled: the blob store's own bandwidth (assumed not the bottleneck,
// e.g. S3), replicas leaving during the round.
import { MERGE_REDUNDANCY, mergePartitions, STATE_BYTES_PER_PARAM, stageMergeTraffic } from './costs.ts';
import type { Rng } from './rng.ts';

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

/** A merge round's compute on one thread, ms per value (measured: src/sim/merge-work.ts measureMergeWork). */
export interface MergeWork {
  /** a replica: its pseudo-gradient and their int8 frames, per parameter of the stage */
  uploadMsPerParam: number;
  /** a merger: decoding and aggregating its inputs and encoding the result, per input value */
  mergeMsPerParam: number;
  /** a replica: decoding the merged partitions and taking the outer step, per parameter of the stage */
  applyMsPerParam: number;
  /** the orchestrator: checking an uploaded pseudo-gradient value (decoding, AdamW's reach, hashing) */
  checkMsPerParam: number;
  /** the orchestrator: decoding a merged partition a merger sent, per value */
  mergedMsPerParam: number;
  /** the orchestrator: writing a merged state (decoding the partitions, the outer step, encoding, hashing), per parameter of the stage */
  writeMsPerParam: number;
  /**
   * a signed request for one merge frame, its whole round trip (the client's
   * and the server's share) on one idle thread, ms: a replica waits it out
   * for each of its requests, and half of it is the orchestrator's, on its
   * one thread (undefined: not counted)
   */
  requestMs?: number;
  /**
   * a blob's durable write on the orchestrator (written, fsynced, renamed,
   * its folder fsynced: src/orchestrator/blobs/blobs.ts FsBlobStore.put), wall ms:
   * the reply to an upload waits for it, and so does the round for each
   * merged state the orchestrator writes; the disk works off the
   * orchestrator's thread (undefined: not counted)
   */
  putMs?: number;
}

/** The orchestrator's compute in each phase of a round, over every stage of the network, ms. */
export interface OrchestratorPhases {
  upload: number;
  merge: number;
  apply: number;
}

const transferMs = (bytes: number, mbps: number): number => (bytes * 8) / (mbps * 1e6) * 1000;

/** The orchestrator's clock, how often it moves merge rounds on (src/orchestrator/server.ts tickMs). */
export const ORCHESTRATOR_TICK_MS = 200;

/** Mean wait from a phase's opening to the last of `n` replicas' heartbeats (phases spread evenly over the period). */
export const lastHeartbeatMs = (heartbeatMs: number, n: number): number => (heartbeatMs * n) / (n + 1);

/**
 * The orchestrator's work in a round of stages of `params` parameters held by
 * `replicas` each, at `work`'s speed: every replica's upload checked, each
 * partition's results from its mergers decoded, each merged stage's state
 * written; a stage of one replica has its uploaded state checked instead.
 */
export function orchestratorRoundMs(stages: readonly { params: number; replicas: number }[], work: MergeWork): OrchestratorPhases {
  const out = { upload: 0, merge: 0, apply: 0 };
  const served = (work.requestMs ?? 0) / 2;
  for (const { params, replicas } of stages) {
    if (replicas >= 2) {
      const n = mergeRequests(params, replicas);
      out.upload += replicas * (params * work.checkMsPerParam + n.upload * served);
      out.merge += MERGE_REDUNDANCY * params * work.mergedMsPerParam + replicas * n.merge * served;
      out.apply += params * work.writeMsPerParam + replicas * n.apply * served + (work.putMs ?? 0);
    } else if (replicas === 1) out.apply += params * work.checkMsPerParam + served + (work.putMs ?? 0);
  }
  return out;
}

/**
 * The requests one of `replicas` replicas makes in each phase of a stage's
 * round (src/miner/merge-round.ts): a frame per partition uploaded; for each
 * partition it merges (MERGE_REDUNDANCY of every `replicas` partitions) every
 * replica's frame downloaded and the merge uploaded; every merged partition
 * downloaded to apply.
 */
export function mergeRequests(params: number, replicas: number): OrchestratorPhases {
  const P = mergePartitions(params, replicas);
  return { upload: P, merge: ((MERGE_REDUNDANCY * P) / replicas) * (replicas + 1), apply: P };
}

/** Options of stageMergeTime beyond the stage and its replicas. */
export interface MergeTimeOptions {
  heartbeatMs: number;
  /** merge frames' bytes per parameter; undefined = the real int8-block frames */
  bytesPerParam?: number;
  tickMs?: number;
  /** the round's compute per value (undefined: not modelled) */
  work?: MergeWork;
  /** the orchestrator's compute in each phase, for every stage of the round (orchestratorRoundMs) */
  orchestrator?: OrchestratorPhases;
  /** draws the replicas' heartbeat phases and walks the clocks; undefined: every wait is its mean */
  rng?: Rng;
}

/** The merge round of a stage with `params` parameters held by `replicas`. */
export function stageMergeTime(params: number, replicas: readonly MergeLink[], options: MergeTimeOptions): StageMerge {
  const { heartbeatMs: hb, bytesPerParam, tickMs = ORCHESTRATOR_TICK_MS, work, rng } = options;
  const orchestrator = options.orchestrator ?? { upload: 0, merge: 0, apply: 0 };
  const R = replicas.length;
  if (R === 0) return { ms: 0, bytesPerReplica: 0, bytesTotal: 0, partitions: 0 };
  const clocks = roundClocks(R, hb, tickMs, rng);
  if (R < 2) {
    // one replica: straight to applying; it reports on its next heartbeat, and uploads its own state, which the orchestrator checks
    const state = params * STATE_BYTES_PER_PARAM;
    const save = transferMs(state, replicas[0].upMbps) + 2 * replicas[0].latencyMs;
    return { ms: clocks.single(save, orchestrator.apply), bytesPerReplica: 0, bytesTotal: state, partitions: 0 };
  }
  const t = stageMergeTraffic(params, R, bytesPerParam);
  const compute = (msPerValue: number | undefined, values: number): number => (msPerValue ?? 0) * values;
  const n = mergeRequests(params, R);
  const requests = (count: number, uploads: number): number => count * (work?.requestMs ?? 0) + uploads * (work?.putMs ?? 0);
  const merged = (MERGE_REDUNDANCY * mergePartitions(params, R)) / R;
  const up = replicas.map((r) => transferMs(t.uploadPseudoGradient, r.upMbps) + 2 * r.latencyMs + compute(work?.uploadMsPerParam, params) + requests(n.upload, n.upload));
  const merge = replicas.map((r) => transferMs(t.downloadAsMerger, r.downMbps) + transferMs(t.uploadMerged, r.upMbps) + 2 * r.latencyMs + compute(work?.mergeMsPerParam, MERGE_REDUNDANCY * params) + requests(n.merge, merged));
  const apply = replicas.map((r) => transferMs(t.downloadMerged, r.downMbps) + 2 * r.latencyMs + compute(work?.applyMsPerParam, params) + requests(n.apply, 0));
  const merging = clocks.phase(0, up, orchestrator.upload);
  const applying = clocks.phase(merging, merge, orchestrator.merge);
  return { ms: clocks.apply(applying, apply, orchestrator.apply), bytesPerReplica: t.total, bytesTotal: t.total * R, partitions: mergePartitions(params, R) };
}

/** A round's phases on the protocol's clocks: each returns when the round moves on, ms from its opening. */
interface RoundClocks {
  /** a phase opened at `start`: replica i does `work[i]` once it learns of it; the orchestrator does `own` from the opening */
  phase(start: number, work: readonly number[], own: number): number;
  /** the applying phase: as `phase`, but each replica's report rides its first heartbeat after it applied */
  apply(start: number, work: readonly number[], own: number): number;
  /** a single replica's round, opened in applying: it reports on the heartbeat after the one it learned on, and uploads its state in `save` from that one; the orchestrator does `own` from the opening */
  single(save: number, own: number): number;
}

function roundClocks(R: number, hb: number, tickMs: number, rng: Rng | undefined): RoundClocks {
  if (!rng) {
    // the means: the last of R heartbeats, the work (a report waits for whole heartbeat periods), half a tick
    const last = lastHeartbeatMs(hb, R);
    const periods = (work: readonly number[]): number => hb * Math.max(1, Math.ceil(Math.max(...work) / hb));
    return {
      phase: (start, work, own) => start + Math.max(last + Math.max(...work), own) + tickMs / 2,
      apply: (start, work, own) => start + Math.max(last + periods(work), own) + tickMs / 2,
      single: (save, own) => Math.max(last + Math.max(hb, save), own) + tickMs / 2,
    };
  }
  const offsets = Array.from({ length: R }, () => rng.next() * hb);
  // a replica's first heartbeat strictly after t; the first tick at or after t (ticks at whole multiples of tickMs from the opening)
  const beat = (i: number, t: number): number => Math.floor((t - offsets[i]) / hb + 1) * hb + offsets[i];
  const tick = (t: number): number => Math.ceil(t / tickMs - 1e-9) * tickMs;
  return {
    phase: (start, work, own) => tick(Math.max(start + own, ...work.map((w, i) => beat(i, start) + w))),
    apply: (start, work, own) => tick(Math.max(start + own, ...work.map((w, i) => beat(i, beat(i, start) + w)))),
    single: (save, own) => tick(Math.max(own, beat(0, beat(0, 0)), beat(0, 0) + save)),
  };
}
