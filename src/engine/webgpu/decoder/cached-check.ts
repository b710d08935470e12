// The grouped-query decode path on both backends: several sessions, each with
// its own cache of two layers and its own prefix length, a prefill that
// stores every prefix row (gqaCacheStore), then one decode call of new rows
// (one per session, two consecutive rows for one of them) that stores and
// attends (gqaCacheStore, gqaAttentionCached) in layer 1, so kOffset and
// vOffset are not 0. The stored caches must match bit for bit (copies); each
// new row's out must lie within the training forward's bound
// (../attention-bound.ts) of that row of its session's sequence: within E of
// the exact value on each backend, within 2E of each other.
import type { Engine } from '../../engine.ts';
import { attentionReference, compareWithin, type BoundComparison } from '../attention-bound.ts';
import { readArray, uploadArray, type GpuArray } from '../buffers.ts';
import type { GpuKernelSet } from '../kernel-set.ts';
import { pad4, uploadRowTable } from './decoder.ts';

export interface CachedShape {
  H: number;
  KV: number;
  D: number;
  /** the cache's context */
  T: number;
  /** each session's prefix length (rows already in its cache); each gets one new row, the first session two */
  prefixes: number[];
}

export interface CachedComparison {
  /** cache floats that differ between the backends after the decode call */
  cacheDiffering: number;
  gpuWasm: BoundComparison;
  gpuExact: BoundComparison;
  wasmExact: BoundComparison;
  rows: number;
}

/** Floats of one layer of one session: keys KV·D × pad4(T), values T × KV·D. */
function layerFloats(s: CachedShape): number {
  return s.KV * s.D * (pad4(s.T) + s.T);
}

interface Plan {
  /** per session, its whole sequence's qkv (prefix and new rows) */
  seqs: Float32Array[];
  /** per session, rows in its sequence */
  lengths: number[];
  prefill: { qkv: Float32Array; table: Int32Array };
  decode: { qkv: Float32Array; table: Int32Array; sessions: number[] };
  cacheFloats: number;
  sessionFloats: number;
  kOffset: number;
  vOffset: number;
}

function plan(s: CachedShape, random: () => number): Plan {
  const W = (s.H + 2 * s.KV) * s.D, L = layerFloats(s), sessionFloats = 2 * L;
  const lengths = s.prefixes.map((p, i) => p + (i === 0 ? 2 : 1));
  if (lengths.some((n) => n > s.T)) throw new RangeError('cached check: a sequence is longer than the cache');
  const seqs = lengths.map((n) => Float32Array.from({ length: n * W }, () => random() * 2 - 1));
  const pre: number[] = [], dec: number[] = [], preRows: Float32Array[] = [], decRows: Float32Array[] = [], sessions: number[] = [];
  s.prefixes.forEach((p, i) => {
    // a gap of 7 floats between sessions: bases that are not multiples of anything
    const base = i * (sessionFloats + 7);
    for (let t = 0; t < lengths[i]; t++) {
      const row = seqs[i].subarray(t * W, (t + 1) * W);
      if (t < p) {
        pre.push(base, t);
        preRows.push(row);
      } else {
        dec.push(base, t);
        decRows.push(row);
        sessions.push(i);
      }
    }
  });
  const join = (rows: Float32Array[]): Float32Array => {
    const out = new Float32Array(Math.max(1, rows.length * W));
    rows.forEach((r, i) => out.set(r, i * W));
    return out;
  };
  return {
    seqs, lengths,
    prefill: { qkv: join(preRows), table: Int32Array.from(pre) },
    decode: { qkv: join(decRows), table: Int32Array.from(dec), sessions },
    cacheFloats: s.prefixes.length * (sessionFloats + 7), sessionFloats,
    kOffset: L, vOffset: L + s.KV * s.D * pad4(s.T),
  };
}

