// Verifying a spot check: does a miner's bundle (the weights a forward used,
// the input it received and the output it sent) reproduce what it committed
// to? Hashes against the commitments, weights against what AdamW can move
// since the last merge, then the forward recomputed in fp32 and compared
// (cosine and norm ratio of the activation, or the loss of the last stage),
// against thresholds measured on honest miners. Pure: no state, no I/O.
//
// An MLP classifier's run has one stage (src/model/model-ref.ts): its check
// is a last stage's, the loss of the shard's batch of the SpamAssassin
// features recomputed from the bundle's weights (verifyMlpForward).
import { batchForShard } from '../../data/batches.ts';
import type { ByteCorpus } from '../../data/corpus.ts';
import { spamBatch, type SpamDataset } from '../../data/spam.ts';
import type { Engine } from '../../engine/engine.ts';
import { firstOutOfReach, reach } from '../../model/adamw.ts';
import type { GptConfig } from '../../model/config.ts';
import { GptStage } from '../../model/gpt.ts';
import { partCount } from '../../model/parts.ts';
import { Mlp, type MlpConfig } from '../../model/mlp.ts';
import type { DecodedCheckBundle } from '../../protocol/check-bundle.ts';
import type { Codec } from '../../protocol/codec.ts';

export interface Thresholds {
  /** the recomputed and the sent activation must have at least this cosine similarity */
  minCosine: number;
  /** |‖sent‖ / ‖recomputed‖ − 1| at most this */
  maxNormDeviation: number;
}

/**
 * Per codec of the activation frame, from honest miners measured with
 * `npm run bench -- --only spot-check` (miner: relaxed SIMD, 2 threads;
 * orchestrator: plain SIMD, 1 thread; gpt-tiny half after 60 steps):
 *   f16       1 − cosine ≤ 2.2e-8, |norm ratio − 1| ≤ 4.1e-6
 *   int8-row  1 − cosine ≤ 1.4e-5, |norm ratio − 1| ≤ 5.9e-5
 * Each threshold is 70–500 times what honest miners reach, so rounding on
 * other CPUs does not fail them, while 1% noise (1 − cosine 5e-5) fails at
 * fp16 and weights left at the merged state (1 − cosine 0.66) fail anywhere.
 * A miner on the WebGPU backend (SwiftShader; the same bench) against the
 * same WASM recomputation: f16 1 − cosine ≤ 2.2e-8, |norm ratio − 1| ≤ 4.2e-6,
 * loss ≤ 2.1e-8: the fp16 rounding of the frame hides the backends' own
 * difference (max 1.2e-7 of the activations' scale, docs/webgpu.md), so the
 * same thresholds hold across backends. A hardware GPU's transcendentals
 * (exp, tanh) may round differently; the bench says how far on one.
 */
export const CHECK_THRESHOLDS: Record<Codec, Thresholds> = {
  f32: { minCosine: 0.99999, maxNormDeviation: 1e-3 },
  f16: { minCosine: 0.99999, maxNormDeviation: 1e-3 },
  'int8-row': { minCosine: 0.999, maxNormDeviation: 1e-2 },
  'int8-block': { minCosine: 0.999, maxNormDeviation: 1e-2 },
};
/** The last stage's recomputed loss must be within this relative deviation of the reported one (honest: ≤ 1.6e-8). */
export const MAX_LOSS_DEVIATION = 1e-5;
/**
 * An MLP's recomputed loss must be within `relative` × itself + `absolute` of
 * the reported one. Measured as for the GPT (`npm run bench -- --only
 * spot-check`, miner: relaxed SIMD, 2 threads; orchestrator: plain SIMD, 1
 * thread): the 4096→64→2 spam classifier, batch 64, lr 0.01, 200 batches at
 * each of 0, 20, 200, 1,000 and 2,000 steps: relative deviation ≤ 2.4e-6,
 * absolute ≤ 1.9e-8 (`spot_check.mlp.honest_max_loss_*`), while the loss
 * falls to 8.3e-4. A trained classifier's loss gets that small, where a
 * relative bound alone would be at the mercy of rounding, hence the absolute
 * floor. Both are 40–50 times what honest miners reach; a loss reported 1%
 * off fails once the loss is above 1e-4.
 */
export const MLP_LOSS_TOLERANCE = { relative: 1e-4, absolute: 1e-6 } as const;

/** Sequences of a batch a check of a stage before the last recomputes. */
export const CHECK_ROWS = 2;

export interface CheckOutcome {
  passed: boolean;
  cosine: number | null;
  normRatio: number | null;
  detail: string;
}

