// The WGSL of the tiled SGEMM (src/engine/webgpu/gemm.ts):
//   C[M×N] = op(A)·op(B) (+ bias[N])   or, with accumulate,   C += op(A)·op(B)
// row-major with leading dimensions and offsets in floats, as the WASM kernel
// (assembly/gemm.ts) takes them.
//
// A workgroup of 16×16 invocations computes a 64×64 block of C; each
// invocation owns a 4×4 set of it (rows ty, ty+16, ty+32, ty+48 and the same
// for columns, so that its reads of the shared tiles and its writes to C are
// spread across neighbouring invocations). K advances in steps of 16: the
// workgroup stages a 64×16 tile of op(A) and a 16×64 tile of op(B) in
// workgroup memory (8 KiB), loaded so that neighbouring invocations read
// neighbouring addresses whatever the transpose. Out-of-range rows, columns
// and k read as 0, so any M, N, K work. Each output sums its K products in
// order k = 0, 1, ..., K−1 in a single accumulator (fma), then adds the bias
// or the old C.
//
// transA / transB are pipeline-overridable constants: four specialised
// pipelines, no branch in the inner loops.

/** Rows and columns of C per workgroup. */
export const SGEMM_TILE = 64;
/** Invocations per workgroup side: each computes (SGEMM_TILE / SGEMM_THREADS)² outputs. */
export const SGEMM_THREADS = 16;
/** Floats of k per staged tile. */
export const SGEMM_TILE_K = 16;
/** Bytes of the uniform block: 12 u32, in the order of `Params` below. */
export const SGEMM_PARAMS_BYTES = 48;

const PER = SGEMM_TILE / SGEMM_THREADS;
const LOADS = (SGEMM_TILE * SGEMM_TILE_K) / (SGEMM_THREADS * SGEMM_THREADS);

export const SGEMM_WGSL = /* wgsl */ `
override TRANS_A: bool = false;
override TRANS_B: bool = false;

const TILE: u32 = ${SGEMM_TILE}u;
const TK: u32 = ${SGEMM_TILE_K}u;
const THREADS: u32 = ${SGEMM_THREADS}u;
const PER: u32 = ${PER}u;
const LOADS: u32 = ${LOADS}u;

struct Params {
  M: u32, N: u32, K: u32,
  lda: u32, ldb: u32, ldc: u32,
  offA: u32, offB: u32, offC: u32, offBias: u32,
  accumulate: u32, hasBias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// tiles k-major: As[k * TILE + i] = op(A)[i][k], Bs[k * TILE + j] = op(B)[k][j]
var<workgroup> As: array<f32, ${SGEMM_TILE * SGEMM_TILE_K}>;
var<workgroup> Bs: array<f32, ${SGEMM_TILE * SGEMM_TILE_K}>;

// op(A)[i][k], 0 outside the matrix
fn opA(i: u32, k: u32) -> f32 {
  if (i >= p.M || k >= p.K) { return 0.0; }
  if (TRANS_A) { return A[p.offA + k * p.lda + i]; }
  return A[p.offA + i * p.lda + k];
}

// op(B)[k][j], 0 outside the matrix
fn opB(k: u32, j: u32) -> f32 {
  if (k >= p.K || j >= p.N) { return 0.0; }
  if (TRANS_B) { return B[p.offB + j * p.ldb + k]; }
  return B[p.offB + k * p.ldb + j];
}

@compute @workgroup_size(${SGEMM_THREADS}, ${SGEMM_THREADS})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u, @builtin(local_invocation_index) li: u32) {
  let row0 = wg.y * TILE;
  let col0 = wg.x * TILE;
  var acc: array<array<f32, PER>, PER>;
  for (var k0 = 0u; k0 < p.K; k0 += TK) {
    for (var l = 0u; l < LOADS; l++) {
      let idx = l * THREADS * THREADS + li;
      // consecutive invocations take consecutive addresses of the stored matrix
      var i: u32; var ka: u32;
      if (TRANS_A) { i = idx % TILE; ka = idx / TILE; } else { ka = idx % TK; i = idx / TK; }
      As[ka * TILE + i] = opA(row0 + i, k0 + ka);
      var j: u32; var kb: u32;
      if (TRANS_B) { kb = idx % TK; j = idx / TK; } else { j = idx % TILE; kb = idx / TILE; }
      Bs[kb * TILE + j] = opB(k0 + kb, col0 + j);
    }
    workgroupBarrier();
    for (var k = 0u; k < TK; k++) {
      var a: array<f32, PER>;
      var b: array<f32, PER>;
      for (var r = 0u; r < PER; r++) { a[r] = As[k * TILE + lid.y + r * THREADS]; }
      for (var c = 0u; c < PER; c++) { b[c] = Bs[k * TILE + lid.x + c * THREADS]; }
      for (var r = 0u; r < PER; r++) {
        for (var c = 0u; c < PER; c++) { acc[r][c] = fma(a[r], b[c], acc[r][c]); }
      }
    }
    workgroupBarrier();
  }
  for (var r = 0u; r < PER; r++) {
    let i = row0 + lid.y + r * THREADS;
    if (i >= p.M) { break; }
    for (var c = 0u; c < PER; c++) {
      let j = col0 + lid.x + c * THREADS;
      if (j >= p.N) { break; }
      let o = p.offC + i * p.ldc + j;
      var v = acc[r][c];
      if (p.accumulate != 0u) { v = C[o] + v; } else if (p.hasBias != 0u) { v = bias[p.offBias + j] + v; }
      C[o] = v;
    }
  }
}
`;
