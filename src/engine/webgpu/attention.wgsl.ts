// The WGSL of causal self-attention (src/engine/webgpu/attention.ts), with the
// layouts of the WASM kernels, grouped-query (assembly/attention-gqa.ts): qkv
// is B×T rows of W = (H + 2·KV)·hs floats, q head h at columns h·hs, k head g
// at (H + g)·hs, v head g at (H + KV + g)·hs; query head h reads kv head
// g = h / (H / KV). Multi-head attention (assembly/attention.ts: q | k | v,
// B×T×3C) is the case H = KV = NH, hs = C/NH, which gives the same offsets.
// out and dout are B×T×H·hs, dqkv is B×T×W and is written, not accumulated.
// scale = 1/√hs in float32.
//
// Forward (FlashAttention-style, fused): one workgroup per (batch·head, block
// of ROWS queries), one invocation per query row. Keys and values stream
// through workgroup memory in tiles of KB rows; each row keeps a running max m
// and sum l of exp(s − m) and rescales its output accumulator when m grows
// (online softmax). The T×T matrix is never stored: the saved state is two
// floats per row, `stats` = (m, l), B×NH×T×2.
//
// Backward recomputes the probabilities from the saved stats:
// P = exp(scale·q·k − m) · (1/l). Three kernels in one pass: rowDot writes
// D_i = dout_i · out_i (= Σ_j P_ij dP_ij); backwardQ (one invocation per query
// row, streaming key tiles) writes dq; backwardKV (one invocation per key row,
// streaming query tiles, over the kv head's H/KV query heads in order) writes
// dk and dv. No atomics: each output row has one owner. probs materialises the WASM `att` (B×NH×T×T, zero above the diagonal)
// from the stats, for code that wants the WASM saved state.
//
// The head size is a compile-time constant (private arrays need one), so a
// module is generated per head size. Every workgroup cell is written before
// it is read (the device runs with Dawn's disable_workgroup_init): each tile
// load writes all of its cells, zero beyond the sequence.

/** Query (or key) rows per workgroup: one invocation each. */
export const ATTENTION_ROWS = 64;
/** Invocations per workgroup of the probs kernel: one per element of att. */
export const ATTENTION_PROBS_THREADS = 256;
/** Largest head size the kernels accept (private arrays of 4·hs floats per invocation). */
export const ATTENTION_MAX_HEAD = 256;
/** Bytes of the uniform block: B, T, H, KV (u32), scale (f32), three u32 of padding. */
export const ATTENTION_PARAMS_BYTES = 32;

/** Rows of k/v (or q/dout) per staged tile: two tiles fit in 16 KiB of workgroup memory. */
export function attentionTileRows(hs: number): number {
  return Math.max(8, Math.min(64, Math.floor(2048 / hs)));
}

/** The five shaders for head size `hs`. */
export interface AttentionShaders {
  forward: string;
  probs: string;
  rowDot: string;
  backwardQ: string;
  backwardKV: string;
}

export function attentionWgsl(hs: number): AttentionShaders {
  if (!Number.isInteger(hs) || hs < 1 || hs > ATTENTION_MAX_HEAD) throw new RangeError(`attention: head size ${hs} outside 1..${ATTENTION_MAX_HEAD}`);
  const head = header(hs);
  return {
    forward: head + FORWARD,
    probs: head + PROBS,
    rowDot: head + ROW_DOT,
    backwardQ: head + BACKWARD_Q,
    backwardKV: head + BACKWARD_KV,
  };
}

function header(hs: number): string {
  return /* wgsl */ `
const HS: u32 = ${hs}u;
const ROWS: u32 = ${ATTENTION_ROWS}u;
const KB: u32 = ${attentionTileRows(hs)}u;
const PROBS_THREADS: u32 = ${ATTENTION_PROBS_THREADS}u;

struct Params { B: u32, T: u32, H: u32, KV: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;

// float offset of row t's q for head h of batch b; qkvRow(b, g, t) + KOFF() is
// kv head g's k, + VOFF() its v
fn qkvRow(b: u32, h: u32, t: u32) -> u32 { return (b * p.T + t) * (p.H + 2u * p.KV) * HS + h * HS; }
fn KOFF() -> u32 { return p.H * HS; }
fn VOFF() -> u32 { return (p.H + p.KV) * HS; }
// float offset of row t, head h of batch b in a B×T×H·hs array (out, dout)
fn outRow(b: u32, h: u32, t: u32) -> u32 { return (b * p.T + t) * p.H * HS + h * HS; }
`;
}

// Stages KB rows of kv head g's k and v from key j0 on: every cell written, 0 beyond T.
const STAGE_KV = /* wgsl */ `
var<workgroup> Ks: array<f32, KB * HS>;
var<workgroup> Vs: array<f32, KB * HS>;

fn stageKV(b: u32, g: u32, j0: u32, li: u32) {
  for (var x = li; x < KB * HS; x += ROWS) {
    let j = j0 + x / HS;
    var kx = 0.0;
    var vx = 0.0;
    if (j < p.T) {
      let o = qkvRow(b, g, j) + x % HS;
      kx = qkv[o + KOFF()];
      vx = qkv[o + VOFF()];
    }
    Ks[x] = kx;
    Vs[x] = vx;
  }
}
`;

