// Entry point of the kernel module: every export here is callable from the
// engine (src/engine/kernels.ts). Kernels take raw pointers into the shared
// memory and, last, (tid, nt): the share of the work this thread does.
export { sgemm, SGEMM_WORK_BYTES } from './gemm';
export {
  addForward, accumulate, geluForward, geluBackward, reluForward, reluBackward, adamw, adamPredict, sumSquares,
} from './elementwise';
export {
  embeddingForward, embeddingBackward, layernormForward, layernormBackwardInput, layernormBackwardParams,
  biasBackward, crossEntropyForward, crossEntropyBackward,
} from './rows';
export { attentionForward, attentionBackward, attentionScratchFloats } from './attention';
export { kvCacheStore, attentionCached } from './attention-cached';
export {
  rmsnormForward, rmsnormBackwardInput, rmsnormBackwardParams, ropeForward, ropeBackward, swigluForward, swigluBackward,
} from './decoder';
export { gqaAttentionForward, gqaAttentionBackward, gqaCacheStore, gqaAttentionCached } from './attention-gqa';

/** First byte after the module's static data: the engine allocates from here. */
export function heapBase(): usize {
  return __heap_base;
}
