// The MLP classifier on the GPU, as src/model/mlp.ts runs it on WASM:
// linear → ReLU → … → linear → softmax cross-entropy, with the same flat
// layout (the caller's: fc<i>.w [in, out], fc<i>.b), the same
// accumulate-or-overwrite rules (gradients accumulate until cleared) and the
// same 1/B loss scale. One difference, forced by WebGPU: the ReLU backward
// writes a buffer of its own (the WASM kernel works in place; a written
// binding may not alias another). Calls only queue work; readLoss and
// readGrads read back, each seeing all the work queued before it.
import { readArray, uploadArray, writeArray, type GpuArray, createArray } from './buffers.ts';
import { GpuGemm } from './gemm.ts';
import { clearRef, GpuFlat, type FlatLayout } from './gpt-buffers.ts';
import { GpuKernelSet } from './kernel-set.ts';
import { linearBackward, linearForward } from './linear.ts';
import { uploadIndices } from './program.ts';

/** An MLP's widths (src/model/mlp.ts MlpConfig is one). */
export interface MlpShape {
  inputs: number;
  hidden: readonly number[];
  classes: number;
}

export class GpuMlp {
  readonly params: GpuFlat;
  readonly grads: GpuFlat;
  private readonly widths: number[];
  /** acts[0] the input; acts[i+1] layer i's output before its ReLU; relus[i] after it */
  private readonly acts: GpuArray[];
  private readonly relus: GpuArray[];
  /** d of each layer's output (dacts) and, past a ReLU, d of its input (dpre) */
  private readonly dacts: GpuArray[];
  private readonly dpre: GpuArray[];
  private readonly probs: GpuArray;
  private readonly losses: GpuArray;
  private targets: GpuArray | null = null;
  private B = 0;
  private destroyed = false;

  private constructor(
    private readonly device: GPUDevice,
    readonly config: MlpShape,
    readonly layout: FlatLayout,
    readonly maxBatch: number,
    private readonly k: GpuKernelSet,
    private readonly gemm: GpuGemm,
    params: Float32Array,
  ) {
    this.widths = [config.inputs, ...config.hidden, config.classes];
    // what is made before an allocation fails (past the adapter's limits) is freed, with the kernels
    const owned: GpuArray[] = [];
    const t = (n: number, label: string): GpuArray => {
      const a = createArray(device, maxBatch * n, label);
      owned.push(a);
      return a;
    };
    try {
      this.params = new GpuFlat(layout, uploadArray(device, params, 'mlp params'));
      owned.push(this.params.array);
      this.grads = new GpuFlat(layout, uploadArray(device, new Float32Array(layout.size), 'mlp grads'));
      owned.push(this.grads.array);
      this.acts = this.widths.map((w, i) => t(w, `mlp act ${i}`));
      this.dacts = this.widths.map((w, i) => t(w, `mlp dact ${i}`));
      this.relus = this.widths.slice(1, -1).map((w, i) => t(w, `mlp relu ${i}`));
      this.dpre = this.widths.slice(1, -1).map((w, i) => t(w, `mlp dpre ${i}`));
      this.probs = t(config.classes, 'mlp probs');
      this.losses = t(1, 'mlp losses');
    } catch (err) {
      for (const a of owned) a.destroy();
      k.destroy();
      gemm.destroy();
      throw err;
    }
  }

  /** Compiles the kernels and uploads the parameters (laid out by `layout`, which must name fc<i>.w and fc<i>.b of these widths). */
  static async create(device: GPUDevice, config: MlpShape, layout: FlatLayout, params: Float32Array, maxBatch: number): Promise<GpuMlp> {
    const widths = [config.inputs, ...config.hidden, config.classes];
    for (let i = 0; i + 1 < widths.length; i++) {
      for (const [name, n] of [[`fc${i}.w`, widths[i] * widths[i + 1]], [`fc${i}.b`, widths[i + 1]]] as const) {
        if (layout.byName.get(name)?.size !== n) throw new RangeError(`gpu mlp: the layout's ${name} does not hold ${n} floats`);
      }
    }
    if (layout.entries.length !== 2 * (widths.length - 1)) throw new RangeError(`gpu mlp: the layout has ${layout.entries.length} tensors, the widths ${2 * (widths.length - 1)}`);
    if (params.length !== layout.size) throw new RangeError(`gpu mlp: ${params.length} parameters for a layout of ${layout.size}`);
    if (!Number.isInteger(maxBatch) || maxBatch < 1) throw new RangeError(`gpu mlp: batch ${maxBatch}`);
    const [k, gemm] = await Promise.all([GpuKernelSet.create(device), GpuGemm.create(device)]);
    return new GpuMlp(device, config, layout, maxBatch, k, gemm, params);
  }

