// A linear layer on the GPU, as src/model/layers.ts runs it on WASM: weights
// [in, out] and biases as windows of a flat parameter buffer, their gradients
// as windows of the flat gradient buffer. Shared by the GPT stage
// (gpt-stage.ts) and the MLP (mlp.ts).
import type { GpuArray } from './buffers.ts';
import type { GpuGemm } from './gemm.ts';
import type { GpuFlat } from './gpt-buffers.ts';
import type { GpuRows } from './rows.ts';

/** out[N×OC] = inp[N×C] · W[C×OC] (+ b): linearForward of src/model/layers.ts */
export function linearForward(gemm: GpuGemm, P: GpuFlat, out: GpuArray, inp: GpuArray, w: string, b: string | null, N: number, C: number, OC: number): void {
  gemm.sgemm({
    M: N, N: OC, K: C, a: inp, lda: C, b: P.array, bOffset: P.offset(w), ldb: OC, c: out, ldc: OC,
    ...(b ? { bias: P.array, biasOffset: P.offset(b) } : {}),
  });
}

/** dinp = dout · Wᵀ (written); dW += inpᵀ · dout; db += column sums: linearBackward of src/model/layers.ts */
export function linearBackward(
  k: { gemm: GpuGemm; rows: GpuRows },
  P: GpuFlat,
  G: GpuFlat,
  dinp: GpuArray,
  w: string,
  b: string | null,
  dout: GpuArray,
  inp: GpuArray,
  N: number,
  C: number,
  OC: number,
): void {
  k.gemm.sgemm({ M: N, N: C, K: OC, a: dout, lda: OC, b: P.array, bOffset: P.offset(w), ldb: OC, transB: true, c: dinp, ldc: C });
  k.gemm.sgemm({ M: C, N: OC, K: N, a: inp, lda: C, transA: true, b: dout, ldb: OC, c: G.array, cOffset: G.offset(w), ldc: OC, accumulate: true });
  if (b) k.rows.biasBackward(G.ref(b), dout, N, OC);
}
