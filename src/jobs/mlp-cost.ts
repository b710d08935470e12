// Cost model of the MLP classifier (src/model/mlp.ts), as src/planner/cost.ts
// is for the GPT: parameters, FLOPs per example forward and backward, and
// bytes of memory at a batch size. Pure arithmetic over the widths; it
// mirrors what `Mlp` allocates and the kernels it runs, so a job can be sized
// without building the model. The MLP is never cut into stages: it runs whole
// on one miner, replicas merging as for a GPT stage.
//
// Widths w_0 = inputs, w_1 … w_{n-1} = hidden, w_n = classes; layer i maps
// w_i → w_{i+1}. FLOPs per example (a multiply-add counts 2):
//   linear in→out   forward 2·in·out + out (bias)
//                   backward 4·in·out (dinp and dW; Mlp computes dinp for the
//                   first layer too) + out (db)
//   ReLU            1 forward, 1 backward per hidden element
//   cross-entropy   per logit 5 forward (+1 log per example), 2 backward
//                   (ELEMENTWISE_FLOPS.crossEntropy)
//
// Memory at batch size B (float32):
//   weights P·4, gradients P·4, optimizer OPTIMIZER_COPIES·P·4 (AdamW m and v,
//   DiLoCo start weights and outer momentum), activations 4·B·(2·Σw + Σhidden
//   + classes + 2): Mlp keeps every layer's output and its gradient
//   (acts, dacts: Σw each), the ReLU outputs (Σhidden), the probabilities
//   (classes), the per-example losses and int32 targets (1 each).
import { mlpParamCountOf, type MlpConfig } from '../model/mlp.ts';
import { BYTES_PER_FLOAT, ELEMENTWISE_FLOPS, OPTIMIZER_COPIES, type StageCost } from '../planner/cost.ts';
import type { FlopsPerToken } from '../planner/types.ts';

/** FLOPs per element of ReLU: a compare forward, a select backward. */
export const RELU_FLOPS = { forward: 1, backward: 1 } as const;

/** The widths of the MLP's layers, input first, classes last. */
export function mlpWidths(config: MlpConfig): number[] {
  const widths = [config.inputs, ...config.hidden, config.classes];
  if (!widths.every((n) => Number.isInteger(n) && n > 0)) throw new RangeError(`mlp widths must be positive integers, got ${widths.join(', ')}`);
  return widths;
}

/** Parameters: a weight matrix and a bias per layer. */
export function mlpParamCount(config: MlpConfig): number {
  mlpWidths(config);
  return mlpParamCountOf(config);
}

/** FLOPs to train on one example, forward and backward (see the file header). */
export function mlpFlopsPerExample(config: MlpConfig): FlopsPerToken {
  const w = mlpWidths(config);
  const E = ELEMENTWISE_FLOPS;
  let forward = 0;
  let backward = 0;
  for (let i = 0; i + 1 < w.length; i++) {
    forward += 2 * w[i] * w[i + 1] + E.bias.forward * w[i + 1];
    backward += 4 * w[i] * w[i + 1] + E.bias.backward * w[i + 1];
  }
  const hidden = config.hidden.reduce((a, h) => a + h, 0);
  forward += RELU_FLOPS.forward * hidden + E.crossEntropy.forward * config.classes + 1;
  backward += RELU_FLOPS.backward * hidden + E.crossEntropy.backward * config.classes;
  return { forward, backward };
}

/** Values per example of activations Mlp keeps at its batch size (see the file header). */
export function mlpActivationValuesPerExample(config: MlpConfig): number {
  const w = mlpWidths(config);
  const sum = w.reduce((a, x) => a + x, 0);
  const hidden = config.hidden.reduce((a, h) => a + h, 0);
  return 2 * sum + hidden + config.classes + 2;
}

/**
 * Cost of the whole MLP on one miner at `batchSize` examples per step, in the
 * planner's StageCost shape (`flopsPerToken` is per example here).
 */
export function mlpCost(config: MlpConfig, batchSize: number): StageCost {
  if (!Number.isInteger(batchSize) || batchSize < 1) throw new RangeError(`batchSize must be a positive integer, got ${batchSize}`);
  const params = mlpParamCount(config);
  const weights = params * BYTES_PER_FLOAT;
  const optimizer = OPTIMIZER_COPIES * params * BYTES_PER_FLOAT;
  const activations = BYTES_PER_FLOAT * batchSize * mlpActivationValuesPerExample(config);
  return {
    params,
    flopsPerToken: mlpFlopsPerExample(config),
    memoryBytes: { weights, gradients: weights, optimizer, activations, total: 2 * weights + optimizer + activations },
  };
}
