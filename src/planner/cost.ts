// Cost model of a GPT part and of a stage (a contiguous range of parts):
// parameters, FLOPs per token forward and backward, and bytes of memory.
// Pure arithmetic over the config; it mirrors what `GptStage` allocates and
// the kernels it runs (src/model/gpt.ts), so the planner can size a stage
// without building it.
//
// Notation: V vocabulary, T context length, C channels, NH heads, H = C ·
// mlpRatio (MLP hidden width), k̄ = (T + 1) / 2 the average number of keys a
// query attends to under the causal mask (query i sees keys 0..i). A model
// with an arch (Llama, Qwen2: src/model/arch.ts) has its own widths in place
// of 3C (qkv), C (attention output) and H (the MLP), and biases only where
// its arch has them (blockWidths).
//
// FLOPs per token (a multiply-add counts 2):
//   linear in→out        forward 2·in·out (+ out for the bias)
//                        backward 4·in·out (dinp and dW; + out for db)
//   attention (a block)  forward 4·C·k̄ (QKᵀ and AV) + 5·NH·k̄ (softmax)
//                        backward 8·C·k̄ (dAtt, dV, dQ, dK) + 4·NH·k̄
//   element-wise terms   per element, see ELEMENTWISE_FLOPS
// Summed per part (one-token totals for gpt-tiny in docs/planner.md):
//   embedding  forward C (wte + wpe), backward 2·C (two accumulations)
//   block      forward 8C² + 4CH + 4C·k̄ + 5NH·k̄ + 23C + 10H
//              backward 16C² + 8CH + 8C·k̄ + 4NH·k̄ + 35C + 17H
//   head       forward 2CV + 8C + 5V + 1, backward 4CV + 14C + 2V
//
// Memory of a stage holding P parameters (float32):
//   weights P·4, gradients P·4,
//   optimizer (AdamW m and v, DiLoCo start weights and outer momentum) 4·P·4,
//   activations 4 · B·T · (slots · perSlot + scratch) where perSlot and
//   scratch are the floats per token of activationFloatsPerToken.
// Those byte counts are the engine's (ENGINE_MEMORY); the simulator can ask
// what another precision or optimizer layout would need (a MemoryModel).
import type { GptConfig } from '../model/config.ts';
import { blockWidths, resolveArch } from '../model/arch.ts';
import { validateGptShape } from '../model/config.ts';
import { headPart, partCount, partParamCount, type StageRange } from '../model/parts.ts';
import type { FlopsPerToken } from './types.ts';

/** Bytes of one float32 (weights, gradients, optimizer state and activations are all float32). */
export const BYTES_PER_FLOAT = 4;

/** Float32 copies of the parameters kept besides the weights and gradients: AdamW m and v, DiLoCo start weights and outer momentum. */
export const OPTIMIZER_COPIES = 4;

/**
 * FLOPs per element of the element-wise kernels, forward and backward.
 * Layer norm: mean 1, variance 3, normalize and affine 4 = 8; backward
 * recomputes the normalized value, takes two reductions and writes dinp, dw, db.
 * GELU (tanh form): 9 forward, 16 backward with the derivative of tanh.
 * Softmax, per score: scale, max, subtract, exp, sum (+ normalize folded in) = 5;
 * backward: a dot product (2) and (dp − dot)·p (2). Cross-entropy, per logit:
 * the softmax (5) forward, (p − y)/N (2) backward; plus a log per token.
 * Residual add: 1 forward; backward the gradient is accumulated once (1).
 * Bias: 1 per output forward (add) and backward (db +=).
 */
export const ELEMENTWISE_FLOPS = {
  layernorm: { forward: 8, backward: 14 },
  gelu: { forward: 9, backward: 16 },
  softmax: { forward: 5, backward: 4 },
  crossEntropy: { forward: 5, backward: 2 },
  residual: { forward: 1, backward: 1 },
  bias: { forward: 1, backward: 1 },
} as const;

/** Bytes a stage keeps per parameter and per activation value. */
export interface MemoryModel {
  /** per parameter: the weights */
  weightBytes: number;
  /** per parameter: the gradients */
  gradientBytes: number;
  /** per parameter: every optimizer and DiLoCo copy together */
  optimizerBytes: number;
  /** per activation value kept for the backward pass */
  activationBytes: number;
  /** whether the attention probabilities (NH·T per token and block) are kept for the backward; false: recomputed from Q and K (flash-style) */
  keepsAttentionProbs: boolean;
  /**
   * activation checkpointing at the stage's input: a microbatch in flight
   * keeps only what entered the stage, and the backward runs the forward
   * again block by block (one block's activations at a time, as scratch),
   * which costs a forward more per backward. Default false (the engine keeps
   * everything).
   */
  recomputesActivations?: boolean;
}