/** What the orchestrator knows of one checked forward. */
export interface CheckContext {
  config: GptConfig;
  range: { from: number; to: number };
  batchSize: number;
  seed: number;
  corpus: ByteCorpus | null;
  shard: number;
  codec: Codec;
  lr: number;
  /** the stage's merged weights at the start of the miner's round (null: unknown, not bound) */
  thetaStart: Float32Array | null;
  /** floats [0, decaySize) of the stage's parameters take weight decay */
  decaySize: number;
  maxSamples: number;
  /** committed by the checked miner */
  outputSha: string | null;
  inputSha: string | null;
  loss: number | null;
  /** what the previous stage's miners committed to sending for this microbatch (null: unknown) */
  upstreamShas: string[] | null;
  /**
   * The sequences of the batch to recompute (null: all). Rows are
   * independent until the loss, so a stage before the last is checked on a
   * few sequences drawn after the bundle arrived; the last stage's loss needs
   * them all.
   */
  rows?: number[] | null;
}

/**
 * Verifies a decoded bundle against its context; recomputes the forward on
 * `engine`, in `scratch` when given (a stage of ctx's range and batch size,
 * whose weights are overwritten) or in a stage made for the purpose.
 */
export function verifyForward(engine: Engine, ctx: CheckContext, b: DecodedCheckBundle, scratch?: GptStage): CheckOutcome {
  const fail = (detail: string, cosine: number | null = null, normRatio: number | null = null): CheckOutcome => ({ passed: false, cosine, normRatio, detail });
  const last = ctx.range.to === partCount(ctx.config);
  const first = ctx.range.from === 0;
  if (b.meta.shard !== ctx.shard) return fail(`the bundle is for shard ${b.meta.shard}, the microbatch is shard ${ctx.shard}`);
  if (!first) {
    if (b.inputSha !== ctx.inputSha) return fail('the input frame is not the one the miner reported receiving');
    if (ctx.upstreamShas !== null && !ctx.upstreamShas.includes(b.inputSha ?? '')) return fail('the input frame is not the one the previous stage sent');
  }
  if (!last && b.outputSha !== ctx.outputSha) return fail('the output frame is not the one the miner reported sending');
  const unbound = bindWeights(ctx, b);
  if (unbound) return unbound;
  const T = ctx.config.contextLength;
  const C = ctx.config.channels;
  const rows = last || !ctx.rows ? null : ctx.rows;
  const B = rows ? rows.length : ctx.batchSize;
  if (rows && rows.some((r) => !(Number.isInteger(r) && r >= 0 && r < ctx.batchSize))) throw new RangeError(`rows ${rows.join(',')} outside the batch of ${ctx.batchSize}`);
  if (scratch && (scratch.maxBatch < B || scratch.range.from !== ctx.range.from || scratch.range.to !== ctx.range.to)) throw new RangeError('the scratch stage does not fit the check');
  const stage = scratch ?? new GptStage(engine, ctx.config, ctx.range, { batchSize: B, seed: ctx.seed });
  try {
    stage.params.flat.data.set(b.weights);
    let input: Float32Array | Int32Array;
    let targets: Int32Array | undefined;
    if (first || last) {
      if (!ctx.corpus) return fail('the run data cannot be loaded here');
      const batch = batchForShard(ctx.corpus.train, ctx.seed, ctx.shard, ctx.batchSize, T);
      targets = last ? batch.targets : undefined;
      input = first ? pickRows(batch.inputs, rows, T) : b.input!.data;
    } else input = pickRows(b.input!.data, rows, T * C);
    const out = stage.forward(input, B, T, targets);
    if (last) {
      const loss = out as number;
      if (ctx.loss === null) return fail('no loss was reported for this forward');
      const dev = Math.abs(loss - ctx.loss) / Math.max(Math.abs(loss), 1e-12);
      if (!(dev <= MAX_LOSS_DEVIATION)) return fail(`reported loss ${ctx.loss} vs recomputed ${loss} (relative deviation ${dev.toExponential(2)})`);
      return { passed: true, cosine: null, normRatio: null, detail: `loss deviation ${dev.toExponential(2)}` };
    }
    const { cosine, normRatio } = compare(out as Float32Array, pickRows(b.output!.data, rows, T * C));
    const t = CHECK_THRESHOLDS[ctx.codec];
    if (!(cosine >= t.minCosine) || !(Math.abs(normRatio - 1) <= t.maxNormDeviation)) {
      return fail(`cosine ${cosine.toFixed(6)} (min ${t.minCosine}), norm ratio ${normRatio.toFixed(6)} (max deviation ${t.maxNormDeviation})`, cosine, normRatio);
    }
    return { passed: true, cosine, normRatio, detail: `cosine ${cosine.toFixed(8)}, norm ratio ${normRatio.toFixed(8)}` };
  } finally {
    if (!scratch) stage.release();
  }
}

