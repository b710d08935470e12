// What the GPU stage trainers (./stage-trainer-gpu.ts, ./stage-trainer-gpu-mlp.ts)
// share: the stage's life (made in the background from its initial weights,
// resident until released: GpuResidency); copies of the weights kept on the
// GPU for spot-check records, read back only when a check asks for them; the
// device's reported errors turned into a thrown one; and a step whose
// gradient norm was not finite (skipped on the GPU,
// src/engine/webgpu/stage-optimizer.ts) turned into an error.
import { copyArray, createArray, readArray, writeArray, type GpuArray } from '../engine/webgpu/buffers.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { clearRef } from '../engine/webgpu/gpt-buffers.ts';
import type { GpuStepStatus } from '../engine/webgpu/stage-optimizer.ts';
import { DEFAULT_MAX_RECORDS, type KeptWeights } from './forward-records.ts';
import type { StageTrainer } from './stage-trainer.ts';

/** GPU memory the weight copies of spot-check records may take (at least two copies are kept whatever their size). */
const KEPT_WEIGHTS_GPU_BYTES = 1 << 30;

/** Copies of `length` weights on the GPU, a couple kept spare for the next records. */
class GpuWeightCopies {
  /** copies (records) kept at once at most */
  readonly limit: number;
  private readonly spare: GpuArray[] = [];
  private released = false;

  constructor(
    private readonly gpu: Gpu,
    readonly length: number,
  ) {
    this.limit = Math.max(2, Math.min(DEFAULT_MAX_RECORDS, Math.floor(KEPT_WEIGHTS_GPU_BYTES / (4 * length))));
  }

  /** A copy of `from` (queued in order with the kernels), read back when a check asks for it. */
  keep(from: GpuArray): KeptWeights {
    const device = this.gpu.device;
    const copy = this.spare.pop() ?? createArray(device, this.length, 'kept weights');
    copyArray(device, from, 0, copy, 0, this.length);
    let released = false;
    return {
      read: async () => {
        if (released) throw new Error('the kept weights were released');
        return checkedGpu(this.gpu, await readArray(device, copy));
      },
      release: () => {
        if (released) return;
        released = true;
        if (!this.released && this.spare.length < 2) this.spare.push(copy);
        else copy.destroy();
      },
    };
  }

  /** Frees the spare copies; copies still held by records are freed when those are released. */
  release(): void {
    this.released = true;
    for (const a of this.spare.splice(0)) a.destroy();
  }
}

/** `values`, unless the device reported an error (out of memory, a validation error): then what it said. */
function checkedGpu<T>(gpu: Gpu, values: T): T {
  const errors = gpu.takeErrors();
  if (errors.length) throw new Error(`WebGPU: ${errors[0].slice(0, 300)}`);
  return values;
}

/** Turns the GPU's count of skipped steps into an error for the call whose step was skipped. */
class SkippedSteps {
  private seen = 0;

  check(status: GpuStepStatus | null): void {
    if (!status || status.nonFinite <= this.seen) return;
    this.seen = status.nonFinite;
    throw new Error('gradient norm is not finite (the GPU skipped the inner step)');
  }
}

/** What a GPU trainer made once its kernels compiled: at least the current weights' buffer. */
export interface Resident {
  weights: GpuArray;
}

/**
 * The life of a GPU trainer's stage: made in the background from its
 * initial weights (kernels compiled, buffers made), then resident until
 * released. Weights written before it is resident replace the initial ones;
 * calls that need it wait for it.
 */
class GpuResidency<R extends Resident> {
  readonly copies: GpuWeightCopies;
  private readonly made: Promise<R>;
  private resident: R | null = null;
  private initial: Float32Array | null;
  private readonly skipped = new SkippedSteps();
  private released = false;

  constructor(
    private readonly gpu: Gpu,
    initial: Float32Array,
    /** makes the stage from these weights (its kernels, its buffers) */
    create: (initial: Float32Array) => Promise<R>,
    private readonly destroy: (r: R) => void,
  ) {
    this.initial = initial;
    this.copies = new GpuWeightCopies(gpu, initial.length);
    this.made = this.make(create);
    this.made.catch(() => {}); // reported by the first call that waits for it
  }