/** What the engine keeps: everything float32, the attention probabilities too. */
export const ENGINE_MEMORY: MemoryModel = {
  weightBytes: BYTES_PER_FLOAT,
  gradientBytes: BYTES_PER_FLOAT,
  optimizerBytes: OPTIMIZER_COPIES * BYTES_PER_FLOAT,
  activationBytes: BYTES_PER_FLOAT,
  keepsAttentionProbs: true,
};

/** Bytes a stage needs on the miner that holds it. */
export interface MemoryBytes {
  /** parameters (float32 in the engine) */
  weights: number;
  /** gradients (float32 in the engine) */
  gradients: number;
  /** AdamW m and v plus DiLoCo start weights and outer momentum: 4 float32 copies of the parameters in the engine */
  optimizer: number;
  /** activations of every microbatch in flight plus the backward scratch */
  activations: number;
  total: number;
}

/** Cost of a stage (or of one part, as a one-part stage). */
export interface StageCost {
  params: number;
  flopsPerToken: FlopsPerToken;
  memoryBytes: MemoryBytes;
}

/** Floats per token of activations a stage keeps. */
export interface ActivationFloats {
  /** kept per microbatch in flight (for the backward pass): multiply by slots */
  perSlot: number;
  /** backward scratch, one set per stage, reused by every backward pass */
  scratch: number;
}

/** Forward + backward FLOPs per token. */
export function totalFlops(flops: FlopsPerToken): number {
  return flops.forward + flops.backward;
}

/** Average number of keys a query attends to under the causal mask: (T + 1) / 2. */
export function causalKeysPerQuery(config: GptConfig): number {
  return (config.contextLength + 1) / 2;
}

/** FLOPs per token of one part (0 = embedding, then the blocks, headPart = head); see the file header for the formulas. */
export function partFlopsPerToken(config: GptConfig, part: number): FlopsPerToken {
  checkPart(config, part);
  const { vocabSize: V, channels: C, heads: NH } = config;
  const w = blockWidths(config);
  const arch = resolveArch(config);
  const E = ELEMENTWISE_FLOPS;
  if (part === 0) return { forward: C, backward: 2 * C };
  if (part === headPart(config)) {
    return {
      forward: E.layernorm.forward * C + 2 * C * V + E.crossEntropy.forward * V + 1,
      backward: E.crossEntropy.backward * V + 4 * C * V + E.layernorm.backward * C,
    };
  }
  const k = causalKeysPerQuery(config);
  const matmulWeights = C * w.qkv + w.attn * C + C * w.fc + w.hidden * C;
  const biasOutputs = (arch.qkvBias ? w.qkv : 0) + (arch.attnOutBias ? C : 0) + (arch.mlpBias ? w.fc + C : 0);
  const H = w.hidden;
  const forward =
    2 * matmulWeights +
    E.bias.forward * biasOutputs +
    4 * w.attn * k + E.softmax.forward * NH * k +
    2 * E.layernorm.forward * C +
    E.gelu.forward * H +
    2 * E.residual.forward * C;
  const backward =
    4 * matmulWeights +
    E.bias.backward * biasOutputs +
    8 * w.attn * k + E.softmax.backward * NH * k +
    2 * E.layernorm.backward * C +
    E.gelu.backward * H +
    2 * E.residual.backward * C;
  return { forward, backward };
}

/**
 * Floats per token of activations a stage keeps (as GptStage allocates them,
 * src/model/block.ts). With the widths of src/model/arch.ts (qkv = (H + 2·KV)·D,
 * attn = H·D, fc = I or 2I for SwiGLU, hidden = I; the byte GPT: 3C, C, 4C, 4C):
 * per microbatch in flight: the input activation C; token ids 1 (first stage)
 * and targets 1 (last stage); per block ln1 C, its mean and rstd 2, qkv,
 * attention probabilities NH·T, atty attn, res2 C, ln2 C + 2, fch fc, its
 * activation hidden, out C; the head lnf C + 2, logits V, probs V, loss 1.
 * Scratch, once per stage: dres, dsmall, tmp C each, dattn (none when attn =
 * C), dqkv, dfc, dhidden (none with GELU, in place), and dlogits V on the last
 * stage (written and consumed within one backward). Rotary tables (T·D) and
 * positions are not counted.
 * `recomputes` (activation checkpointing, MemoryModel.recomputesActivations):
 * a microbatch keeps only its input, and the scratch grows by the largest of
 * one block's or the head's activations, rebuilt one at a time.
 */
