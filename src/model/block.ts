// One decoder block, for every architecture of ./arch.ts: the one home of
// "a decoder layer". Forward and backward side by side (the training path,
// ./gpt.ts), and the forward over a KV cache (the serving path,
// src/inference/stage-inference.ts), from the same pieces:
//
//   x ← x + proj(attn(rope(qkv(norm1(x)))))
//   x ← x + down(act(fc(norm2(x))))
//
// norm is LayerNorm or RMSNorm; rope only with rotary positions; attn is
// multi-head (the byte GPT's kernel, when heads are C / H and there is no
// rotation) or grouped-query; act is tanh-GELU of fc, or SwiGLU of fc's
// [gate | up]. Parameter names are ./parts.ts's.
//
// With LoRA (./lora-linear.ts) the four linears carry adapters and every base
// tensor is frozen: G has no entry for them (G(name) is null), so their
// backward gives the input's gradient and nothing else.
import type { Kernels } from '../engine/kernels.ts';
import type { Tensor } from '../engine/tensor.ts';
import { blockWidths, isClassicAttention, resolveArch, type BlockWidths, type DecoderArch } from './arch.ts';
import type { GptConfig } from './config.ts';
import * as D from './decoder-layers.ts';
import * as L from './layers.ts';
import { loraLinearBackward, loraLinearForward, type BlockLora } from './lora-linear.ts';
import type { RopeTable } from './rope.ts';

/** What a block's kernels need to know of the model, worked out once per stage. */
export interface BlockShape {
  config: GptConfig;
  arch: DecoderArch;
  widths: BlockWidths;
  heads: D.HeadShape;
  /** the byte GPT's attention kernels (multi-head, no rotation) */
  classic: boolean;
}

export function blockShape(config: GptConfig): BlockShape {
  const arch = resolveArch(config);
  return {
    config, arch, widths: blockWidths(config),
    heads: { heads: config.heads, kvHeads: arch.kvHeads, headDim: arch.headDim },
    classic: isClassicAttention(config),
  };
}

/** A block's parameters (or gradients) by name: `get('ln1.w')`; null for a bias the architecture has not. */
export type BlockTensors = (name: string) => Tensor | null;

/** Activations one block keeps between forward and backward. `input` is the previous block's `out` (or the stage's input). */
export interface BlockActs {
  input: Tensor;
  ln1: Tensor; ln1Mean: Tensor; ln1Rstd: Tensor;
  qkv: Tensor; att: Tensor; atty: Tensor;
  res2: Tensor;
  ln2: Tensor; ln2Mean: Tensor; ln2Rstd: Tensor;
  /** the MLP's first projection (N × fc) and its activation (N × hidden) */
  fch: Tensor; fchAct: Tensor;
  out: Tensor;
}

/** Allocates a block's activations for B sequences of T rows (T the context). */
export function blockActs(s: BlockShape, t: (shape: number[]) => Tensor, input: Tensor, B: number, T: number): BlockActs {
  const { channels: C, heads: H } = s.config;
  const N = B * T;
  const w = s.widths;
  return {
    input,
    ln1: t([N, C]), ln1Mean: t([N]), ln1Rstd: t([N]),
    qkv: t([N, w.qkv]), att: t([B, H, T, T]), atty: t([N, w.attn]),
    res2: t([N, C]),
    ln2: t([N, C]), ln2Mean: t([N]), ln2Rstd: t([N]),
    fch: t([N, w.fc]), fchAct: t([N, w.hidden]),
    out: t([N, C]),
  };
}

/** Backward scratch, shared by a stage's blocks (N = B·T rows). */
export interface BlockScratch {
  /** the residual stream's gradient: d(out) on entry to blockBackward, d(input) on return */
  dres: Tensor;
  /** N × C */
  dsmall: Tensor;
  /** N × H·D */
  dattn: Tensor;
  /** N × qkv */
  dqkv: Tensor;
  /** N × fc */
  dfc: Tensor;
  /** N × hidden */
  dhidden: Tensor;
  /** N × C, forward's too */
  tmp: Tensor;
}

/** Allocates the scratch; dattn is dsmall when H·D = C, and GELU's backward runs in place (dhidden is dfc), as src/planner/cost.ts counts. */
export function blockScratch(s: BlockShape, t: (shape: number[]) => Tensor, N: number): BlockScratch {
  const C = s.config.channels, w = s.widths;
  const dsmall = t([N, C]);
  const dfc = t([N, w.fc]);
  return {
    dres: t([N, C]), dsmall, dattn: w.attn === C ? dsmall : t([N, w.attn]), dqkv: t([N, w.qkv]),
    dfc, dhidden: s.arch.mlp === 'gelu' ? dfc : t([N, w.hidden]), tmp: t([N, C]),
  };
}

/** Rotary embeddings' table and each row's position (null without rotary positions). */
export interface BlockRope {
  table: RopeTable;
  positions: D.RowPositions;
}

