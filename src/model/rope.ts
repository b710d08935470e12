// Rotary position embeddings' frequencies: the inverse frequency of each of a
// head's headDim/2 rotating pairs, from rope_theta and rope_scaling as
// Hugging Face transformers computes them (modeling_rope_utils.py:
// _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters), and the cos/sin table the RoPE kernels read
// (assembly/decoder.ts).
//
// transformers computes in float32 tensors; so does this, step by step
// (Math.fround after each operation, python scalars cast to float32 as torch
// casts them, and `scalar / tensor` as torch's reciprocal-then-multiply), so
// the frequencies agree with PyTorch's to the rounding of its pow.
// The table's angles are float32 products pos · invFreq (the float32 matmul of
// LlamaRotaryEmbedding.forward); their cos and sin are taken in double and
// rounded once.
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import type { RopeScaling } from './arch.ts';

const f = Math.fround;

/** What the frequencies depend on (a DecoderConfig has these fields). */
export interface RopeParams {
  headDim: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
}

/** inv_freq[i] = 1 / theta^(2i / headDim), i < headDim/2 (rope_type "default"). */
function defaultInvFreq(headDim: number, theta: number): Float32Array {
  const half = headDim / 2;
  const out = new Float32Array(half);
  const base = f(theta);
  for (let i = 0; i < half; i++) out[i] = f(1 / f(Math.pow(base, f((2 * i) / headDim))));
  return out;
}

/** rope_type "llama3": long wavelengths slowed by `factor`, short ones kept, a smooth blend between. */
function llama3InvFreq(inv: Float32Array, s: Extract<RopeScaling, { kind: 'llama3' }>): Float32Array {
  const factor = f(s.factor);
  const low = f(s.lowFreqFactor);
  const old = f(s.originalContextLength);
  const lowWavelen = f(s.originalContextLength / s.lowFreqFactor);
  const highWavelen = f(s.originalContextLength / s.highFreqFactor);
  const span = f(s.highFreqFactor - s.lowFreqFactor);
  const twoPi = f(2 * Math.PI);
  return inv.map((x) => {
    const wavelen = f(f(1 / x) * twoPi);
    const scaled = wavelen > lowWavelen ? f(x / factor) : x;
    if (wavelen < highWavelen || wavelen > lowWavelen) return scaled;
    const smooth = f(f(f(f(1 / wavelen) * old) - low) / span);
    return f(f(f(f(1 - smooth) * scaled) / factor) + f(smooth * scaled));
  });
}

/** The inverse frequencies (headDim/2 float32s) of a config's rotary embeddings. */
export function ropeInvFreq(p: RopeParams): Float32Array {
  const { headDim, ropeTheta, ropeScaling } = p;
  if (!(Number.isInteger(headDim) && headDim > 0 && headDim % 2 === 0)) throw new RangeError(`rope: headDim ${headDim} must be a positive even integer`);
  if (!(ropeTheta > 0)) throw new RangeError(`rope: ropeTheta ${ropeTheta} must be positive`);
  const inv = defaultInvFreq(headDim, ropeTheta);
  if (ropeScaling === null) return inv;
  if (ropeScaling.kind === 'linear') return inv.map((x) => f(x / f(ropeScaling.factor)));
  return llama3InvFreq(inv, ropeScaling);
}

/**
 * The kernels' table for positions 0..positions−1: per position p, headDim
 * floats: cos(p · invFreq[i]) for i < headDim/2, then sin(p · invFreq[i]).
 */
export function ropeCosSin(invFreq: Float32Array, positions: number): Float32Array {
  const half = invFreq.length, D = 2 * half;
  const out = new Float32Array(positions * D);
  for (let p = 0; p < positions; p++) {
    const pos = f(p);
    for (let i = 0; i < half; i++) {
      const angle = f(pos * invFreq[i]);
      out[p * D + i] = Math.cos(angle);
      out[p * D + half + i] = Math.sin(angle);
    }
  }
  return out;
}

/** A cos/sin table in the engine's memory, for positions 0..positions−1 of heads of headDim. */
export interface RopeTable {
  tensor: Tensor;
  headDim: number;
  positions: number;
}

/** Builds a config's table in the engine memory (positions: the context length served or trained). Free `tensor` when done. */
export function createRopeTable(engine: Engine, p: RopeParams, positions: number): RopeTable {
  if (!(Number.isInteger(positions) && positions > 0)) throw new RangeError(`rope: positions ${positions} must be a positive integer`);
  const tensor = engine.tensorFrom([positions, p.headDim], ropeCosSin(ropeInvFreq(p), positions));
  return { tensor, headDim: p.headDim, positions };
}