export function activationFloatsPerToken(config: GptConfig, range: StageRange, keepsAttentionProbs = true, recomputes = false): ActivationFloats {
  checkRange(config, range);
  const { vocabSize: V, contextLength: T, channels: C, heads: NH } = config;
  const w = blockWidths(config);
  const gelu = resolveArch(config).mlp === 'gelu';
  const first = range.from === 0;
  const last = range.to === partCount(config);
  const blocks = Math.max(0, Math.min(range.to, headPart(config)) - Math.max(range.from, 1));
  const block = 4 * C + w.qkv + w.attn + w.fc + w.hidden + 4 + (keepsAttentionProbs ? NH * T : 0);
  const head = last ? C + 2 + 2 * V + 1 : 0;
  const input = C + (first ? 1 : 0) + (last ? 1 : 0);
  const scratch = 3 * C + (w.attn === C ? 0 : w.attn) + w.qkv + w.fc + (gelu ? 0 : w.hidden) + (last ? V : 0);
  // recomputing: only the input is kept per microbatch; one block's (or the head's) activations are rebuilt at a time
  if (recomputes) return { perSlot: input, scratch: scratch + Math.max(blocks > 0 ? block : 0, head) };
  return { perSlot: input + blocks * block + head, scratch };
}

/**
 * Cost of the stage holding parts [range.from, range.to) that runs
 * microbatches of `batchSize` sequences of the full context, with `slots`
 * microbatches in flight (each keeps its activations until its backward).
 */
export function stageCost(config: GptConfig, range: StageRange, batchSize: number, slots: number, memory: MemoryModel = ENGINE_MEMORY): StageCost {
  validateGptShape(config);
  checkRange(config, range);
  checkPositiveInt('batchSize', batchSize);
  checkPositiveInt('slots', slots);
  let params = 0;
  let forward = 0;
  let backward = 0;
  for (let p = range.from; p < range.to; p++) {
    params += partParamCount(config, p);
    const f = partFlopsPerToken(config, p);
    forward += f.forward;
    backward += f.backward;
  }
  const acts = activationFloatsPerToken(config, range, memory.keepsAttentionProbs, memory.recomputesActivations);
  if (memory.recomputesActivations) backward += forward;
  const tokens = batchSize * config.contextLength;
  const weights = params * memory.weightBytes;
  const gradients = params * memory.gradientBytes;
  const optimizer = params * memory.optimizerBytes;
  const activations = memory.activationBytes * tokens * (slots * acts.perSlot + acts.scratch);
  return {
    params,
    flopsPerToken: { forward, backward },
    memoryBytes: { weights, gradients, optimizer, activations, total: weights + gradients + optimizer + activations },
  };
}

/**
 * stageCost for many ranges of one config: per-part costs are computed once
 * and summed by prefix, so each range costs O(1). Gives the same numbers as
 * stageCost.
 */
export function stageCostTable(config: GptConfig, batchSize: number, slots: number, memory: MemoryModel = ENGINE_MEMORY): (range: StageRange) => StageCost {
  validateGptShape(config);
  checkPositiveInt('batchSize', batchSize);
  checkPositiveInt('slots', slots);
  const P = partCount(config);
  const params = [0];
  const forward = [0];
  const backward = [0];
  for (let p = 0; p < P; p++) {
    const f = partFlopsPerToken(config, p);
    params.push(params[p] + partParamCount(config, p));
    forward.push(forward[p] + f.forward);
    backward.push(backward[p] + f.backward);
  }
  const tokens = batchSize * config.contextLength;
  return (range: StageRange): StageCost => {
    checkRange(config, range);
    const n = params[range.to] - params[range.from];
    const acts = activationFloatsPerToken(config, range, memory.keepsAttentionProbs, memory.recomputesActivations);
    const fwd = forward[range.to] - forward[range.from];
    const bwd = backward[range.to] - backward[range.from] + (memory.recomputesActivations ? fwd : 0);
    const weights = n * memory.weightBytes;
    const gradients = n * memory.gradientBytes;
    const optimizer = n * memory.optimizerBytes;
    const activations = memory.activationBytes * tokens * (slots * acts.perSlot + acts.scratch);
    return {
      params: n,
      flopsPerToken: { forward: fwd, backward: bwd },
      memoryBytes: { weights, gradients, optimizer, activations, total: weights + gradients + optimizer + activations },
    };
  };
}

function checkPart(config: GptConfig, part: number): void {
  if (!Number.isInteger(part) || part < 0 || part >= partCount(config)) {
    throw new RangeError(`no part ${part}: the model has parts 0..${partCount(config) - 1}`);
  }
}

function checkRange(config: GptConfig, range: StageRange): void {
  const parts = partCount(config);
  if (!(Number.isInteger(range.from) && Number.isInteger(range.to) && 0 <= range.from && range.from < range.to && range.to <= parts)) {
    throw new RangeError(`bad stage range [${range.from}, ${range.to}) for ${parts} parts`);
  }
}

function checkPositiveInt(name: string, n: number): void {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`${name} must be a positive integer, got ${n}`);
}