const need = (P: BlockTensors, name: string): Tensor => {
  const t = P(name);
  if (!t) throw new Error(`block has no ${name}`);
  return t;
};

function normForward(k: Kernels, s: BlockShape, P: BlockTensors, name: string, out: Tensor, mean: Tensor, rstd: Tensor, inp: Tensor, N: number): void {
  const C = s.config.channels;
  if (s.arch.norm === 'layernorm') L.layernormForward(k, out, mean, rstd, inp, need(P, name + '.w'), need(P, name + '.b'), N, C, s.arch.normEps);
  else D.rmsnormForward(k, out, rstd, inp, need(P, name + '.w'), s.arch.normEps, N, C);
}

/** dinp += the norm's input gradient; its parameters' gradients += (none when G has no entry for them: frozen) */
function normBackward(
  k: Kernels, s: BlockShape, P: BlockTensors, G: BlockTensors, name: string, dinp: Tensor, dout: Tensor, inp: Tensor, mean: Tensor, rstd: Tensor, N: number,
): void {
  const C = s.config.channels;
  const dw = G(name + '.w');
  const w = need(P, name + '.w');
  if (!dw) {
    // frozen (LoRA): the input's gradient alone
    if (s.arch.norm === 'layernorm') k.layernormBackwardInput(dinp.ptr, dout.ptr, inp.ptr, w.ptr, mean.ptr, rstd.ptr, N, C);
    else k.rmsnormBackwardInput(dinp.ptr, dout.ptr, inp.ptr, w.ptr, rstd.ptr, N, C);
    return;
  }
  if (s.arch.norm === 'layernorm') L.layernormBackward(k, dinp, dw, need(G, name + '.b'), dout, inp, w, mean, rstd, N, C);
  else D.rmsnormBackward(k, dinp, dw, dout, inp, w, rstd, N, C);
}

/** The final norm of a stage's head (the same norm as the blocks'). */
export const headNormForward = (k: Kernels, s: BlockShape, P: BlockTensors, out: Tensor, mean: Tensor, rstd: Tensor, inp: Tensor, N: number): void =>
  normForward(k, s, P, 'lnf', out, mean, rstd, inp, N);

export const headNormBackward = (
  k: Kernels, s: BlockShape, P: BlockTensors, G: BlockTensors, dinp: Tensor, dout: Tensor, inp: Tensor, mean: Tensor, rstd: Tensor, N: number,
): void => normBackward(k, s, P, G, 'lnf', dinp, dout, inp, mean, rstd, N);

/** The MLP half: out = res2 + down(act(fc(ln2))), ln2 already normed. */
function mlpForward(
  k: Kernels, s: BlockShape, P: BlockTensors, out: Tensor, res2: Tensor, ln2: Tensor, fch: Tensor, fchAct: Tensor, tmp: Tensor, N: number, lora: BlockLora | null,
): void {
  const C = s.config.channels, w = s.widths;
  loraLinearForward(k, fch, ln2, need(P, 'mlp.fc.w'), P('mlp.fc.b'), N, C, w.fc, lora, 'mlp.fc');
  if (s.arch.mlp === 'gelu') L.geluForward(k, fchAct, fch, N * w.hidden);
  else D.swigluForward(k, fchAct, fch, N, w.hidden);
  loraLinearForward(k, tmp, fchAct, need(P, 'mlp.proj.w'), P('mlp.proj.b'), N, w.hidden, C, lora, 'mlp.proj');
  L.residualForward(k, out, res2, tmp, N * C);
}

/** Block forward on B sequences of T rows (training): a's activations are kept for blockBackward; `lora` adds the block's adapters. */
export function blockForward(k: Kernels, s: BlockShape, P: BlockTensors, a: BlockActs, tmp: Tensor, rope: BlockRope | null, B: number, T: number, lora: BlockLora | null = null): void {
  const { channels: C, heads: NH } = s.config;
  const N = B * T, w = s.widths;
  normForward(k, s, P, 'ln1', a.ln1, a.ln1Mean, a.ln1Rstd, a.input, N);
  loraLinearForward(k, a.qkv, a.ln1, need(P, 'attn.qkv.w'), P('attn.qkv.b'), N, C, w.qkv, lora, 'attn.qkv');
  if (s.classic) {
    L.attentionForward(k, a.atty, a.att, a.qkv, B, T, C, NH);
  } else {
    if (rope) D.ropeForward(k, a.qkv, N, s.heads, rope.positions, rope.table);
    D.gqaAttentionForward(k, a.atty, a.att, a.qkv, B, T, s.heads);
  }
  loraLinearForward(k, tmp, a.atty, need(P, 'attn.proj.w'), P('attn.proj.b'), N, w.attn, C, lora, 'attn.proj');
  L.residualForward(k, a.res2, a.input, tmp, N * C);
  normForward(k, s, P, 'ln2', a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, N);
  mlpForward(k, s, P, a.out, a.res2, a.ln2, a.fch, a.fchAct, tmp, N, lora);
}