function runWasm(engine: Engine, s: CachedShape, p: Plan, garbage: Float32Array): { cache: Float32Array; out: Float32Array } {
  const k = engine.kernels, rows = p.decode.table.length / 2;
  const cache = engine.tensorFrom([p.cacheFloats], garbage);
  const pre = engine.tensorFrom([p.prefill.qkv.length], p.prefill.qkv), dec = engine.tensorFrom([p.decode.qkv.length], p.decode.qkv);
  const out = engine.tensor([rows * s.H * s.D]);
  const tables = [p.prefill.table, p.decode.table].map((t) => {
    const b = engine.int32(Math.max(1, t.length));
    for (let r = 0; 2 * r < t.length; r++) {
      b.data[2 * r] = cache.ptr + 4 * t[2 * r];
      b.data[2 * r + 1] = t[2 * r + 1];
    }
    return b;
  });
  try {
    const [kOff, vOff] = [4 * p.kOffset, 4 * p.vOffset];
    k.gqaCacheStore(pre.ptr, tables[0].ptr, p.prefill.table.length / 2, kOff, vOff, s.H, s.KV, s.D, s.T);
    k.gqaCacheStore(dec.ptr, tables[1].ptr, rows, kOff, vOff, s.H, s.KV, s.D, s.T);
    k.gqaAttentionCached(out.ptr, dec.ptr, tables[1].ptr, rows, kOff, vOff, s.H, s.KV, s.D, s.T);
    return { cache: cache.data.slice(), out: out.data.slice() };
  } finally {
    for (const t of [cache, pre, dec, out, ...tables]) engine.free(t);
  }
}

async function runGpu(set: GpuKernelSet, s: CachedShape, p: Plan, garbage: Float32Array): Promise<{ cache: Float32Array; out: Float32Array }> {
  const d = set.device, rows = p.decode.table.length / 2;
  const owned: GpuArray[] = [];
  const keep = (a: GpuArray): GpuArray => (owned.push(a), a);
  try {
    const cache = keep(uploadArray(d, garbage)), out = keep(uploadArray(d, new Float32Array(rows * s.H * s.D).fill(NaN)));
    const pre = keep(uploadArray(d, p.prefill.qkv)), dec = keep(uploadArray(d, p.decode.qkv));
    const preTable = keep(uploadRowTable(d, p.prefill.table.length ? p.prefill.table : Int32Array.of(0, 0), p.cacheFloats, p.sessionFloats, s.T));
    const decTable = keep(uploadRowTable(d, p.decode.table, p.cacheFloats, p.sessionFloats, s.T));
    set.decoder.gqaCacheStore(cache, pre, preTable, p.prefill.table.length / 2, p.kOffset, p.vOffset, s.H, s.KV, s.D, s.T);
    set.decoder.gqaCacheStore(cache, dec, decTable, rows, p.kOffset, p.vOffset, s.H, s.KV, s.D, s.T);
    set.decoder.gqaAttentionCached(out, cache, dec, decTable, rows, p.kOffset, p.vOffset, s.H, s.KV, s.D, s.T);
    return { cache: await readArray(d, cache), out: await readArray(d, out) };
  } finally {
    for (const a of owned) a.destroy();
  }
}

/** Runs the decode path of `s` on both backends and compares them. */
export async function checkCachedPath(engine: Engine, set: GpuKernelSet, s: CachedShape, random: () => number): Promise<CachedComparison> {
  const p = plan(s, random);
  const garbage = Float32Array.from({ length: p.cacheFloats }, () => random() * 18 - 9);
  const wasm = runWasm(engine, s, p, garbage), gpu = await runGpu(set, s, p, garbage);
  let cacheDiffering = 0;
  for (let x = 0; x < garbage.length; x++) if (!Object.is(wasm.cache[x], gpu.cache[x])) cacheDiffering++;
  // the exact value and bound of each new row: its row of its session's sequence, through the training reference
  const HD = s.H * s.D, rows = p.decode.sessions.length;
  const exact = new Float64Array(rows * HD), bound = new Float64Array(rows * HD);
  const refs = p.seqs.map((qkv, i) => attentionReference({ B: 1, T: p.lengths[i], H: s.H, KV: s.KV, D: s.D }, { qkv, dout: new Float32Array(p.lengths[i] * HD) }));
  for (let r = 0; r < rows; r++) {
    const i = p.decode.sessions[r], pos = p.decode.table[2 * r + 1];
    exact.set(refs[i].out.subarray(pos * HD, (pos + 1) * HD), r * HD);
    bound.set(refs[i].outBound.subarray(pos * HD, (pos + 1) * HD), r * HD);
  }
  return {
    cacheDiffering, rows,
    gpuWasm: compareWithin(gpu.out, wasm.out, bound, 2),
    gpuExact: compareWithin(gpu.out, exact, bound, 1),
    wasmExact: compareWithin(wasm.out, exact, bound, 1),
  };
}
