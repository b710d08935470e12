// What a miner would keep per parameter and per activation under another
// training layout than the engine's: what-ifs for the simulator (`nbcli
// simulate --memory-model`), so that one can ask what it would take for home
// GPUs to hold a stage of a 100B model. Only `engine` is what the WASM and
// WebGPU engines do today; the others are not implemented anywhere.
import { ENGINE_MEMORY, type MemoryModel } from '../planner/cost.ts';

export const MEMORY_MODELS = {
  /** the engine: everything float32, attention probabilities kept (24 bytes per parameter) */
  engine: ENGINE_MEMORY,
  /**
   * mixed precision: bf16 weights and gradients, an fp32 master copy and AdamW
   * m and v (12), DiLoCo start weights and outer momentum in bf16 (4);
   * bf16 activations, attention recomputed in the backward (flash-style): 20
   * bytes per parameter
   */
  bf16: { weightBytes: 2, gradientBytes: 2, optimizerBytes: 16, activationBytes: 2, keepsAttentionProbs: false },
  /**
   * as bf16, with the optimizer and DiLoCo state (16 bytes per parameter) in
   * the host's RAM and the update done there (ZeRO-Offload): 4 bytes per
   * parameter on the accelerator
   */
  'bf16-offload': { weightBytes: 2, gradientBytes: 2, optimizerBytes: 0, activationBytes: 2, keepsAttentionProbs: false },
  /**
   * as bf16-offload, with activation checkpointing at the stage's input: a
   * microbatch in flight keeps only the activation that entered the stage
   * (C values per token), and the backward recomputes the forward block by
   * block, a forward's FLOPs more; so a miner can hold many more microbatches
   * in flight
   */
  'bf16-offload-recompute': { weightBytes: 2, gradientBytes: 2, optimizerBytes: 0, activationBytes: 2, keepsAttentionProbs: false, recomputesActivations: true },
} as const satisfies Record<string, MemoryModel>;

export type MemoryModelName = keyof typeof MEMORY_MODELS;

export function isMemoryModelName(name: string): name is MemoryModelName {
  return Object.hasOwn(MEMORY_MODELS, name);
}
