// SGEMM on the GPU: the WebGPU counterpart of Kernels.sgemm (src/engine/
// kernels.ts), with the same arguments except that matrices are GPU arrays
// plus an offset in floats instead of byte pointers into the WASM heap.
import type { SgemmArgs } from '../kernels.ts';
import { createArray, type GpuArray } from './buffers.ts';
import { recorderOf } from './recorder.ts';
import { SGEMM_PARAMS_BYTES, SGEMM_TILE, SGEMM_WGSL } from './gemm.wgsl.ts';

/**
 * C[M×N] = op(A)·op(B) (+ bias[N]) or, with accumulate, C += op(A)·op(B).
 * op(A) is A (M×K, row stride lda) or, with transA, Aᵀ where A is K×M.
 * op(B) is B (K×N, row stride ldb) or, with transB, Bᵀ where B is N×K.
 * Offsets count floats from the start of each array. C must not share a
 * buffer with A, B or the bias (WebGPU forbids a written binding aliasing another).
 */
export interface GpuSgemmArgs extends Omit<SgemmArgs, 'a' | 'b' | 'c' | 'bias'> {
  a: GpuArray;
  aOffset?: number;
  b: GpuArray;
  bOffset?: number;
  c: GpuArray;
  cOffset?: number;
  bias?: GpuArray;
  biasOffset?: number;
}

/** The four pipelines of the SGEMM shader (one per transpose case). */
export class GpuGemm {
  private readonly noBias: GpuArray;

  private constructor(
    private readonly device: GPUDevice,
    private readonly pipelines: readonly GPUComputePipeline[],
  ) {
    this.noBias = createArray(device, 1, 'sgemm no bias');
  }

  /** Compiles the shader; rejects with the compiler's message if it fails. */
  static async create(device: GPUDevice): Promise<GpuGemm> {
    const module = device.createShaderModule({ label: 'sgemm', code: SGEMM_WGSL });
    const pipelines = await Promise.all(
      [0, 1, 2, 3].map((variant) =>
        device.createComputePipelineAsync({
          label: `sgemm transA=${variant & 1} transB=${variant >> 1}`,
          layout: 'auto',
          compute: { module, entryPoint: 'main', constants: { TRANS_A: variant & 1, TRANS_B: variant >> 1 } },
        }),
      ),
    );
    return new GpuGemm(device, pipelines);
  }

  /**
   * Records the product (recorder.ts). Program order makes later kernels and
   * readbacks see the result; nothing waits here.
   */
  sgemm(p: GpuSgemmArgs): void {
    checkSgemm(p, this.device.limits.maxComputeWorkgroupsPerDimension);
    if (p.M === 0 || p.N === 0) return;
    const bias = p.bias && !p.accumulate ? p.bias : undefined;
    const params = new Uint32Array([
      p.M, p.N, p.K,
      p.lda, p.ldb, p.ldc,
      p.aOffset ?? 0, p.bOffset ?? 0, p.cOffset ?? 0, bias ? (p.biasOffset ?? 0) : 0,
      p.accumulate ? 1 : 0, bias ? 1 : 0,
    ]);
    if (params.byteLength !== SGEMM_PARAMS_BYTES) throw new Error(`sgemm: ${params.byteLength} bytes of parameters, the shader reads ${SGEMM_PARAMS_BYTES}`);
    const pipeline = this.pipelines[(p.transA ? 1 : 0) | (p.transB ? 2 : 0)];
    const buffers = [p.a.buffer, p.b.buffer, p.c.buffer, (bias ?? this.noBias).buffer];
    recorderOf(this.device).dispatch('sgemm', pipeline, params.buffer, buffers, Math.ceil(p.N / SGEMM_TILE), Math.ceil(p.M / SGEMM_TILE));
  }

  destroy(): void {
    this.noBias.destroy();
  }
}

/**
 * Checks sizes, strides and extents: on a GPU an out-of-range read returns
 * some value of the buffer instead of failing, so a wrong stride would only
 * show as wrong numbers.
 */
export function checkSgemm(p: GpuSgemmArgs, maxWorkgroups: number): void {
  const u32 = (name: string, v: number): void => {
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`sgemm: ${name} = ${v} is not a u32`);
  };
  for (const [name, v] of Object.entries({ M: p.M, N: p.N, K: p.K, lda: p.lda, ldb: p.ldb, ldc: p.ldc })) u32(name, v);
  const extent = (name: string, array: GpuArray, offset: number, rows: number, cols: number, ld: number): void => {
    u32(`${name} offset`, offset);
    if (ld < cols) throw new RangeError(`sgemm: ld${name} = ${ld} is less than the ${cols} columns of ${name}`);
    const end = rows === 0 || cols === 0 ? offset : offset + (rows - 1) * ld + cols;
    if (end > array.length) throw new RangeError(`sgemm: ${name} needs ${end} floats, its array holds ${array.length}`);
  };
  extent('a', p.a, p.aOffset ?? 0, p.transA ? p.K : p.M, p.transA ? p.M : p.K, p.lda);
  extent('b', p.b, p.bOffset ?? 0, p.transB ? p.N : p.K, p.transB ? p.K : p.N, p.ldb);
  extent('c', p.c, p.cOffset ?? 0, p.M, p.N, p.ldc);
  if (p.bias && !p.accumulate) extent('bias', p.bias, p.biasOffset ?? 0, 1, p.N, p.N);
  for (const [name, other] of [['a', p.a], ['b', p.b], ['bias', p.bias]] as const) {
    if (other?.buffer === p.c.buffer) throw new RangeError(`sgemm: c shares its buffer with ${name}`);
  }
  const groups = Math.max(Math.ceil(p.M / SGEMM_TILE), Math.ceil(p.N / SGEMM_TILE));
  if (groups > maxWorkgroups) throw new RangeError(`sgemm: ${p.M}×${p.N} needs ${groups} workgroups along one side, the device allows ${maxWorkgroups}`);
}
