// Every ported non-GEMM, non-attention kernel, compiled together: element-wise,
// row, optimizer and embedding kernels, and the Llama-family decoder's
// (decoder/: RMSNorm, RoPE, SwiGLU, the KV cache; their pipelines compile in
// parallel).
import { GpuDecoder } from './decoder/decoder.ts';
import { GpuElementwise } from './elementwise.ts';
import { GpuEmbedding } from './embedding.ts';
import { GpuOptimizer } from './optimizer.ts';
import { GpuRows } from './rows.ts';

export class GpuKernelSet {
  private constructor(
    readonly device: GPUDevice,
    readonly elementwise: GpuElementwise,
    readonly rows: GpuRows,
    readonly optimizer: GpuOptimizer,
    readonly embedding: GpuEmbedding,
    readonly decoder: GpuDecoder,
  ) {}

  /** `maxGroupsPerDimension` below the device's limit makes tests exercise two-dimensional dispatches. */
  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuKernelSet> {
    const [elementwise, rows, optimizer, embedding, decoder] = await Promise.all([
      GpuElementwise.create(device, maxGroupsPerDimension),
      GpuRows.create(device, maxGroupsPerDimension),
      GpuOptimizer.create(device, maxGroupsPerDimension),
      GpuEmbedding.create(device, maxGroupsPerDimension),
      GpuDecoder.create(device, maxGroupsPerDimension),
    ]);
    return new GpuKernelSet(device, elementwise, rows, optimizer, embedding, decoder);
  }

  destroy(): void {
    this.elementwise.destroy();
    this.rows.destroy();
    this.optimizer.destroy();
    this.embedding.destroy();
    this.decoder.destroy();
  }
}
