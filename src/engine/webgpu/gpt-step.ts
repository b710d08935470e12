// A whole GPT training step on the GPU: zero the gradients, forward from
// token ids to the loss, backward to the embeddings (gpt-stage.ts over the
// whole model, one slot), and AdamW with its gradient norm and clipping
// (stage-optimizer.ts), with every tensor staying on the GPU. It mirrors a
// whole-model GptStage (src/model/gpt.ts) with src/model/adamw.ts: the same
// flat layout (wholeModelLayout) and the same clipping.
//
// The step waits once, after AdamW is queued: for the per-row losses and the
// status of the step (its gradient norm), which are all the CPU reads. The
// clipping scale is worked out on the GPU from the norm's chunk partials in
// chunk order (a compensated float32 sum, where the WASM engine adds them in
// float64: the norms agree to about 1e-7 of their size).
import { clearRef, wholeModel, type FlatLayout, type GpuFlat, type GptShape } from './gpt-buffers.ts';
import { GpuGptStage } from './gpt-stage.ts';
import { GpuStageOptimizer, type GpuAdamWConfig } from './stage-optimizer.ts';

export interface GpuGptStepOptions {
  /** sequences per batch (each of the config's context length) */
  batchSize: number;
  optimizer: GpuAdamWConfig;
  /**
   * Test hook: the names of parameters whose gradient the step zeroes before
   * the optimizer (negative controls: a step that drops one layer's gradient).
   */
  dropGradients?: readonly string[];
}

export interface GpuStepResult {
  /** mean cross-entropy over the batch (float64 mean of the float32 per-row losses, as the WASM layer computes it) */
  loss: number;
  /** the gradient norm before clipping */
  gradNorm: number;
}

/** A whole GPT on one device: its stage (kernels, parameters, gradients, activations) and AdamW's moments. */
export class GpuGptStep {
  readonly optimizer: GpuAdamWConfig;
  private readonly adamw: GpuStageOptimizer;
  private destroyed = false;

  private constructor(
    private readonly device: GPUDevice,
    private readonly stage: GpuGptStage,
    private readonly options: GpuGptStepOptions,
  ) {
    this.optimizer = { ...options.optimizer };
    try {
      this.adamw = new GpuStageOptimizer(device, stage.kernels.optimizer, stage.layout, stage.params.array, this.optimizer);
    } catch (err) {
      stage.destroy();
      throw err;
    }
  }

  /** AdamW steps taken */
  get step(): number {
    return this.adamw.step;
  }

  /**
   * Compiles the kernels and uploads the parameters once. `layout` is the
   * model's own layout of the whole model (a whole-model GptStage's
   * `layout`, src/model/params.ts); `params` is laid out by it.
   */
  static async create(device: GPUDevice, config: GptShape, layout: FlatLayout, params: Float32Array, options: GpuGptStepOptions): Promise<GpuGptStep> {
    const stage = await GpuGptStage.create(device, config, wholeModel(config), layout, params, { batchSize: options.batchSize });
    return new GpuGptStep(device, stage, options);
  }

  get config(): GptShape {
    return this.stage.config;
  }

  get layout(): FlatLayout {
    return this.stage.layout;
  }

  get params(): GpuFlat {
    return this.stage.params;
  }

  get grads(): GpuFlat {
    return this.stage.grads;
  }

  /**
   * One training step on B sequences (B ≤ batchSize) of the context length:
   * inputs and targets hold B·T ids. `lr` overrides the optimizer's rate for
   * this step. Resolves once the losses and the step's status are read
   * back, after AdamW has run.
   */
  async trainStep(inputs: Int32Array, targets: Int32Array, B: number, lr: number = this.optimizer.lr): Promise<GpuStepResult> {
    this.checkAlive();
    const T = this.config.contextLength;
    if (!Number.isInteger(B) || B < 1 || B > this.options.batchSize) throw new RangeError(`gpt step: batch ${B} outside 1..${this.options.batchSize}`);
    if (inputs.length !== B * T || targets.length !== B * T) throw new RangeError(`gpt step: ${inputs.length} inputs and ${targets.length} targets for ${B}×${T}`);
    const layout = this.layout;
    this.stage.clearGrads();
    this.stage.forward(inputs, B, T, targets, 0);
    this.stage.backward(undefined, 0);
    for (const name of this.options.dropGradients ?? []) clearRef(this.device, this.grads.ref(name), layout.byName.get(name)!.size);
    this.adamw.update(this.grads.array, lr);
    const [loss, status] = await Promise.all([this.stage.readLoss(0), this.adamw.readStatus()]);
    return { loss, gradNorm: status.norm };
  }

  /** The parameters, read back (waits for queued work). */
  readParams(): Promise<Float32Array> {
    return this.stage.readParams();
  }

  /** The gradients of the last step, read back (tests). */
  readGrads(): Promise<Float32Array> {
    return this.stage.readGrads();
  }

  /** Replaces the parameters (same layout); the moments and step count stay. */
  writeParams(params: Float32Array): void {
    this.stage.writeParams(params);
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.adamw.destroy();
    this.stage.destroy();
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('gpt step was destroyed');
  }
}
