// Runs causal attention forward and backward on the WASM kernels and on the
// GPU with the same inputs, and compares both with the exact values and with
// each other against the bounds of attention-bound.ts: the check that the GPU
// attention computes what the WASM one does (tests, the bench, later a
// miner's self-check).
import type { Engine } from '../engine.ts';
import { attentionStatsLength, attentionWidths, gqaShapeOf, type AnyAttentionShape, type GpuAttention } from './attention.ts';
import { attentionReference, compareWithin, type AttentionInputs, type AttentionReference, type BoundComparison } from './attention-bound.ts';
import { readArray, uploadArray, type GpuArray } from './buffers.ts';

/** What a backend computed: the forward output, the attention matrix (WASM layout) and dqkv. */
export interface AttentionOutputs {
  out: Float32Array;
  /** B×H×T×T: the WASM forward's saved matrix; on the GPU, `probs` from the stats */
  att: Float32Array;
  dqkv: Float32Array;
}

export interface GpuAttentionOutputs extends AttentionOutputs {
  /** B×H×T×2: each row's softmax max and sum */
  stats: Float32Array;
}

/** qkv and dout uniform in [−amplitude, amplitude). */
export function attentionInputs(s: AnyAttentionShape, random: () => number, amplitude = 1): AttentionInputs {
  const fill = (n: number): Float32Array => Float32Array.from({ length: n }, () => (random() * 2 - 1) * amplitude);
  const w = attentionWidths(s);
  return { qkv: fill(s.B * s.T * w.qkv), dout: fill(s.B * s.T * w.out) };
}

/**
 * Forward then backward on the WASM kernels: Kernels.attentionForward /
 * attentionBackward for a multi-head shape, gqaAttentionForward /
 * gqaAttentionBackward for a grouped-query one.
 */
export function runWasmAttention(engine: Engine, s: AnyAttentionShape, inputs: AttentionInputs): AttentionOutputs {
  const { B, T, H, KV, D } = gqaShapeOf(s), w = attentionWidths(s);
  const qkv = engine.tensorFrom([B * T * w.qkv], inputs.qkv), dout = engine.tensorFrom([B * T * w.out], inputs.dout);
  const out = engine.tensor([B * T * w.out]), att = engine.tensor([B * H * T * T]), dqkv = engine.tensor([B * T * w.qkv]);
  const k = engine.kernels;
  try {
    if ('NH' in s) {
      k.attentionForward(out.ptr, att.ptr, qkv.ptr, B, T, s.C, s.NH);
      k.attentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, s.C, s.NH);
    } else {
      k.gqaAttentionForward(out.ptr, att.ptr, qkv.ptr, B, T, H, KV, D);
      k.gqaAttentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, H, KV, D);
    }
    return { out: out.data.slice(), att: att.data.slice(), dqkv: dqkv.data.slice() };
  } finally {
    for (const t of [qkv, dout, out, att, dqkv]) engine.free(t);
  }
}

/**
 * Forward, probs and backward on the GPU (the backward from the forward's out
 * and stats); reads all back. The outputs start as NaN, so that an element a
 * kernel fails to write (or adds to instead of writing) fails any comparison.
 */
export async function runGpuAttention(device: GPUDevice, attention: GpuAttention, s: AnyAttentionShape, inputs: AttentionInputs): Promise<GpuAttentionOutputs> {
  const { B, T, H } = gqaShapeOf(s), w = attentionWidths(s);
  const qkv = uploadArray(device, inputs.qkv), dout = uploadArray(device, inputs.dout);
  const nan = (n: number): GpuArray => uploadArray(device, new Float32Array(n).fill(NaN));
  const out = nan(B * T * w.out), stats = nan(attentionStatsLength(s)), att = nan(B * H * T * T), dqkv = nan(B * T * w.qkv);
  try {
    attention.forward({ ...s, qkv, out, stats });
    attention.probs({ ...s, qkv, stats, att });
    attention.backward({ ...s, dqkv, dout, qkv, out, stats });
    return { out: await readArray(device, out), att: await readArray(device, att), dqkv: await readArray(device, dqkv), stats: await readArray(device, stats) };
  } finally {
    for (const x of [qkv, dout, out, stats, att, dqkv]) x.destroy();
  }
}

/** Comparisons of the forward output, att and dqkv. */
export interface AttentionComparison {
  out: BoundComparison;
  att: BoundComparison;
  dqkv: BoundComparison;
}

/**
 * `a` against `b` within factor·E element by element: factor 1 for one
 * backend against the exact values, 2 for two backends against each other.
 */
export function compareAttention(ref: AttentionReference, a: AttentionOutputs | AttentionReference, b: AttentionOutputs | AttentionReference, factor: number): AttentionComparison {
  return {
    out: compareWithin(a.out, b.out, ref.outBound, factor),
    att: compareWithin(a.att, b.att, ref.attBound, factor),
    dqkv: compareWithin(a.dqkv, b.dqkv, ref.dqkvBound, factor),
  };
}

/** GPU against WASM, and each against the exact values, on one random case. */
export interface AttentionCrosscheck {
  gpuWasm: AttentionComparison;
  gpuExact: AttentionComparison;
  wasmExact: AttentionComparison;
}

/** Checks `s` on inputs uniform in [−amplitude, amplitude). */
export async function crosscheckAttention(engine: Engine, device: GPUDevice, attention: GpuAttention, s: AnyAttentionShape, random: () => number, amplitude = 1): Promise<AttentionCrosscheck> {
  const inputs = attentionInputs(s, random, amplitude);
  const ref = attentionReference(s, inputs);
  const gpu = await runGpuAttention(device, attention, s, inputs);
  const wasm = runWasmAttention(engine, s, inputs);
  return { gpuWasm: compareAttention(ref, gpu, wasm, 2), gpuExact: compareAttention(ref, gpu, ref, 1), wasmExact: compareAttention(ref, wasm, ref, 1) };
}
