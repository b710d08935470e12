// The layers of the Llama-family decoders (Llama, Mistral, Qwen2), forward /
// backward pairs over tensors in the engine memory, as in ./layers.ts (whose
// linear, residual, layer norm and cross-entropy they are used with). Shapes:
// N = B·T rows, C channels, H query heads, KV key/value heads, D = headDim.
// Backward passes accumulate (+=) into parameter gradients; what they do to
// input gradients is stated on each function.
//
// Layouts (docs/engine.md, "Decoder kernels"):
// - qkv: one fused projection, N × (H + 2·KV)·D: q heads, then k heads, then
//   v heads (Hugging Face's q_proj, k_proj, v_proj outputs side by side, so
//   Qwen2's three biases are one bias of the fused linear);
// - the MLP's gate and up: one fused projection, N × 2I: [gate | up];
// - RoPE turns the q and k heads of qkv in place, before attention (and
//   before a KV cache stores the keys).
import type { Kernels } from '../engine/kernels.ts';
import type { Tensor } from '../engine/tensor.ts';
import type { IntBuffer } from './layers.ts';
import type { RopeTable } from './rope.ts';

/** The attention's heads (a DecoderConfig has these fields). */
export interface HeadShape {
  heads: number;
  kvHeads: number;
  headDim: number;
}

/** Floats per row of the fused qkv: (H + 2·KV)·D. */
export function qkvWidth(s: HeadShape): number {
  return (s.heads + 2 * s.kvHeads) * s.headDim;
}

// ---- RMSNorm --------------------------------------------------------------

/** out = inp · rstd · w per row, rstd = 1 / √(mean(inp²) + eps) (saved: N floats) */
export function rmsnormForward(k: Kernels, out: Tensor, rstd: Tensor, inp: Tensor, w: Tensor, eps: number, N: number, C: number): void {
  k.rmsnormForward(out.ptr, rstd.ptr, inp.ptr, w.ptr, eps, N, C);
}

/** dinp += ; dw += */
export function rmsnormBackward(k: Kernels, dinp: Tensor, dw: Tensor, dout: Tensor, inp: Tensor, w: Tensor, rstd: Tensor, N: number, C: number): void {
  k.rmsnormBackwardInput(dinp.ptr, dout.ptr, inp.ptr, w.ptr, rstd.ptr, N, C);
  k.rmsnormBackwardParams(dw.ptr, dout.ptr, inp.ptr, rstd.ptr, N, C);
}

// ---- rotary position embeddings -------------------------------------------

/**
 * Where each row's position is: the int32 at buffer.data[offset + r·stride].
 * A plain array of positions has offset 0, stride 1; the KV row table (cache
 * base, position per row) is offset 1, stride 2.
 */
export interface RowPositions {
  buffer: IntBuffer;
  offset: number;
  stride: number;
}

/** Positions t = r mod T of B sequences of T rows, in `buffer` (B·T int32s). */
export function sequencePositions(buffer: IntBuffer, B: number, T: number): RowPositions {
  if (buffer.data.length < B * T) throw new RangeError(`rope: ${buffer.data.length} positions for ${B}×${T} rows`);
  for (let r = 0; r < B * T; r++) buffer.data[r] = r % T;
  return { buffer, offset: 0, stride: 1 };
}

/** Checks every row's position against the table and returns the kernels' (pointer, stride). */
function positionArgs(p: RowPositions, rows: number, table: RopeTable): [number, number] {
  const { data } = p.buffer;
  if (p.offset + (rows - 1) * p.stride >= data.length) throw new RangeError(`rope: positions for ${rows} rows overrun their buffer`);
  for (let r = 0; r < rows; r++) {
    const pos = data[p.offset + r * p.stride];
    if (!(pos >= 0 && pos < table.positions)) throw new RangeError(`rope: row ${r} has position ${pos}, outside the table's 0..${table.positions - 1}`);
  }
  return [p.buffer.ptr + p.offset * 4, p.stride];
}

function checkTable(table: RopeTable, s: HeadShape): void {
  if (table.headDim !== s.headDim) throw new RangeError(`rope: table for headDim ${table.headDim}, heads of ${s.headDim}`);
}

/** Turns the q and k heads of qkv (rows × (H + 2KV)·D) in place by each row's position. */
export function ropeForward(k: Kernels, qkv: Tensor, rows: number, s: HeadShape, positions: RowPositions, table: RopeTable): void {
  checkTable(table, s);
  const [ptr, stride] = positionArgs(positions, rows, table);
  k.ropeForward(qkv.ptr, qkv.ptr, rows, s.heads + s.kvHeads, s.headDim, qkvWidth(s), ptr, stride, table.tensor.ptr);
}