/**
 * Block backward of blockForward's pass: x.dres holds d(out) on entry and
 * d(input) on return; parameter gradients accumulate (+=) into G (those G
 * lacks are frozen), the adapters' into their own.
 */
export function blockBackward(
  k: Kernels, s: BlockShape, P: BlockTensors, G: BlockTensors, a: BlockActs, x: BlockScratch, rope: BlockRope | null, B: number, T: number, lora: BlockLora | null = null,
): void {
  const { channels: C, heads: NH } = s.config;
  const N = B * T, w = s.widths;
  // out = res2 + mlp(ln2(res2)): the residual passes dres through unchanged
  loraLinearBackward(k, x.dhidden, G('mlp.proj.w'), G('mlp.proj.b'), x.dres, a.fchAct, need(P, 'mlp.proj.w'), N, w.hidden, C, lora, 'mlp.proj');
  if (s.arch.mlp === 'gelu') L.geluBackward(k, x.dfc, a.fch, x.dhidden, N * w.hidden);
  else D.swigluBackward(k, x.dfc, a.fch, x.dhidden, N, w.hidden);
  loraLinearBackward(k, x.dsmall, G('mlp.fc.w'), G('mlp.fc.b'), x.dfc, a.ln2, need(P, 'mlp.fc.w'), N, C, w.fc, lora, 'mlp.fc');
  normBackward(k, s, P, G, 'ln2', x.dres, x.dsmall, a.res2, a.ln2Mean, a.ln2Rstd, N);
  // res2 = input + proj(attn(ln1(input)))
  loraLinearBackward(k, x.dattn, G('attn.proj.w'), G('attn.proj.b'), x.dres, a.atty, need(P, 'attn.proj.w'), N, w.attn, C, lora, 'attn.proj');
  if (s.classic) {
    L.attentionBackward(k, x.dqkv, x.dattn, a.qkv, a.att, B, T, C, NH);
  } else {
    D.gqaAttentionBackward(k, x.dqkv, x.dattn, a.qkv, a.att, B, T, s.heads);
    if (rope) D.ropeBackward(k, x.dqkv, N, s.heads, rope.positions, rope.table);
  }
  loraLinearBackward(k, x.dsmall, G('attn.qkv.w'), G('attn.qkv.b'), x.dqkv, a.ln1, need(P, 'attn.qkv.w'), N, C, w.qkv, lora, 'attn.qkv');
  normBackward(k, s, P, G, 'ln1', x.dres, x.dsmall, a.input, a.ln1Mean, a.ln1Rstd, N);
}

/** The serving path's buffers for `rows` rows (no activations kept). */
export interface CachedScratch {
  x: Tensor; res2: Tensor; ln: Tensor; mean: Tensor; rstd: Tensor;
  qkv: Tensor; atty: Tensor; tmp: Tensor; fch: Tensor; fchAct: Tensor;
}

export function cachedScratch(s: BlockShape, t: (shape: number[]) => Tensor, R: number): CachedScratch {
  const C = s.config.channels, w = s.widths;
  return {
    x: t([R, C]), res2: t([R, C]), ln: t([R, C]), mean: t([R]), rstd: t([R]),
    qkv: t([R, w.qkv]), atty: t([R, w.attn]), tmp: t([R, C]), fch: t([R, w.fc]), fchAct: t([R, w.hidden]),
  };
}

/**
 * Block forward of `rows` rows of sessions over their KV caches (serving):
 * x ← block(x) in place. `table` holds each row's (cache base, position);
 * `layer` is where this block keeps its keys and values in a session's cache.
 */
export function blockForwardCached(
  k: Kernels, s: BlockShape, P: BlockTensors, x: CachedScratch, table: L.IntBuffer, layer: { keys: number; values: number }, rope: RopeTable | null, rows: number,
): void {
  const { channels: C, heads: NH, contextLength: T } = s.config;
  const w = s.widths;
  normForward(k, s, P, 'ln1', x.ln, x.mean, x.rstd, x.x, rows);
  L.linearForward(k, x.qkv, x.ln, need(P, 'attn.qkv.w'), P('attn.qkv.b'), rows, C, w.qkv);
  if (s.classic) {
    k.kvCacheStore(x.qkv.ptr, table.ptr, rows, layer.keys, layer.values, C, T);
    k.attentionCached(x.atty.ptr, x.qkv.ptr, table.ptr, rows, layer.keys, layer.values, C, NH, T);
  } else {
    D.gqaAttentionCached(k, x.atty, x.qkv, table, rows, layer, s.heads, T, rope);
  }
  L.linearForward(k, x.tmp, x.atty, need(P, 'attn.proj.w'), P('attn.proj.b'), rows, w.attn, C);
  L.residualForward(k, x.res2, x.x, x.tmp, rows * C);
  normForward(k, s, P, 'ln2', x.ln, x.mean, x.rstd, x.res2, rows);
  mlpForward(k, s, P, x.x, x.res2, x.ln, x.fch, x.fchAct, x.tmp, rows, null);
}