const FORWARD = /* wgsl */ `
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;
${STAGE_KV}
@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32) {
  let b = wg.y / p.H;
  let h = wg.y % p.H;
  let kvh = h / (p.H / p.KV);
  let i0 = wg.x * ROWS;
  let i = i0 + li;
  let live = i < p.T;
  var q: array<f32, HS>;
  var acc: array<f32, HS>;
  var s: array<f32, KB>;
  for (var d = 0u; d < HS; d++) { q[d] = 0.0; acc[d] = 0.0; }
  if (live) {
    let o = qkvRow(b, h, i);
    for (var d = 0u; d < HS; d++) { q[d] = qkv[o + d]; }
  }
  var m = 0.0; // running max of the scores seen (meaningful once l > 0)
  var l = 0.0; // running sum of exp(score − m)
  let kEnd = min(p.T, i0 + ROWS); // the block's last query sees keys 0 .. kEnd − 1
  for (var j0 = 0u; j0 < kEnd; j0 += KB) {
    stageKV(b, kvh, j0, li);
    workgroupBarrier();
    if (live && j0 <= i) {
      let n = min(KB, i + 1u - j0);
      var mt = 0.0;
      for (var jj = 0u; jj < n; jj++) {
        var dot = 0.0;
        for (var d = 0u; d < HS; d++) { dot = fma(q[d], Ks[jj * HS + d], dot); }
        let sc = dot * p.scale;
        s[jj] = sc;
        mt = select(max(mt, sc), sc, jj == 0u);
      }
      let mNew = select(mt, max(m, mt), l > 0.0);
      if (l > 0.0 && mNew > m) {
        let corr = exp(m - mNew);
        l = l * corr;
        for (var d = 0u; d < HS; d++) { acc[d] = acc[d] * corr; }
      }
      for (var jj = 0u; jj < n; jj++) {
        let e = exp(s[jj] - mNew);
        l = l + e;
        for (var d = 0u; d < HS; d++) { acc[d] = fma(e, Vs[jj * HS + d], acc[d]); }
      }
      m = mNew;
    }
    workgroupBarrier();
  }
  if (live) {
    let inv = 1.0 / l;
    let o = outRow(b, h, i);
    for (var d = 0u; d < HS; d++) { out[o + d] = acc[d] * inv; }
    let st = (wg.y * p.T + i) * 2u;
    stats[st] = m;
    stats[st + 1u] = l;
  }
}
`;

const PROBS = /* wgsl */ `
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> stats: array<f32>;
@group(0) @binding(3) var<storage, read_write> att: array<f32>;

@compute @workgroup_size(PROBS_THREADS)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32) {
  let e = wg.x * PROBS_THREADS + li;
  if (e >= p.T * p.T) { return; }
  let b = wg.y / p.H;
  let h = wg.y % p.H;
  let i = e / p.T;
  let j = e % p.T;
  var v = 0.0;
  if (j <= i) {
    let qo = qkvRow(b, h, i);
    let ko = qkvRow(b, h / (p.H / p.KV), j) + KOFF();
    var dot = 0.0;
    for (var d = 0u; d < HS; d++) { dot = fma(qkv[qo + d], qkv[ko + d], dot); }
    let st = (wg.y * p.T + i) * 2u;
    v = exp(dot * p.scale - stats[st]) * (1.0 / stats[st + 1u]);
  }
  att[wg.y * p.T * p.T + e] = v;
}
`;

const ROW_DOT = /* wgsl */ `
@group(0) @binding(1) var<storage, read> dout: array<f32>;
@group(0) @binding(2) var<storage, read> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> rowDot: array<f32>;

@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32) {
  let i = wg.x * ROWS + li;
  if (i >= p.T) { return; }
  let o = outRow(wg.y / p.H, wg.y % p.H, i);
  var s = 0.0;
  for (var d = 0u; d < HS; d++) { s = fma(dout[o + d], out[o + d], s); }
  rowDot[wg.y * p.T + i] = s;
}
`;

const BACKWARD_BINDINGS = /* wgsl */ `
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> dout: array<f32>;
@group(0) @binding(3) var<storage, read> stats: array<f32>;
@group(0) @binding(4) var<storage, read> rowDot: array<f32>;
@group(0) @binding(5) var<storage, read_write> dqkv: array<f32>;
`;