/** Fails a bundle whose weights are not where its claim says: more inner steps than possible, or weights out of AdamW's reach of the merged state. */
function bindWeights(ctx: Pick<CheckContext, 'maxSamples' | 'thetaStart' | 'decaySize' | 'lr'>, b: DecodedCheckBundle): CheckOutcome | null {
  const fail = (detail: string): CheckOutcome => ({ passed: false, cosine: null, normRatio: null, detail });
  if (b.meta.samples > ctx.maxSamples) return fail(`claims ${b.meta.samples} inner steps since the merge; at most ${ctx.maxSamples} are possible`);
  if (ctx.thetaStart) {
    const at = firstOutOfReach(b.weights, ctx.thetaStart, ctx.decaySize, b.meta.samples, ctx.lr);
    if (at >= 0) {
      const moved = Math.abs(b.weights[at] - ctx.thetaStart[at]);
      return fail(`weight ${at} moved ${moved.toExponential(3)} from the merged state; ${b.meta.samples} AdamW steps move it at most ${reach(ctx.thetaStart[at], at < ctx.decaySize, b.meta.samples, ctx.lr).toExponential(3)}`);
    }
  }
  return null;
}

/** What the orchestrator knows of one checked forward of an MLP classifier (its one stage: the loss). */
export interface MlpCheckContext extends Pick<CheckContext, 'batchSize' | 'seed' | 'shard' | 'lr' | 'thetaStart' | 'decaySize' | 'maxSamples' | 'loss'> {
  config: MlpConfig;
  /** the SpamAssassin features with config.inputs buckets (null: cannot be loaded here) */
  dataset: SpamDataset | null;
}

/**
 * Verifies an MLP classifier's bundle: its shard, its weights bound to the
 * merged state, then the loss of the shard's batch recomputed in fp32 on
 * `engine` (in `scratch` when given: an Mlp of the config taking the batch)
 * within MLP_LOSS_TOLERANCE of the reported one.
 */
export function verifyMlpForward(engine: Engine, ctx: MlpCheckContext, b: DecodedCheckBundle, scratch?: Mlp): CheckOutcome {
  const fail = (detail: string): CheckOutcome => ({ passed: false, cosine: null, normRatio: null, detail });
  if (b.meta.shard !== ctx.shard) return fail(`the bundle is for shard ${b.meta.shard}, the microbatch is shard ${ctx.shard}`);
  if (b.input || b.output) return fail('an MLP is one stage: its bundle has no activation frames');
  const unbound = bindWeights(ctx, b);
  if (unbound) return unbound;
  if (!ctx.dataset) return fail('the run data cannot be loaded here');
  if (ctx.loss === null) return fail('no loss was reported for this forward');
  if (scratch && (scratch.maxBatch < ctx.batchSize || scratch.layout.size !== b.weights.length)) throw new RangeError('the scratch MLP does not fit the check');
  const mlp = scratch ?? new Mlp(engine, ctx.config, ctx.batchSize, ctx.seed);
  try {
    mlp.params.flat.data.set(b.weights);
    const batch = spamBatch(ctx.dataset, ctx.seed, ctx.shard, ctx.batchSize);
    const loss = mlp.forward(batch.x, batch.B, batch.y) as number;
    const dev = Math.abs(loss - ctx.loss);
    const allowed = MLP_LOSS_TOLERANCE.relative * Math.abs(loss) + MLP_LOSS_TOLERANCE.absolute;
    if (!(dev <= allowed)) return fail(`reported loss ${ctx.loss} vs recomputed ${loss} (deviation ${dev.toExponential(2)}, at most ${allowed.toExponential(2)})`);
    return { passed: true, cosine: null, normRatio: null, detail: `loss deviation ${dev.toExponential(2)}` };
  } finally {
    if (!scratch) mlp.release();
  }
}

/** The given sequences (each `width` values) of a batch, or the batch itself. */
function pickRows<A extends Float32Array | Int32Array>(data: A, rows: number[] | null, width: number): A {
  if (!rows) return data;
  const out = new (data.constructor as { new (n: number): A })(rows.length * width);
  rows.forEach((r, i) => out.set(data.subarray(r * width, (r + 1) * width), i * width));
  return out;
}

/** Cosine similarity of `sent` to `recomputed`, and ‖sent‖ / ‖recomputed‖ (float64 sums). */
export function compare(recomputed: Float32Array, sent: Float32Array): { cosine: number; normRatio: number } {
  let dot = 0;
  let a2 = 0;
  let b2 = 0;
  for (let i = 0; i < recomputed.length; i++) {
    dot += recomputed[i] * sent[i];
    a2 += recomputed[i] * recomputed[i];
    b2 += sent[i] * sent[i];
  }
  if (a2 === 0 && b2 === 0) return { cosine: 1, normRatio: 1 };
  if (a2 === 0 || b2 === 0) return { cosine: 0, normRatio: a2 === 0 ? Infinity : 0 };
  return { cosine: dot / Math.sqrt(a2 * b2), normRatio: Math.sqrt(b2 / a2) };
}

