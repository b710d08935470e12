// Row kernels on the GPU: the WebGPU counterparts of Kernels.layernormForward,
// layernormBackwardInput, layernormBackwardParams, biasBackward,
// crossEntropyForward and crossEntropyBackward (src/engine/kernels.ts), with
// the same arguments and the same accumulate-or-overwrite rules, arrays being
// GPU arrays (or windows of one) instead of heap pointers. Targets are int32
// in [0, V) (uploadIndices checks them). Unlike the WASM layer norm, C need
// not be a multiple of 4.
import { createKernels, destroyKernels, use, type GpuKernel, type GpuRef } from './program.ts';
import { COLUMN_WG, ELEMENT_WG, ROW_SPECS } from './rows.wgsl.ts';

type Name = keyof typeof ROW_SPECS;

export class GpuRows {
  private constructor(private readonly kernels: Record<Name, GpuKernel>) {}

  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuRows> {
    return new GpuRows(await createKernels(device, ROW_SPECS, maxGroupsPerDimension));
  }

  /** out = (inp − mean) · rstd · w + b per row of C (eps 1e-5); writes each row's mean and rstd */
  layernormForward(out: GpuRef, mean: GpuRef, rstd: GpuRef, inp: GpuRef, w: GpuRef, b: GpuRef, N: number, C: number): void {
    this.kernels.layernormForward.run({
      uints: { N, C },
      floats: { invC: 1 / C },
      arrays: { out: use(out, N * C), mean: use(mean, N), rstd: use(rstd, N), inp: use(inp, N * C), weight: use(w, C), bias: use(b, C) },
      groups: N,
    });
  }

  /** dinp += input gradient of layer norm */
  layernormBackwardInput(dinp: GpuRef, dout: GpuRef, inp: GpuRef, w: GpuRef, mean: GpuRef, rstd: GpuRef, N: number, C: number): void {
    this.kernels.layernormBackwardInput.run({
      uints: { N, C },
      floats: { invC: 1 / C },
      arrays: { dinp: use(dinp, N * C), dout: use(dout, N * C), inp: use(inp, N * C), weight: use(w, C), mean: use(mean, N), rstd: use(rstd, N) },
      groups: N,
    });
  }

  /**
   * dw, db += parameter gradients of layer norm. Two dispatches, so dw and db
   * may be windows of one buffer (a flat gradient array); db is biasBackward.
   */
  layernormBackwardParams(dw: GpuRef, db: GpuRef, dout: GpuRef, inp: GpuRef, mean: GpuRef, rstd: GpuRef, N: number, C: number): void {
    this.kernels.layernormBackwardWeight.run({
      uints: { N, C },
      arrays: { dweight: use(dw, C), dout: use(dout, N * C), inp: use(inp, N * C), mean: use(mean, N), rstd: use(rstd, N) },
      groups: Math.ceil(C / COLUMN_WG),
    });
    this.biasBackward(db, dout, N, C);
  }

  /** dbias += column sums of dout (N×C) */
  biasBackward(dbias: GpuRef, dout: GpuRef, N: number, C: number): void {
    this.kernels.biasBackward.run({ uints: { N, C }, arrays: { dbias: use(dbias, C), dout: use(dout, N * C) }, groups: Math.ceil(C / COLUMN_WG) });
  }

  /** Softmax of each row of logits (N×V) into probs; losses[r] = −log probs[r, targets[r]] (per row, not averaged) */
  crossEntropyForward(losses: GpuRef, probs: GpuRef, logits: GpuRef, targets: GpuRef, N: number, V: number): void {
    this.kernels.crossEntropyForward.run({
      uints: { N, V },
      arrays: { losses: use(losses, N), probs: use(probs, N * V), logits: use(logits, N * V), targets: use(targets, N) },
      groups: N,
    });
  }

  /** dlogits = (probs − onehot(targets)) · scale (written; the caller's scale is dloss / N for a mean loss) */
  crossEntropyBackward(dlogits: GpuRef, probs: GpuRef, targets: GpuRef, scale: number, N: number, V: number): void {
    this.kernels.crossEntropyBackward.run({
      uints: { N, V },
      floats: { scale },
      arrays: { dlogits: use(dlogits, N * V), probs: use(probs, N * V), targets: use(targets, N) },
      groups: Math.ceil((N * V) / ELEMENT_WG),
    });
  }

  destroy(): void {
    destroyKernels(this.kernels);
  }
}
