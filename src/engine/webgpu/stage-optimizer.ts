// AdamW over one flat weights array on the GPU, as src/model/adamw.ts runs it
// on WASM: global-norm clipping, decoupled weight decay on the layout's decay
// range, and SpecTrain's weight prediction. The moments, the gradient norm's
// chunk partials and the clipping scale stay on the GPU: a step only queues
// work (sumSquares' partials, clipScale, AdamW on each range), so nothing
// waits for it. A step whose gradient norm is not finite is skipped on the
// GPU (weights and moments unchanged) and counted in the status array, which
// `readStatus` reads back when the caller reads something anyway.
import { NORM_CHUNK, type AdamWArgs } from '../kernels.ts';
import { createArray, copyArray, readArray, uploadArray, writeArray, type GpuArray } from './buffers.ts';
import type { FlatLayout } from './gpt-buffers.ts';
import type { GpuOptimizer } from './optimizer.ts';

/** AdamW's hyperparameters (src/model/adamw.ts AdamWConfig is one; gradClip 0 disables clipping). */
export type GpuAdamWConfig = Pick<AdamWArgs, 'lr' | 'beta1' | 'beta2' | 'eps' | 'weightDecay'> & { gradClip: number };

/** What the GPU says of the steps so far. */
export interface GpuStepStatus {
  /** the last step's gradient norm, before clipping (float32, summed over chunks on the GPU) */
  norm: number;
  /** steps skipped because their gradient norm was not finite */
  nonFinite: number;
}

export class GpuStageOptimizer {
  /** steps taken (skipped ones too: the bias corrections count them, as a WASM step that threw would have) */
  step = 0;
  private readonly m: GpuArray;
  private readonly v: GpuArray;
  private readonly partials: GpuArray;
  private readonly status: GpuArray;
  private destroyed = false;

  /**
   * AdamW state for `weights` (not owned: the caller frees it), laid out by
   * `layout` (floats [0, decaySize) take weight decay), with the kernels of
   * `kernels` (a stage's compiled GpuKernelSet.optimizer).
   */
  constructor(
    private readonly device: GPUDevice,
    private readonly kernels: GpuOptimizer,
    private readonly layout: Pick<FlatLayout, 'size' | 'decaySize'>,
    readonly weights: GpuArray,
    readonly config: GpuAdamWConfig,
  ) {
    if (weights.length !== layout.size) throw new RangeError(`stage optimizer: ${weights.length} weights for a layout of ${layout.size}`);
    const n = layout.size;
    const owned: GpuArray[] = [];
    try {
      this.m = createArray(device, n, 'adamw m');
      owned.push(this.m);
      this.v = createArray(device, n, 'adamw v');
      owned.push(this.v);
      this.partials = createArray(device, Math.max(1, Math.ceil(n / NORM_CHUNK)), 'grad norm partials');
      owned.push(this.partials);
      this.status = uploadArray(device, Float32Array.of(1, 0, 0, 0), 'step status');
    } catch (err) {
      for (const a of owned) a.destroy();
      throw err;
    }
  }

  /** Queues one AdamW step from `grads` (the layout's size) at rate `lr`: the clipping scale is worked out on the GPU. */
  update(grads: GpuArray, lr: number = this.config.lr): void {
    this.checkAlive();
    const n = this.layout.size;
    if (grads.length !== n) throw new RangeError(`stage optimizer: ${grads.length} gradients for ${n} weights`);
    const c = this.config;
    const chunks = Math.ceil(n / NORM_CHUNK);
    this.kernels.sumSquaresPartials(this.partials, grads, n);
    this.kernels.clipScale(this.status, this.partials, chunks, c.gradClip);
    this.step++;
    const ranges: [number, number, number][] = [
      [0, this.layout.decaySize, c.weightDecay],
      [this.layout.decaySize, n, 0],
    ];
    for (const [start, end, wd] of ranges) {
      if (end <= start) continue;
      this.kernels.adamwScaled({
        params: { array: this.weights, offset: start },
        grads: { array: grads, offset: start },
        m: { array: this.m, offset: start },
        v: { array: this.v, offset: start },
        status: this.status,
        n: end - start,
        lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weightDecay: wd,
        step: this.step,
      });
    }
  }

  /**
   * Queues AdamW.predict into `out`: where `steps` more updates are likely to
   * take the weights, θ − steps · lr · m̂ / (√v̂ + ε); before the first step,
   * or for no steps, the weights themselves.
   */
  predict(out: GpuArray, steps: number): void {
    this.checkAlive();
    const n = this.layout.size;
    if (out.length !== n) throw new RangeError(`stage optimizer: predict into ${out.length} floats, the weights have ${n}`);
    const t = this.step;
    if (t === 0 || steps <= 0) {
      copyArray(this.device, this.weights, 0, out, 0, n);
      return;
    }
    const c = this.config;
    this.kernels.adamPredict(out, this.weights, this.m, this.v, n, steps * c.lr, 1 - c.beta1 ** t, 1 - c.beta2 ** t, c.eps);
  }

  /** The status after the work queued so far (waits for it). */
  async readStatus(): Promise<GpuStepStatus> {
    this.checkAlive();
    const s = await readArray(this.device, this.status);
    return { norm: s[1], nonFinite: s[2] };
  }

  /** The moments as queued work leaves them (tests). */
  async readMoments(): Promise<{ m: Float32Array; v: Float32Array }> {
    const [m, v] = await Promise.all([readArray(this.device, this.m), readArray(this.device, this.v)]);
    return { m, v };
  }

  /** Replaces the moments (tests: a state to start from). */
  writeMoments(m: Float32Array, v: Float32Array): void {
    writeArray(this.device, this.m, m);
    writeArray(this.device, this.v, v);
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const a of [this.m, this.v, this.partials, this.status]) a.destroy();
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('stage optimizer was destroyed');
  }
}
