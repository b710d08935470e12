// Single-precision matrix product C = op(A) · op(B) (+ bias) or C += op(A) · op(B).
//
// Row-major storage. op(A) is M×K: A itself (stride lda) or, with transA, the
// transpose of a K×M matrix. op(B) is K×N: B itself (stride ldb) or, with
// transB, the transpose of an N×K matrix. Panels of A and B are packed into the
// caller's scratch so every case runs the same micro-kernel.
//
// Threads split the rows of C; every element of C is summed in the same order
// whatever the thread count, so results are bitwise identical for any `nt`.
//
// A product of at most SMALL_M rows without transposes (a decode step: a few
// sessions' rows through a weight matrix) skips the packing: threads split
// the columns instead, and each streams its columns of B once, row by row,
// for all of A's rows at a time. Each element is summed exactly as the packed
// path sums it (per KC block from zero, k in order, the same fma; then the
// bias or C added the same way), so both paths give the same bits.
import { fma, shareStart } from './simd';

const MR: i32 = 4;   // rows of the micro-kernel
const NR: i32 = 8;   // columns of the micro-kernel (two vectors)
const KC: i32 = 256; // depth of a packed block
const NC: i32 = 512; // columns of a packed B block
const MC: i32 = 64;  // rows of a packed A block

const SMALL_M: i32 = 8; // rows at or below which the unpacked path runs
const SC: i32 = 256;    // columns of one strip of the unpacked path (SMALL_M × SC accumulators)

/** Bytes of scratch each thread needs for sgemm. */
export const SGEMM_WORK_BYTES: i32 = (KC * NC + MC * KC + MR * NR) * 4 + 64;

// @ts-ignore: decorator
@inline function loadA(a: usize, lda: i32, transA: i32, i: i32, k: i32): f32 {
  return transA ? load<f32>(a + ((<usize>k * lda + i) << 2)) : load<f32>(a + ((<usize>i * lda + k) << 2));
}

// @ts-ignore: decorator
@inline function loadB(b: usize, ldb: i32, transB: i32, k: i32, j: i32): f32 {
  return transB ? load<f32>(b + ((<usize>j * ldb + k) << 2)) : load<f32>(b + ((<usize>k * ldb + j) << 2));
}

/** Packs op(B)[k0:k0+kc, j0:j0+nc] as panels of NR columns: panel[k][NR]. Zero-pads the last panel. */
function packB(dst: usize, b: usize, ldb: i32, transB: i32, k0: i32, kc: i32, j0: i32, nc: i32): void {
  for (let jp = 0; jp < nc; jp += NR) {
    const w = min(NR, nc - jp);
    const panel = dst + ((<usize>jp * kc) << 2);
    if (!transB && w == NR) {
      for (let k = 0; k < kc; k++) {
        const src = b + ((<usize>(k0 + k) * ldb + j0 + jp) << 2);
        v128.store(panel + ((<usize>k * NR) << 2), v128.load(src));
        v128.store(panel + ((<usize>k * NR) << 2), v128.load(src, 16), 16);
      }
    } else {
      for (let k = 0; k < kc; k++) {
        for (let j = 0; j < NR; j++) {
          const v: f32 = j < w ? loadB(b, ldb, transB, k0 + k, j0 + jp + j) : 0;
          store<f32>(panel + ((<usize>k * NR + j) << 2), v);
        }
      }
    }
  }
}

/** Packs op(A)[i0:i0+mc, k0:k0+kc] as panels of MR rows: panel[k][MR]. Zero-pads the last panel. */
function packA(dst: usize, a: usize, lda: i32, transA: i32, i0: i32, mc: i32, k0: i32, kc: i32): void {
  for (let ip = 0; ip < mc; ip += MR) {
    const h = min(MR, mc - ip);
    const panel = dst + ((<usize>ip * kc) << 2);
    for (let k = 0; k < kc; k++) {
      for (let i = 0; i < MR; i++) {
        const v: f32 = i < h ? loadA(a, lda, transA, i0 + ip + i, k0 + k) : 0;
        store<f32>(panel + ((<usize>k * MR + i) << 2), v);
      }
    }
  }
}