// dq_i = Σ_{j≤i} dS_ij k_j, dS_ij = P_ij (dout_i·v_j − D_i) · scale
const BACKWARD_Q = /* wgsl */ `
${BACKWARD_BINDINGS}
${STAGE_KV}
@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32) {
  let b = wg.y / p.H;
  let h = wg.y % p.H;
  let kvh = h / (p.H / p.KV);
  let i0 = wg.x * ROWS;
  let i = i0 + li;
  let live = i < p.T;
  var q: array<f32, HS>;
  var g: array<f32, HS>;
  var dq: array<f32, HS>;
  for (var d = 0u; d < HS; d++) { q[d] = 0.0; g[d] = 0.0; dq[d] = 0.0; }
  var m = 0.0;
  var inv = 0.0;
  var D = 0.0;
  if (live) {
    let qo = qkvRow(b, h, i);
    let go = outRow(b, h, i);
    for (var d = 0u; d < HS; d++) { q[d] = qkv[qo + d]; g[d] = dout[go + d]; }
    let r = wg.y * p.T + i;
    m = stats[2u * r];
    inv = 1.0 / stats[2u * r + 1u];
    D = rowDot[r];
  }
  let kEnd = min(p.T, i0 + ROWS);
  for (var j0 = 0u; j0 < kEnd; j0 += KB) {
    stageKV(b, kvh, j0, li);
    workgroupBarrier();
    if (live && j0 <= i) {
      let n = min(KB, i + 1u - j0);
      for (var jj = 0u; jj < n; jj++) {
        var dot = 0.0;
        var dP = 0.0;
        for (var d = 0u; d < HS; d++) {
          dot = fma(q[d], Ks[jj * HS + d], dot);
          dP = fma(g[d], Vs[jj * HS + d], dP);
        }
        let P = exp(dot * p.scale - m) * inv;
        let dS = P * (dP - D) * p.scale;
        for (var d = 0u; d < HS; d++) { dq[d] = fma(dS, Ks[jj * HS + d], dq[d]); }
      }
    }
    workgroupBarrier();
  }
  if (live) {
    let o = qkvRow(b, h, i);
    for (var d = 0u; d < HS; d++) { dqkv[o + d] = dq[d]; }
  }
}
`;

// dk_j = Σ_h Σ_{i≥j} dS_ij q_i, dv_j = Σ_h Σ_{i≥j} P_ij dout_i over the kv
// head's query heads h in order (one workgroup per (batch·kv head, key block))
const BACKWARD_KV = /* wgsl */ `
${BACKWARD_BINDINGS}
var<workgroup> Qs: array<f32, KB * HS>;
var<workgroup> Gs: array<f32, KB * HS>;
var<workgroup> Ms: array<f32, KB>;
var<workgroup> Inv: array<f32, KB>;
var<workgroup> Ds: array<f32, KB>;

@compute @workgroup_size(ROWS)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) li: u32) {
  let b = wg.y / p.KV;
  let g = wg.y % p.KV;
  let rep = p.H / p.KV;
  let j0 = wg.x * ROWS;
  let j = j0 + li;
  let live = j < p.T;
  var k: array<f32, HS>;
  var v: array<f32, HS>;
  var dk: array<f32, HS>;
  var dv: array<f32, HS>;
  for (var d = 0u; d < HS; d++) { k[d] = 0.0; v[d] = 0.0; dk[d] = 0.0; dv[d] = 0.0; }
  if (live) {
    let o = qkvRow(b, g, j);
    for (var d = 0u; d < HS; d++) { k[d] = qkv[o + KOFF() + d]; v[d] = qkv[o + VOFF() + d]; }
  }
  for (var h = g * rep; h < (g + 1u) * rep; h++) {
    let bh = b * p.H + h;
    // queries j0 .. T − 1 are the only ones that see this block's keys
    for (var i0 = j0; i0 < p.T; i0 += KB) {
      for (var x = li; x < KB * HS; x += ROWS) {
        let i = i0 + x / HS;
        var qx = 0.0;
        var gx = 0.0;
        if (i < p.T) {
          qx = qkv[qkvRow(b, h, i) + x % HS];
          gx = dout[outRow(b, h, i) + x % HS];
        }
        Qs[x] = qx;
        Gs[x] = gx;
      }
      for (var x = li; x < KB; x += ROWS) {
        let i = i0 + x;
        var mx = 0.0;
        var ix = 0.0;
        var dx = 0.0;
        if (i < p.T) {
          let r = bh * p.T + i;
          mx = stats[2u * r];
          ix = 1.0 / stats[2u * r + 1u];
          dx = rowDot[r];
        }
        Ms[x] = mx;
        Inv[x] = ix;
        Ds[x] = dx;
      }
      workgroupBarrier();
      if (live && i0 + KB > j) {
        let first = max(j, i0) - i0;
        let n = min(KB, p.T - i0);
        for (var ii = first; ii < n; ii++) {
          var dot = 0.0;
          var dP = 0.0;
          for (var d = 0u; d < HS; d++) {
            dot = fma(Qs[ii * HS + d], k[d], dot);
            dP = fma(Gs[ii * HS + d], v[d], dP);
          }
          let P = exp(dot * p.scale - Ms[ii]) * Inv[ii];
          let dS = P * (dP - Ds[ii]) * p.scale;
          for (var d = 0u; d < HS; d++) {
            dv[d] = fma(P, Gs[ii * HS + d], dv[d]);
            dk[d] = fma(dS, Qs[ii * HS + d], dk[d]);
          }
        }
      }
      workgroupBarrier();
    }
  }
  if (live) {
    let o = qkvRow(b, g, j);
    for (var d = 0u; d < HS; d++) { dqkv[o + KOFF() + d] = dk[d]; dqkv[o + VOFF() + d] = dv[d]; }
  }
}
`;