  /** The compiled kernels (the optimizer's too: a trainer steps `params` with them). */
  get kernels(): GpuKernelSet {
    return this.k;
  }

  /** Replaces the parameters (queued). */
  writeParams(values: Float32Array): void {
    this.checkAlive();
    if (values.length !== this.layout.size) throw new RangeError(`gpu mlp: ${values.length} parameters for a layout of ${this.layout.size}`);
    writeArray(this.device, this.params.array, values);
  }

  clearGrads(): void {
    this.checkAlive();
    clearRef(this.device, this.grads.array, this.layout.size);
  }

  readGrads(): Promise<Float32Array> {
    return readArray(this.device, this.grads.array);
  }

  /** Queues the forward of B rows of features and their classes, to the per-row losses. */
  forward(x: Float32Array, B: number, targets: Int32Array): void {
    this.checkAlive();
    const { inputs, classes } = this.config;
    if (!(Number.isInteger(B) && B >= 1 && B <= this.maxBatch) || x.length !== B * inputs) throw new RangeError(`gpu mlp takes up to ${this.maxBatch} rows of ${inputs} features`);
    if (targets.length !== B) throw new RangeError(`gpu mlp takes ${B} targets`);
    for (let i = 0; i < x.length; i++) if (!Number.isFinite(x[i])) throw new RangeError(`feature ${i} is not finite`);
    this.targets?.destroy();
    this.targets = uploadIndices(this.device, targets, classes, 'mlp targets');
    this.B = B;
    writeArray(this.device, this.acts[0], x);
    const layers = this.widths.length - 1;
    for (let i = 0; i < layers; i++) {
      const inp = i === 0 ? this.acts[0] : this.relus[i - 1];
      linearForward(this.gemm, this.params, this.acts[i + 1], inp, `fc${i}.w`, `fc${i}.b`, B, this.widths[i], this.widths[i + 1]);
      if (i < layers - 1) this.k.elementwise.reluForward(this.relus[i], this.acts[i + 1], B * this.widths[i + 1]);
    }
    this.k.rows.crossEntropyForward(this.losses, this.probs, this.acts[layers], this.targets, B, classes);
  }

  /** The mean loss of the last forward: the float64 mean of the float32 row losses, as the WASM layer computes it. */
  async readLoss(): Promise<number> {
    if (this.B === 0) throw new Error('gpu mlp: no forward yet');
    const l = await readArray(this.device, this.losses, 0, this.B);
    let sum = 0;
    for (let i = 0; i < l.length; i++) sum += l[i];
    return sum / l.length;
  }

  /** Queues the gradients of the last forward's mean loss, accumulated into grads. */
  backward(): void {
    this.checkAlive();
    if (this.B === 0 || !this.targets) throw new Error('gpu mlp: backward before forward');
    const B = this.B, layers = this.widths.length - 1;
    this.k.rows.crossEntropyBackward(this.dacts[layers], this.probs, this.targets, 1 / B, B, this.config.classes);
    for (let i = layers - 1; i >= 0; i--) {
      const inp = i === 0 ? this.acts[0] : this.relus[i - 1];
      const dout = i === layers - 1 ? this.dacts[i + 1] : this.dpre[i];
      linearBackward({ gemm: this.gemm, rows: this.k.rows }, this.params, this.grads, this.dacts[i], `fc${i}.w`, `fc${i}.b`, dout, inp, B, this.widths[i], this.widths[i + 1]);
      if (i > 0) this.k.elementwise.reluBackward(this.dpre[i - 1], this.acts[i], this.dacts[i], B * this.widths[i]);
    }
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const a of [...this.acts, ...this.relus, ...this.dacts, ...this.dpre, this.probs, this.losses, this.params.array, this.grads.array]) a.destroy();
    this.targets?.destroy();
    this.k.destroy();
    this.gemm.destroy();
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('gpu mlp was destroyed');
  }
}
