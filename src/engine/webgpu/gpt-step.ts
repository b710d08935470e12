// A whole GPT training step on the GPU: zero the gradients, forward from
// token ids to the loss, backward to the embeddings (gpt-stage.ts over the
// whole model, one slot), the gradient norm, and AdamW, with every tensor
// staying on the GPU. It mirrors a whole-model GptStage (src/model/gpt.ts)
// with src/model/adamw.ts: the same flat layout (wholeModelLayout) and the
// same clipping.
//
// The step waits once: for the per-row losses and the gradient norm's chunk
// partials, which the CPU adds in float64 in a fixed order, as the WASM
// engine does, to decide the clipping scale before AdamW is queued.
import { NORM_CHUNK, type AdamWArgs } from '../kernels.ts';
import { createArray, readArray, uploadArray, type GpuArray } from './buffers.ts';
import { clearRef, wholeModel, type FlatLayout, type GpuFlat, type GptShape } from './gpt-buffers.ts';
import { GpuGptStage } from './gpt-stage.ts';

/** AdamW's hyperparameters (src/model/adamw.ts AdamWConfig is one; gradClip 0 disables clipping). */
export type GpuAdamWConfig = Pick<AdamWArgs, 'lr' | 'beta1' | 'beta2' | 'eps' | 'weightDecay'> & { gradClip: number };

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
  /** AdamW steps taken */
  step = 0;
  private readonly m: GpuArray;
  private readonly v: GpuArray;
  private readonly partials: GpuArray;
  private destroyed = false;

  private constructor(
    private readonly device: GPUDevice,
    private readonly stage: GpuGptStage,
    private readonly options: GpuGptStepOptions,
  ) {
    const n = stage.layout.size;
    this.m = uploadArray(device, new Float32Array(n), 'adamw m');
    this.v = uploadArray(device, new Float32Array(n), 'adamw v');
    this.partials = createArray(device, Math.ceil(n / NORM_CHUNK), 'grad norm partials');
    this.optimizer = { ...options.optimizer };
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
   * this step. Resolves after the losses and gradient norm are read back;
   * AdamW is queued, not awaited (later reads see it).
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
    const chunks = Math.ceil(layout.size / NORM_CHUNK);
    this.stage.kernels.optimizer.sumSquaresPartials(this.partials, this.grads.array, layout.size);
    const [loss, partials] = await Promise.all([this.stage.readLoss(0), readArray(this.device, this.partials, 0, chunks)]);
    let sumSq = 0;
    for (let c = 0; c < chunks; c++) sumSq += partials[c];
    const gradNorm = Math.sqrt(sumSq);
    this.update(lr, gradNorm);
    return { loss, gradNorm };
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
    for (const a of [this.m, this.v, this.partials]) a.destroy();
    this.stage.destroy();
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('gpt step was destroyed');
  }

  /** AdamW.update of src/model/adamw.ts: clip by the global norm, then the decay range and the rest. */
  private update(lr: number, gradNorm: number): void {
    const c = this.optimizer;
    const scale = c.gradClip > 0 && gradNorm > c.gradClip ? c.gradClip / gradNorm : 1;
    this.step++;
    const ranges: [number, number, number][] = [
      [0, this.layout.decaySize, c.weightDecay],
      [this.layout.decaySize, this.layout.size, 0],
    ];
    for (const [start, end, wd] of ranges) {
      if (end <= start) continue;
      this.stage.kernels.optimizer.adamw({
        params: { array: this.params.array, offset: start },
        grads: { array: this.grads.array, offset: start },
        m: { array: this.m, offset: start },
        v: { array: this.v, offset: start },
        n: end - start,
        lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weightDecay: wd,
        step: this.step,
        gradScale: scale,
      });
    }
  }
}
