// The Llama-family decoder kernels on the GPU: the WebGPU counterparts of
// Kernels.rmsnormForward, rmsnormBackwardInput, rmsnormBackwardParams,
// ropeForward, ropeBackward, swigluForward, swigluBackward, gqaCacheStore and
// gqaAttentionCached (src/engine/kernels.ts, assembly/decoder.ts,
// assembly/attention-gqa.ts), with the same arguments in the same order and
// the same accumulate-or-overwrite rules, arrays being GPU arrays (or windows
// of one) instead of heap pointers. The differences:
// - RoPE in place (out the same window as inp) runs a one-array kernel, as
//   WebGPU forbids a written binding aliasing another; windows of one buffer
//   that overlap otherwise are refused. `tableRows` (the RoPE table's
//   positions) bounds the table's window; positions are not checked on the
//   GPU (decoder-layers checks them on the host, as for WASM).
// - The KV cache is one GPU array, passed first (the WASM kernels write
//   through the table's heap addresses): the table's bases, kOffset and
//   vOffset are in floats (./kv-cache.wgsl.ts). `uploadRowTable` checks a
//   table before the kernels trust it.
// - gqaAttentionCached keeps its exps in a scratch array of its own (rows ×
//   H × T floats, grown on demand), like the WASM kernel's scratch.
// Grouped-query training attention is ../attention.ts with a GqaShape.
import { attentionScale } from '../attention.ts';
import { createArray, type GpuArray } from '../buffers.ts';
import { createKernels, destroyKernels, uploadIndices, use, type GpuKernel, type GpuRef } from '../program.ts';
import { COLUMN_WG, DECODER_SPECS, ELEMENT_WG } from './decoder.wgsl.ts';
import { KV_CACHE_SPECS, STORE_WG } from './kv-cache.wgsl.ts';

const SPECS = { ...DECODER_SPECS, ...KV_CACHE_SPECS };
type Name = keyof typeof SPECS;

function arrayOf(ref: GpuRef): GpuArray {
  return 'array' in ref ? ref.array : ref;
}

function offsetOf(ref: GpuRef): number {
  return 'array' in ref ? ref.offset : 0;
}

function lengthFrom(ref: GpuRef): number {
  return arrayOf(ref).length - offsetOf(ref);
}

/** T rounded up to a multiple of 4: the cached keys' row stride. */
export function pad4(n: number): number {
  return (n + 3) & ~3;
}

/** The WASM kernels' rule: H a positive multiple of KV ≥ 1. */
function checkHeads(op: string, H: number, KV: number, D: number): void {
  if (!(KV >= 1 && H >= KV && H % KV === 0 && D >= 1)) throw new RangeError(`${op}: H = ${H}, KV = ${KV}, D = ${D} (KV ≥ 1 dividing H, D ≥ 1)`);
}

/**
 * A KV row table (rows × 2 int32: cache base in floats, position) on the GPU,
 * after checking that each row's session cache (`sessionFloats` from its
 * base) lies inside a cache array of `cacheFloats` and that its position is in
 * [0, T): on a GPU an index out of range reads or writes some other element.
 */
export function uploadRowTable(device: GPUDevice, table: Int32Array, cacheFloats: number, sessionFloats: number, T: number): GpuArray {
  for (let r = 0; 2 * r < table.length; r++) {
    const base = table[2 * r], pos = table[2 * r + 1];
    if (!(base >= 0 && base + sessionFloats <= cacheFloats)) throw new RangeError(`row table: row ${r}'s cache at ${base} (+${sessionFloats}) is outside the cache's ${cacheFloats} floats`);
    if (!(pos >= 0 && pos < T)) throw new RangeError(`row table: row ${r} has position ${pos}, outside the cache's 0..${T - 1}`);
  }
  return uploadIndices(device, table, 2 ** 31, 'row table');
}

export class GpuDecoder {
  private scores: GpuArray;

  private constructor(private readonly device: GPUDevice, private readonly kernels: Record<Name, GpuKernel>) {
    this.scores = createArray(device, 1, 'gqaAttentionCached scores');
  }

  static async create(device: GPUDevice, maxGroupsPerDimension?: number): Promise<GpuDecoder> {
    return new GpuDecoder(device, await createKernels(device, SPECS, maxGroupsPerDimension));
  }

  /** out = inp · rstd · w per row (N×C), rstd = 1 / √(mean(inp²) + eps) (saved: N floats) */
  rmsnormForward(out: GpuRef, rstd: GpuRef, inp: GpuRef, w: GpuRef, eps: number, N: number, C: number): void {
    this.kernels.rmsnormForward.run({
      uints: { N, C },
      floats: { invC: 1 / C, eps },
      arrays: { out: use(out, N * C), rstd: use(rstd, N), inp: use(inp, N * C), weight: use(w, C) },
      groups: N,
    });
  }

  /** dinp += input gradient of RMSNorm */
  rmsnormBackwardInput(dinp: GpuRef, dout: GpuRef, inp: GpuRef, w: GpuRef, rstd: GpuRef, N: number, C: number): void {
    this.kernels.rmsnormBackwardInput.run({
      uints: { N, C },
      floats: { invC: 1 / C },
      arrays: { dinp: use(dinp, N * C), dout: use(dout, N * C), inp: use(inp, N * C), weight: use(w, C), rstd: use(rstd, N) },
      groups: N,
    });
  }