/** MR×NR block: acc = Ap · Bp over kc; then C = acc (+bias), or C += acc. */
function microKernel(ap: usize, bp: usize, kc: i32, c: usize, ldc: i32, h: i32, w: i32, first: bool, bias: usize, tmp: usize): void {
  let c00 = f32x4.splat(0), c01 = f32x4.splat(0);
  let c10 = f32x4.splat(0), c11 = f32x4.splat(0);
  let c20 = f32x4.splat(0), c21 = f32x4.splat(0);
  let c30 = f32x4.splat(0), c31 = f32x4.splat(0);
  for (let k = 0; k < kc; k++) {
    const b0 = v128.load(bp);
    const b1 = v128.load(bp, 16);
    let a = v128.load32_splat(ap);
    c00 = fma(a, b0, c00); c01 = fma(a, b1, c01);
    a = v128.load32_splat(ap, 4);
    c10 = fma(a, b0, c10); c11 = fma(a, b1, c11);
    a = v128.load32_splat(ap, 8);
    c20 = fma(a, b0, c20); c21 = fma(a, b1, c21);
    a = v128.load32_splat(ap, 12);
    c30 = fma(a, b0, c30); c31 = fma(a, b1, c31);
    ap += MR << 2;
    bp += NR << 2;
  }
  // spill to a small buffer, then write the valid h×w corner
  v128.store(tmp, c00); v128.store(tmp, c01, 16);
  v128.store(tmp, c10, 32); v128.store(tmp, c11, 48);
  v128.store(tmp, c20, 64); v128.store(tmp, c21, 80);
  v128.store(tmp, c30, 96); v128.store(tmp, c31, 112);
  for (let i = 0; i < h; i++) {
    const row = c + ((<usize>i * ldc) << 2);
    for (let j = 0; j < w; j++) {
      const v = load<f32>(tmp + ((<usize>i * NR + j) << 2));
      const dst = row + (<usize>j << 2);
      if (first) {
        store<f32>(dst, bias ? load<f32>(bias + (<usize>j << 2)) + v : v);
      } else {
        store<f32>(dst, load<f32>(dst) + v);
      }
    }
  }
}

/** op(B)[k, j0 .. j0 + w) as one vector, zero past w (w < 4: the last columns of B). */
// @ts-ignore: decorator
@inline function loadTail(row: usize, w: i32): v128 {
  let v = f32x4.splat(0);
  v = f32x4.replace_lane(v, 0, load<f32>(row));
  if (w > 1) v = f32x4.replace_lane(v, 1, load<f32>(row, 4));
  if (w > 2) v = f32x4.replace_lane(v, 2, load<f32>(row, 8));
  return v;
}

/**
 * C = A·B (+ bias) or C += A·B for M ≤ SMALL_M rows, A and B untransposed:
 * this thread's columns, in strips of SC, accumulated in `acc` (M × SC).
 */
