// Traffic of a merge round: the bytes each replica moves, and their ratio to
// an fp32 gradient all-reduce (published as `network.merge_compression`).
//
// Baseline: data-parallel training that all-reduces fp32 gradients every
// inner step moves 4 bytes × params per replica per step.
//
// Ours, per replica per merge round (averaged over the R replicas; r =
// min(redundancy, R) mergers per partition; F = bytes of one replica's
// pseudo-gradient frames over all partitions; G = bytes of the merged frames
// over all partitions):
//
//   upload its pseudo-gradient frames              F
//   as a merger, download the other replicas'      r·(R − 1)·F / R
//     slices of the partitions it merges
//   as a merger, upload the merged partitions      r·G / R
//   download the merged partitions it did not      (R − r)·G / R
//     merge itself
//
// With R = 1 nothing is exchanged. Per inner step this is divided by H, and
//
//   ratio = (4 · params) / (bytes per replica per round / H).

import { MergeError } from './errors.ts';

/** Sizes that determine a round's traffic. */
export interface MergeTrafficInput {
  /** Replicas of the stage, R ≥ 1. */
  replicas: number;
  /** Mergers per partition (default 2; capped at R). */
  redundancy?: number;
  /** Bytes of one replica's pseudo-gradient frames, all partitions together. */
  pseudoGradientBytes: number;
  /** Bytes of the merged frames, all partitions together. */
  mergedBytes: number;
}

/** Average bytes one replica moves in one merge round. */
export interface MergeTraffic {
  /** Its own pseudo-gradient frames. */
  uploadPseudoGradient: number;
  /** Other replicas' slices of the partitions it merges. */
  downloadAsMerger: number;
  /** The merged partitions it computed. */
  uploadMerged: number;
  /** The merged partitions computed by others. */
  downloadMerged: number;
  upload: number;
  download: number;
  /** upload + download. */
  total: number;
}

/** Inputs of mergeTrafficRatio. */
export interface MergeTrafficRatioInput extends MergeTrafficInput {
  /** Parameters of the stage (the length of the flat vector). */
  params: number;
  /** Inner steps between merges, H. */
  innerSteps: number;
}

/** Merge traffic per inner step against an fp32 gradient all-reduce, and what it is made of. */
export interface MergeTrafficRatio {
  /** 4 · params: fp32 gradient all-reduce bytes per replica per inner step. */
  fp32BytesPerStep: number;
  /** traffic.total / H. */
  mergeBytesPerStep: number;
  /** fp32BytesPerStep / mergeBytesPerStep: the `network.merge_compression` value. */
  ratio: number;
  /** Bytes per parameter of the pseudo-gradient frames (F / params). */
  pseudoGradientBytesPerParam: number;
  traffic: MergeTraffic;
}

/** Bytes of fp32 gradients a data-parallel replica exchanges per inner step: 4 · params. */
export function fp32GradientBytesPerStep(params: number): number {
  checkPositiveInteger('params', params);
  return 4 * params;
}

/** Average bytes one replica uploads and downloads in one merge round (see the module comment). */
export function mergeTrafficPerReplica(input: MergeTrafficInput): MergeTraffic {
  const R = input.replicas;
  checkPositiveInteger('replicas', R);
  const redundancy = input.redundancy ?? 2;
  checkPositiveInteger('redundancy', redundancy);
  const F = input.pseudoGradientBytes;
  const G = input.mergedBytes;
  if (!(Number.isFinite(F) && F >= 0 && Number.isFinite(G) && G >= 0)) throw new MergeError('bad_argument', `frame bytes must be finite and non-negative, got ${F} and ${G}`);
  if (R === 1) return { uploadPseudoGradient: 0, downloadAsMerger: 0, uploadMerged: 0, downloadMerged: 0, upload: 0, download: 0, total: 0 };
  const r = Math.min(redundancy, R);
  const uploadPseudoGradient = F;
  const downloadAsMerger = (r * (R - 1) * F) / R;
  const uploadMerged = (r * G) / R;
  const downloadMerged = ((R - r) * G) / R;
  const upload = uploadPseudoGradient + uploadMerged;
  const download = downloadAsMerger + downloadMerged;
  return { uploadPseudoGradient, downloadAsMerger, uploadMerged, downloadMerged, upload, download, total: upload + download };
}

/**
 * fp32 data-parallel gradient bytes per inner step divided by our merge bytes
 * per inner step (per replica per round / H): the `network.merge_compression`
 * figure. Infinity with one replica (no traffic).
 */
export function mergeTrafficRatio(input: MergeTrafficRatioInput): MergeTrafficRatio {
  checkPositiveInteger('innerSteps', input.innerSteps);
  const fp32BytesPerStep = fp32GradientBytesPerStep(input.params);
  const traffic = mergeTrafficPerReplica(input);
  const mergeBytesPerStep = traffic.total / input.innerSteps;
  return {
    fp32BytesPerStep,
    mergeBytesPerStep,
    ratio: fp32BytesPerStep / mergeBytesPerStep,
    pseudoGradientBytesPerParam: input.pseudoGradientBytes / input.params,
    traffic,
  };
}

function checkPositiveInteger(name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 1) throw new MergeError('bad_argument', `${name} must be a positive integer, got ${value}`);
}