  /** dw += weight gradient of RMSNorm (rows summed in order, per column) */
  rmsnormBackwardParams(dw: GpuRef, dout: GpuRef, inp: GpuRef, rstd: GpuRef, N: number, C: number): void {
    this.kernels.rmsnormBackwardParams.run({
      uints: { N, C },
      arrays: { dweight: use(dw, C), dout: use(dout, N * C), inp: use(inp, N * C), rstd: use(rstd, N) },
      groups: Math.ceil(C / COLUMN_WG),
    });
  }

  /**
   * Rotary embeddings on the first `heads` heads (headDim floats each, even)
   * of `rows` rows `stride` floats apart, row r turned by the int32 at
   * positions[r·posStride], cos/sin from `table` (tableRows × headDim: per
   * position, the headDim/2 cosines then the sines). out may be inp.
   */
  ropeForward(out: GpuRef, inp: GpuRef, rows: number, heads: number, headDim: number, stride: number, positions: GpuRef, posStride: number, table: GpuRef, tableRows?: number): void {
    this.rope(1, out, inp, rows, heads, headDim, stride, positions, posStride, table, tableRows);
  }

  /** dinp = the inverse rotation of dout (written; dinp may be dout); arguments as ropeForward */
  ropeBackward(dinp: GpuRef, dout: GpuRef, rows: number, heads: number, headDim: number, stride: number, positions: GpuRef, posStride: number, table: GpuRef, tableRows?: number): void {
    this.rope(-1, dinp, dout, rows, heads, headDim, stride, positions, posStride, table, tableRows);
  }

  /** out (N×I) = silu(gate) · up, from inp (N×2I: [gate | up] per row) */
  swigluForward(out: GpuRef, inp: GpuRef, N: number, I: number): void {
    this.kernels.swigluForward.run({ uints: { N, I }, arrays: { out: use(out, N * I), inp: use(inp, 2 * N * I) }, groups: Math.ceil((N * I) / ELEMENT_WG) });
  }

  /** dinp (N×2I) = gradient of swigluForward (written) */
  swigluBackward(dinp: GpuRef, inp: GpuRef, dout: GpuRef, N: number, I: number): void {
    this.kernels.swigluBackward.run({
      uints: { N, I },
      arrays: { dinp: use(dinp, 2 * N * I), inp: use(inp, 2 * N * I), dout: use(dout, N * I) },
      groups: Math.ceil((N * I) / ELEMENT_WG),
    });
  }

  /** Writes the keys and values of `rows` qkv rows ((H + 2KV)·D floats each) into their sessions' caches at their positions (the table's). */
  gqaCacheStore(cache: GpuRef, qkv: GpuRef, table: GpuRef, rows: number, kOffset: number, vOffset: number, H: number, KV: number, D: number, T: number): void {
    checkHeads('gqaCacheStore', H, KV, D);
    this.kernels.gqaCacheStore.run({
      uints: { rows, H, KV, D, T, kOffset, vOffset },
      arrays: { cache: use(cache, lengthFrom(cache)), qkv: use(qkv, rows * (H + 2 * KV) * D), table: use(table, 2 * rows) },
      groups: Math.ceil((rows * KV * D) / STORE_WG),
    });
  }

  /** out (rows × H·D) = causal attention of each row's query heads (in qkv) over its session's cached keys and values at positions 0..pos. */
  gqaAttentionCached(out: GpuRef, cache: GpuRef, qkv: GpuRef, table: GpuRef, rows: number, kOffset: number, vOffset: number, H: number, KV: number, D: number, T: number): void {
    checkHeads('gqaAttentionCached', H, KV, D);
    const need = Math.max(1, rows * H * T);
    if (this.scores.length < need) {
      this.scores.destroy();
      this.scores = createArray(this.device, need, 'gqaAttentionCached scores');
    }
    this.kernels.gqaAttentionCached.run({
      uints: { rows, H, KV, D, T, kOffset, vOffset },
      floats: { scale: attentionScale(D) },
      arrays: {
        out: use(out, rows * H * D), scores: use(this.scores, rows * H * T), cache: use(cache, lengthFrom(cache)),
        qkv: use(qkv, rows * (H + 2 * KV) * D), table: use(table, 2 * rows),
      },
      groups: rows * H,
    });
  }

  destroy(): void {
    this.scores.destroy();
    destroyKernels(this.kernels);
  }

  private rope(sign: number, out: GpuRef, inp: GpuRef, rows: number, heads: number, D: number, stride: number, positions: GpuRef, posStride: number, table: GpuRef, tableRows?: number): void {
    if (!(Number.isInteger(D) && D > 0 && D % 2 === 0)) throw new RangeError(`rope: headDim ${D} must be a positive even integer`);
    if (rows > 0 && heads * D > stride) throw new RangeError(`rope: ${heads} heads of ${D} overrun rows of ${stride} floats`);
    const extent = rows === 0 ? 0 : (rows - 1) * stride + heads * D;
    const P = tableRows ?? Math.floor(lengthFrom(table) / D);
    const common = {
      uints: { rows, heads, D, stride, posStride },
      floats: { sign },
      groups: Math.ceil((rows * heads * (D / 2)) / ELEMENT_WG),
    };
    const pos = use(positions, rows === 0 ? 0 : (rows - 1) * posStride + 1), tab = use(table, P * D);
    if (arrayOf(out).buffer === arrayOf(inp).buffer && offsetOf(out) === offsetOf(inp)) {
      this.kernels.ropeInPlace.run({ ...common, arrays: { x: use(out, extent), positions: pos, table: tab } });
    } else {
      this.kernels.rope.run({ ...common, arrays: { out: use(out, extent), inp: use(inp, extent), positions: pos, table: tab } });
    }
  }
}