  get length(): number {
    return this.copies.length;
  }

  /** The initial weights, a copy in host memory (before the stage is resident). */
  initialWeights(): Float32Array {
    if (!this.initial) throw new Error('the initial weights are on the GPU now: read them with readWeights()');
    return this.initial.slice();
  }

  /** The stage, once it is made (rejects with why it could not be, or once released). */
  async get(): Promise<R> {
    if (this.released) throw new Error('the stage was released');
    const r = await this.made;
    if (this.released) throw new Error('the stage was released');
    return r;
  }

  /** The stage now: it must be resident already. */
  now(): R {
    if (this.released || !this.resident) throw new Error(this.released ? 'the stage was released' : 'the stage is not on the GPU yet');
    return this.resident;
  }

  async readWeights(): Promise<Float32Array> {
    const r = await this.get();
    return this.checked(await readArray(this.gpu.device, r.weights));
  }

  writeWeights(weights: Float32Array): void {
    if (weights.length !== this.length) throw new RangeError(`${weights.length} weights for a stage of ${this.length}`);
    if (this.released) throw new Error('the stage was released');
    if (!this.resident) this.initial = weights.slice();
    else writeArray(this.gpu.device, this.resident.weights, weights);
  }

  zeroWeights(): void {
    if (!this.resident) this.initial?.fill(0);
    else clearRef(this.gpu.device, this.resident.weights, this.length);
  }

  /** `values`, unless the device reported an error; and an error when the GPU skipped a step whose status this is. */
  checked<T>(values: T, status: GpuStepStatus | null = null): T {
    checkedGpu(this.gpu, null);
    this.skipped.check(status);
    return values;
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.initial = null;
    this.made.then((r) => this.destroy(r), () => {});
    // records still out keep their copies until they are released
    this.copies.release();
  }

  private async make(create: (initial: Float32Array) => Promise<R>): Promise<R> {
    // once the constructor that made this residency has finished (create may read what it sets)
    await Promise.resolve();
    const first = this.initial!;
    const r = await create(first);
    try {
      if (this.released) throw new Error('the stage was released');
      // written while the kernels compiled: the latest weights
      if (this.initial !== first) writeArray(this.gpu.device, r.weights, this.initial!);
      checkedGpu(this.gpu, null);
    } catch (err) {
      this.destroy(r);
      throw err;
    }
    this.resident = r;
    this.initial = null;
    return r;
  }
}

/**
 * The part of StageTrainer every GPU trainer answers the same way, from its
 * residency: the weights (initial, read, written, zeroed), the records'
 * copies, ready and release. A trainer says how its stage is made and
 * destroyed, and does its own forward and backward.
 */
export abstract class GpuStageTrainer<R extends Resident> implements Pick<StageTrainer, 'keptWeightsLimit' | 'initialWeights' | 'keepWeights' | 'readWeights' | 'writeWeights' | 'zeroWeights' | 'ready' | 'release'> {
  protected readonly on: GpuResidency<R>;

  constructor(
    protected readonly gpu: Gpu,
    initial: Float32Array,
  ) {
    this.on = new GpuResidency(gpu, initial, (w) => this.create(w), (r) => this.destroy(r));
  }

  /** Makes the stage from `initial` (called once the subclass's constructor has finished). */
  protected abstract create(initial: Float32Array): Promise<R>;
  protected abstract destroy(r: R): void;

  get keptWeightsLimit(): number {
    return this.on.copies.limit;
  }

  initialWeights(): Float32Array {
    return this.on.initialWeights();
  }

  keepWeights(): KeptWeights {
    return this.on.copies.keep(this.on.now().weights);
  }

  readWeights(): Promise<Float32Array> {
    return this.on.readWeights();
  }

  writeWeights(weights: Float32Array): void {
    this.on.writeWeights(weights);
  }

  zeroWeights(): void {
    this.on.zeroWeights();
  }

  async ready(): Promise<void> {
    await this.on.get();
  }

  release(): void {
    this.on.release();
  }
}
