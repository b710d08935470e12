// Element-wise kernels on the GPU: the WebGPU counterparts of Kernels.add,
// accumulate, geluForward, geluBackward, reluForward and reluBackward
// (src/engine/kernels.ts), with the same arguments except that arrays are
// GPU arrays (or windows of one) instead of heap pointers. A written array
// must not share a buffer with an input: the WASM kernels allow `out` to be
// an input, WebGPU does not (use accumulate for dst += src).
import { ELEMENTWISE_SPECS, ELEMENTWISE_WG } from './elementwise.wgsl.ts';
import { createKernels, destroyKernels, use, type GpuKernel, type GpuRef } from './program.ts';

type Name = keyof typeof ELEMENTWISE_SPECS;

export class GpuElementwise {
  private constructor(private readonly kernels: Record<Name, GpuKernel>) {}

  /** Compiles the kernels. `maxGroupsPerDimension` below the device's limit is for tests of large dispatches. */
  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuElementwise> {
    return new GpuElementwise(await createKernels(device, ELEMENTWISE_SPECS, maxGroupsPerDimension));
  }

  /** out = a + b (n floats) */
  add(out: GpuRef, a: GpuRef, b: GpuRef, n: number): void {
    this.run('add', n, { out, a, b });
  }

  /** dst += src (n floats) */
  accumulate(dst: GpuRef, src: GpuRef, n: number): void {
    this.run('accumulate', n, { dst, src });
  }

  /** out = gelu(inp), tanh approximation */
  geluForward(out: GpuRef, inp: GpuRef, n: number): void {
    this.run('geluForward', n, { out, inp });
  }

  /** dinp = gelu'(inp) · dout (written, not accumulated) */
  geluBackward(dinp: GpuRef, inp: GpuRef, dout: GpuRef, n: number): void {
    this.run('geluBackward', n, { dinp, inp, dout });
  }

  /** out = max(inp, 0) */
  reluForward(out: GpuRef, inp: GpuRef, n: number): void {
    this.run('reluForward', n, { out, inp });
  }

  /** dinp = inp > 0 ? dout : 0 */
  reluBackward(dinp: GpuRef, inp: GpuRef, dout: GpuRef, n: number): void {
    this.run('reluBackward', n, { dinp, inp, dout });
  }

  destroy(): void {
    destroyKernels(this.kernels);
  }

  private run(name: Name, n: number, refs: Record<string, GpuRef>): void {
    const arrays = Object.fromEntries(Object.entries(refs).map(([k, ref]) => [k, use(ref, n)]));
    this.kernels[name].run({ uints: { n }, arrays, groups: Math.ceil(n / ELEMENTWISE_WG) });
  }
}