function sgemmSmall(M: i32, N: i32, K: i32, a: usize, lda: i32, b: usize, ldb: i32, c: usize, ldc: i32, accumulate: i32, bias: usize, acc: usize, tid: i32, nt: i32): void {
  const vecs = (N + 3) >> 2;
  const j0 = shareStart(vecs, tid, nt) << 2;
  const j1 = min(N, shareStart(vecs, tid + 1, nt) << 2);
  for (let js = j0; js < j1; js += SC) {
    const sc = min(SC, j1 - js);
    const full = sc & ~3; // whole vectors; the rest (N's last 1 to 3 columns) is loaded lane by lane
    for (let pc = 0; pc < K; pc += KC) {
      const kc = min(KC, K - pc);
      const first = pc == 0 && !accumulate;
      memory.fill(acc, 0, <usize>(M * SC) << 2);
      for (let k = pc; k < pc + kc; k++) {
        const brow = b + ((<usize>k * ldb + js) << 2);
        for (let i = 0; i < M; i++) {
          const av = v128.load32_splat(a + ((<usize>i * lda + k) << 2));
          const arow = acc + ((<usize>i * SC) << 2);
          for (let j = 0; j < full; j += 4) {
            const p = arow + (<usize>j << 2);
            v128.store(p, fma(av, v128.load(brow + (<usize>j << 2)), v128.load(p)));
          }
          if (full < sc) {
            const p = arow + (<usize>full << 2);
            v128.store(p, fma(av, loadTail(brow + (<usize>full << 2), sc - full), v128.load(p)));
          }
        }
      }
      for (let i = 0; i < M; i++) {
        const arow = acc + ((<usize>i * SC) << 2);
        const crow = c + ((<usize>i * ldc + js) << 2);
        for (let j = 0; j < sc; j++) {
          const v = load<f32>(arow + (<usize>j << 2));
          const dst = crow + (<usize>j << 2);
          if (first) store<f32>(dst, bias ? load<f32>(bias + (<usize>(js + j) << 2)) + v : v);
          else store<f32>(dst, load<f32>(dst) + v);
        }
      }
    }
  }
}

export function sgemm(
  M: i32, N: i32, K: i32,
  a: usize, lda: i32, transA: i32,
  b: usize, ldb: i32, transB: i32,
  c: usize, ldc: i32,
  accumulate: i32, bias: usize,
  work: usize, tid: i32, nt: i32,
): void {
  if (M <= SMALL_M && K > 0 && !transA && !transB) {
    sgemmSmall(M, N, K, a, lda, b, ldb, c, ldc, accumulate, bias, (work + <usize>tid * SGEMM_WORK_BYTES + 63) & ~(<usize>63), tid, nt);
    return;
  }
  // rows of C for this thread, in whole MR blocks
  const blocks = (M + MR - 1) / MR;
  const r0 = shareStart(blocks, tid, nt) * MR;
  const r1 = min(M, shareStart(blocks, tid + 1, nt) * MR);
  if (r0 >= r1) return;
  const ws = work + <usize>tid * SGEMM_WORK_BYTES;
  const bpack = (ws + 63) & ~(<usize>63);
  const apack = bpack + ((<usize>KC * NC) << 2);
  const tmp = apack + ((<usize>MC * KC) << 2);
  if (K == 0) {
    // C = bias or unchanged
    if (!accumulate) {
      for (let i = r0; i < r1; i++) for (let j = 0; j < N; j++)
        store<f32>(c + ((<usize>i * ldc + j) << 2), bias ? load<f32>(bias + (<usize>j << 2)) : 0);
    }
    return;
  }
  for (let jc = 0; jc < N; jc += NC) {
    const nc = min(NC, N - jc);
    for (let pc = 0; pc < K; pc += KC) {
      const kc = min(KC, K - pc);
      const first = pc == 0 && !accumulate;
      packB(bpack, b, ldb, transB, pc, kc, jc, nc);
      for (let ic = r0; ic < r1; ic += MC) {
        const mc = min(MC, r1 - ic);
        packA(apack, a, lda, transA, ic, mc, pc, kc);
        for (let jr = 0; jr < nc; jr += NR) {
          const w = min(NR, nc - jr);
          for (let ir = 0; ir < mc; ir += MR) {
            const h = min(MR, mc - ir);
            microKernel(
              apack + ((<usize>ir * kc) << 2), bpack + ((<usize>jr * kc) << 2), kc,
              c + ((<usize>(ic + ir) * ldc + jc + jr) << 2), ldc, h, w, first,
              bias ? bias + (<usize>(jc + jr) << 2) : 0, tmp,
            );
          }
        }
      }
    }
  }
}
