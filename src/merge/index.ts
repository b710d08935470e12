// The merge math of a stage's replicas (DiLoCo rounds with a butterfly
// all-reduce with redundancy): partitions and mergers, pseudo-gradient frames,
// aggregators, the outer optimizer, and the communication figures.
// Pure functions over Float32Array: no I/O. See docs/merging.md.

export { MergeError, type MergeErrorCode } from './errors.ts';
export {
  assignMergers,
  checkPartitions,
  maxPartitions,
  mergerLoads,
  partitionVector,
  partitionsMergedBy,
  reassign,
  type MergerAssignment,
  type Partition,
} from './partition.ts';
export {
  bytesPerParameter,
  decodePartitionFrame,
  decodePartitionFrames,
  encodeMergedPartition,
  encodePseudoGradientPartitions,
  framesByteLength,
  pseudoGradient,
  type DecodePartitionOptions,
  type PartitionFrameMeta,
} from './pseudo-gradient.ts';
export {
  AGGREGATORS,
  DEFAULT_TRIM,
  aggregate,
  median,
  signedGeometricMean,
  trimmedMean,
  weightedMean,
  type AggregateOptions,
  type AggregatorName,
} from './aggregate.ts';
export {
  DEFAULT_OUTER_LR,
  DEFAULT_OUTER_MOMENTUM,
  OUTER_STATE_KIND,
  cloneOuterState,
  createOuterState,
  deserializeOuterState,
  outerStep,
  serializeOuterState,
  type OuterOptions,
  type OuterState,
} from './outer.ts';
export {
  fp32GradientBytesPerStep,
  mergeCompression,
  mergeTrafficPerReplica,
  type MergeCompression,
  type MergeCompressionInput,
  type MergeTraffic,
  type MergeTrafficInput,
} from './compression.ts';