/** dqkv's q and k parts = their inverse rotation, in place (written over the gradient of the rotated values); the v part is untouched. */
export function ropeBackward(k: Kernels, dqkv: Tensor, rows: number, s: HeadShape, positions: RowPositions, table: RopeTable): void {
  checkTable(table, s);
  const [ptr, stride] = positionArgs(positions, rows, table);
  k.ropeBackward(dqkv.ptr, dqkv.ptr, rows, s.heads + s.kvHeads, s.headDim, qkvWidth(s), ptr, stride, table.tensor.ptr);
}

// ---- SwiGLU -----------------------------------------------------------------

/** out (N×I) = silu(gate) · up, from the fused projection inp (N×2I: [gate | up]) */
export function swigluForward(k: Kernels, out: Tensor, inp: Tensor, N: number, I: number): void {
  k.swigluForward(out.ptr, inp.ptr, N, I);
}

/** dinp (N×2I) = (written) */
export function swigluBackward(k: Kernels, dinp: Tensor, inp: Tensor, dout: Tensor, N: number, I: number): void {
  k.swigluBackward(dinp.ptr, inp.ptr, dout.ptr, N, I);
}

// ---- grouped-query causal attention ---------------------------------------

/** out (N × H·D) from qkv (N × (H + 2KV)·D, RoPE applied); att (B × H × T × T) keeps the probabilities for backward. */
export function gqaAttentionForward(k: Kernels, out: Tensor, att: Tensor, qkv: Tensor, B: number, T: number, s: HeadShape): void {
  k.gqaAttentionForward(out.ptr, att.ptr, qkv.ptr, B, T, s.heads, s.kvHeads, s.headDim);
}

/** dqkv = (written: q, k and v parts; dk and dv summed over each kv head's query heads) */
export function gqaAttentionBackward(k: Kernels, dqkv: Tensor, dout: Tensor, qkv: Tensor, att: Tensor, B: number, T: number, s: HeadShape): void {
  k.gqaAttentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, s.heads, s.kvHeads, s.headDim);
}

// ---- over a KV cache (inference) --------------------------------------------

/** T rounded up to a multiple of 4 (the cached keys' row stride). */
function pad4(n: number): number {
  return (n + 3) & ~3;
}

/** Floats one layer of a session's cache takes for a context of T: keys KV·D × pad4(T), values T × KV·D. */
export function gqaKvLayerFloats(s: HeadShape, T: number): number {
  const KD = s.kvHeads * s.headDim;
  return KD * pad4(T) + T * KD;
}

/** Where layer `layer` keeps its keys and values, in bytes from the start of a session's cache of gqaKvLayerFloats per layer. */
export function gqaKvLayerOffsets(s: HeadShape, T: number, layer: number): { keys: number; values: number } {
  const keys = layer * gqaKvLayerFloats(s, T) * 4;
  return { keys, values: keys + s.kvHeads * s.headDim * pad4(T) * 4 };
}

/**
 * One layer's attention for new rows of sessions over their KV caches:
 * RoPE on the rows' q and k (in place, at the table's positions), their keys
 * and values stored at those positions, then out (rows × H·D) = each row's
 * attention over its session's positions 0..pos. `table` is the row table
 * (rows × 2 int32: the session's cache base in bytes, the row's position);
 * `rope` null for a model without rotary embeddings.
 */
export function gqaAttentionCached(
  k: Kernels, out: Tensor, qkv: Tensor, table: IntBuffer, rows: number, layer: { keys: number; values: number }, s: HeadShape, T: number,
  rope: RopeTable | null,
): void {
  for (let r = 0; r < rows; r++) {
    const pos = table.data[2 * r + 1];
    if (!(pos >= 0 && pos < T)) throw new RangeError(`attention: row ${r} has position ${pos}, outside the cache's 0..${T - 1}`);
  }
  if (rope) ropeForward(k, qkv, rows, s, { buffer: table, offset: 1, stride: 2 }, rope);
  k.gqaCacheStore(qkv.ptr, table.ptr, rows, layer.keys, layer.values, s.heads, s.kvHeads, s.headDim, T);
  k.gqaAttentionCached(out.ptr, qkv.ptr, table.ptr, rows, layer.keys, layer.values, s.heads, s.kvHeads, s.headDim, T);
}
