// Optimizer kernels on the GPU: the WebGPU counterparts of Kernels.adamw and
// Kernels.sumSquares (src/engine/kernels.ts). AdamW takes the same arguments
// (the bias corrections 1 − βᵗ computed here in float64 from `step`, as the
// WASM wrapper does, then passed as float32); params, m and v are written and
// must each have a buffer of their own.
import { NORM_CHUNK, type AdamWArgs } from '../kernels.ts';
import { createArray, readArray, type GpuArray } from './buffers.ts';
import { ADAMW_WG, OPTIMIZER_SPECS } from './optimizer.wgsl.ts';
import { createKernels, destroyKernels, use, type GpuKernel, type GpuRef } from './program.ts';

export interface GpuAdamWArgs extends Omit<AdamWArgs, 'params' | 'grads' | 'm' | 'v'> {
  params: GpuRef;
  grads: GpuRef;
  m: GpuRef;
  v: GpuRef;
}

type Name = keyof typeof OPTIMIZER_SPECS;

/** Floats of a step's status array (clipScale): scale, norm, non-finite steps, this step non-finite. */
export const STATUS_FLOATS = 4;

export class GpuOptimizer {
  private partials: GpuArray | undefined;

  private constructor(
    private readonly device: GPUDevice,
    private readonly kernels: Record<Name, GpuKernel>,
  ) {}

  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuOptimizer> {
    return new GpuOptimizer(device, await createKernels(device, OPTIMIZER_SPECS, maxGroupsPerDimension));
  }

  /** One AdamW step on n parameters: m, v and params updated in place; gradScale multiplies each gradient first. */
  adamw(a: GpuAdamWArgs): void {
    const n = a.n;
    this.kernels.adamw.run({
      uints: { n },
      floats: {
        lr: a.lr, beta1: a.beta1, beta2: a.beta2, eps: a.eps, weightDecay: a.weightDecay,
        bc1: 1 - Math.pow(a.beta1, a.step), bc2: 1 - Math.pow(a.beta2, a.step), gradScale: a.gradScale,
      },
      arrays: { params: use(a.params, n), grads: use(a.grads, n), m: use(a.m, n), v: use(a.v, n) },
      groups: Math.ceil(n / ADAMW_WG),
    });
  }

  /**
   * AdamW as `adamw`, its gradient scale read on the GPU from status[0] and
   * the step skipped when status[3] is set (both written by `clipScale`).
   */
  adamwScaled(a: Omit<GpuAdamWArgs, 'gradScale'> & { status: GpuRef }): void {
    const n = a.n;
    this.kernels.adamwScaled.run({
      uints: { n },
      floats: { lr: a.lr, beta1: a.beta1, beta2: a.beta2, eps: a.eps, weightDecay: a.weightDecay, bc1: 1 - Math.pow(a.beta1, a.step), bc2: 1 - Math.pow(a.beta2, a.step) },
      arrays: { params: use(a.params, n), grads: use(a.grads, n), m: use(a.m, n), v: use(a.v, n), status: use(a.status, STATUS_FLOATS) },
      groups: Math.ceil(n / ADAMW_WG),
    });
  }

  /**
   * Kernels.adamPredict: out = params − k · m̂ / (√v̂ + ε), with the bias
   * corrections bc1 = 1 − β1ᵗ and bc2 = 1 − β2ᵗ (their inverses rounded to
   * float32, as the WASM kernel takes them).
   */
  adamPredict(out: GpuRef, params: GpuRef, m: GpuRef, v: GpuRef, n: number, k: number, bc1: number, bc2: number, eps: number): void {
    this.kernels.adamPredict.run({
      uints: { n },
      floats: { k, ib1: 1 / Math.fround(bc1), ib2: 1 / Math.fround(bc2), eps },
      arrays: { out: use(out, n), params: use(params, n), m: use(m, n), v: use(v, n) },
      groups: Math.ceil(n / ADAMW_WG),
    });
  }

  /**
   * Queues the clipping scale of a step from the `chunks` partials of
   * `sumSquaresPartials`: status = [scale, norm, non-finite steps so far,
   * 1 when this one is], see optimizer.wgsl.ts.
   */
  clipScale(status: GpuRef, partials: GpuRef, chunks: number, clip: number): void {
    this.kernels.clipScale.run({ uints: { chunks }, floats: { clip }, arrays: { status: use(status, STATUS_FLOATS), partials: use(partials, chunks) }, groups: 1 });
  }

  /**
   * Queues the float32 sum of squares of each NORM_CHUNK chunk of x into
   * partials[0 .. ⌈n / NORM_CHUNK⌉): one workgroup a chunk, so the order of
   * every sum is fixed by the chunk and the workgroup size, whatever the GPU.
   */
  sumSquaresPartials(partials: GpuRef, x: GpuRef, n: number): void {
    const chunks = Math.ceil(n / NORM_CHUNK);
    this.kernels.sumSquares.run({ uints: { n, chunk: NORM_CHUNK }, arrays: { partials: use(partials, chunks), x: use(x, n) }, groups: chunks });
  }

  /**
   * Sum of squares of n floats, as Kernels.sumSquares: chunk sums on the GPU,
   * read back and added in float64 in chunk order. Waits for the readback.
   */
  async sumSquares(x: GpuRef, n: number): Promise<number> {
    const chunks = Math.ceil(n / NORM_CHUNK);
    if (chunks === 0) return 0;
    if (!this.partials || this.partials.length < chunks) {
      this.partials?.destroy();
      this.partials = createArray(this.device, Math.max(chunks, 2 * (this.partials?.length ?? 0)), 'sumSquares partials');
    }
    this.sumSquaresPartials(this.partials, x, n);
    const partials = await readArray(this.device, this.partials, 0, chunks);
    let total = 0;
    for (let c = 0; c < chunks; c++) total += partials[c];
    return total;
  }

  destroy(): void {
    destroyKernels(this.kernels);
    this.partials?.destroy();
  }
}
