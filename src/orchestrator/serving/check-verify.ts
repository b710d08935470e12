// Verifying a recorded inference window (./check-recorder.ts): its steps
// replayed, in order, on a StageInference holding the published weights of
// the window's stage, each answer compared with what the miner sent. Pure
// apart from the stage it runs on: no state, no I/O.
//
// The bound. The stage kernels are deterministic (docs/inference.md,
// "Numerics"): on the miner's kernel build an honest miner's f32 answer is
// the replay's bit for bit, and an f16 frame is the replay rounded by the
// same encoder, bit for bit too; such a step is `exact`. A miner on the other
// build (plain SIMD against relaxed SIMD with fused multiply-add: the
// orchestrator cannot tell which a miner runs) rounds differently, so a step
// that is not exact passes when each row is within the thresholds the
// training spot checks use for f32 and f16 activations (./spot-check-verify.ts,
// CHECK_THRESHOLDS: 1 − cosine ≤ 1e-5 and |norm ratio − 1| ≤ 1e-3, while
// honest miners across the two builds measured 1 − cosine ≤ 2.2e-8 and
// |norm ratio − 1| ≤ 4.1e-6). Rows are compared one by one, so a row
// changed in a long prefill is not averaged away; a miner adding 1% noise
// to its activations fails (1 − cosine ≈ 5e-5).
//
// Two builds. A model can make the builds' rounding differ by far more than
// that (./build-probe.ts: huge opposing weights before a normalization), so
// a window's thresholds are its deployment's, set by the probe at deploy
// (never tighter than the ones above), and a step that fails on the
// orchestrator's build is replayed on the other build as well (`other`: the
// same stage loaded on the other engine, caught up from the window's start
// only when a step is not exact): an answer that is exact on, or within the
// thresholds of, either replay passes. An honest miner of either build is
// never failed.
import type { StageInference } from '../../inference/stage-inference.ts';
import { decodeFrame, encodeFrame } from '../../protocol/frame.ts';
import type { RecordedWindow } from './check-recorder.ts';
import { CHECK_THRESHOLDS, compare, type Thresholds } from '../training/spot-check-verify.ts';

export interface WindowOutcome {
  passed: boolean;
  /** steps replayed (all of them unless one failed) */
  steps: number;
  /** of which bitwise equal to the replay (f32, or once rounded to f16) */
  exact: number;
  /** the lowest cosine of a row that was not exact (null: every step exact, or none compared) */
  minCosine: number | null;
  /** the largest |norm ratio − 1| of a row that was not exact */
  maxNormDeviation: number | null;
  /** steps that passed only against the other build's replay */
  otherBuild: number;
  detail: string;
}

export interface VerifyOptions {
  /** the window's thresholds (default: the training checks' for f16) */
  thresholds?: Thresholds;
  /** the same stage on the other kernel build, with room for one more session (null: none) */
  other?: StageInference | null;
  /** runs between two steps (the caller yields to its event loop there) */
  pause?: () => Promise<void>;
}

/** A window that cannot be replayed here (its inputs do not fit the stage): not the miner's fault, nothing is decided. */
export class UncheckableError extends Error {
  override readonly name = 'UncheckableError';
}

/** f16's thresholds (f32's are the same): a frame of either codec is held to them. */
const T = CHECK_THRESHOLDS.f16;

/** The values an f16 frame of `x` decodes to (the encoder the miners use). */
export function roundedToF16(x: Float32Array): Float32Array {
  return decodeFrame(encodeFrame(x, [x.length], 'f16')).data;
}

function equal(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** How one step's answer compares with the replay. */
export interface StepComparison {
  exact: 'f32' | 'f16' | null;
  minCosine: number;
  maxNormDeviation: number;
  /** the first row outside the thresholds (-1: none) */
  badRow: number;
}

/** Compares `sent` with `recomputed`, rows of `width` values, against thresholds `t`. */
export function compareStep(recomputed: Float32Array, sent: Float32Array, width: number, t: Thresholds = T): StepComparison {
  if (recomputed.length !== sent.length || width <= 0 || recomputed.length % width !== 0) throw new RangeError(`compareStep: ${sent.length} values sent, ${recomputed.length} recomputed, rows of ${width}`);
  if (equal(recomputed, sent)) return { exact: 'f32', minCosine: 1, maxNormDeviation: 0, badRow: -1 };
  if (equal(roundedToF16(recomputed), sent)) return { exact: 'f16', minCosine: 1, maxNormDeviation: 0, badRow: -1 };
  let minCosine = 1;
  let maxNormDeviation = 0;
  let badRow = -1;
  for (let r = 0; r < recomputed.length / width; r++) {
    const { cosine, normRatio } = compare(recomputed.subarray(r * width, (r + 1) * width), sent.subarray(r * width, (r + 1) * width));
    const dev = Math.abs(normRatio - 1);
    minCosine = Math.min(minCosine, cosine);
    maxNormDeviation = Math.max(maxNormDeviation, Number.isFinite(dev) ? dev : Infinity);
    if (badRow < 0 && !(cosine >= t.minCosine && dev <= t.maxNormDeviation)) badRow = r;
  }
  return { exact: null, minCosine, maxNormDeviation, badRow };
}

/** Token ids from a stage-0 input frame's values; throws UncheckableError for anything else. */
function tokens(input: Float32Array, vocab: number): Int32Array {
  const out = new Int32Array(input.length);
  for (let i = 0; i < input.length; i++) {
    const t = input[i];
    if (!(Number.isInteger(t) && t >= 0 && t < vocab)) throw new UncheckableError(`token ${t} at ${i} is outside the vocabulary of ${vocab}`);
    out[i] = t;
  }
  return out;
}

/** A replay of a window's steps on one stage, in its own session. */
class Replay {
  /** steps run so far */
  at = 0;
  private joined = false;
  constructor(private readonly stage: StageInference, private readonly session: string) {}

  /** The output of step `i`, running the steps up to it (an input outside the stage's shape is the replay's fault). */
  upTo(w: RecordedWindow, i: number): Float32Array {
    if (!this.joined) {
      try {
        this.stage.join(this.session);
      } catch (err) {
        throw new UncheckableError(`the replay stage has no room: ${(err as Error).message}`);
      }
      this.joined = true;
    }
    const V = this.stage.config.vocabSize;
    let out: Float32Array | null = null;
    for (; this.at <= i; this.at++) {
      const step = w.steps[this.at];
      try {
        out = this.stage.run([{ session: this.session, input: this.stage.isFirst ? tokens(step.input, V) : step.input }]);
      } catch (err) {
        if (err instanceof UncheckableError) throw err;
        throw new UncheckableError(`step ${this.at} cannot be replayed: ${(err as Error).message}`);
      }
    }
    // the relay let through only frames of the stage's shape: a mismatch is this replay's, not the miner's
    if (!out || out.length !== w.steps[i].output.length) throw new UncheckableError(`step ${i}: ${w.steps[i].output.length} values recorded, the replay gives ${out?.length ?? 'nothing'}`);
    return out;
  }

  leave(): void {
    if (this.joined) this.stage.leave(this.session);
  }
}

/**
 * Replays `w` on `stage` (the window's stage range of the published model,
 * with room for one more session) and compares every answer; a step that
 * fails is compared with `options.other`'s replay too. Throws
 * UncheckableError when the window cannot be replayed on this stage.
 */
export async function verifyWindow(stage: StageInference, w: RecordedWindow, options: VerifyOptions | (() => Promise<void>) = {}): Promise<WindowOutcome> {
  const o: VerifyOptions = typeof options === 'function' ? { pause: options } : options;
  const pause = o.pause ?? (() => Promise.resolve());
  const t = o.thresholds ?? T;
  const width = stage.isLast ? stage.config.vocabSize : stage.config.channels;
  let exact = 0;
  let otherBuild = 0;
  let minCosine: number | null = null;
  let maxNormDeviation: number | null = null;
  if (w.steps.length === 0) throw new UncheckableError('the window has no step');
  const mine = new Replay(stage, `check-${w.seq}`);
  const other = o.other ? new Replay(o.other, `check-${w.seq}-other`) : null;
  try {
    for (let i = 0; i < w.steps.length; i++) {
      if (i > 0) await pause();
      const step = w.steps[i];
      let c = compareStep(mine.upTo(w, i), step.output, width, t);
      if (!c.exact && c.badRow >= 0 && other) {
        const alt = compareStep(other.upTo(w, i), step.output, width, t);
        if (alt.exact || alt.badRow < 0) {
          otherBuild++;
          c = alt;
        }
      }
      if (c.exact) {
        exact++;
        continue;
      }
      minCosine = Math.min(minCosine ?? 1, c.minCosine);
      maxNormDeviation = Math.max(maxNormDeviation ?? 0, c.maxNormDeviation);
      if (c.badRow >= 0) {
        const rows = step.output.length / width;
        const detail = `step ${i} of ${w.steps.length} (${rows} rows): row ${c.badRow} is off the recomputation${other ? ' on both kernel builds' : ''}: min cosine ${c.minCosine.toFixed(6)} (at least ${t.minCosine}), norm ratio deviation ${c.maxNormDeviation.toExponential(2)} (at most ${t.maxNormDeviation})`;
        return { passed: false, steps: i + 1, exact, minCosine, maxNormDeviation, otherBuild, detail };
      }
    }
  } finally {
    mine.leave();
    other?.leave();
  }
  const n = w.steps.length;
  const also = otherBuild > 0 ? `, ${otherBuild} matching the other kernel build's recomputation` : '';
  const detail = exact === n ? `${n} steps, each bitwise equal to the recomputation${also}` : `${n} steps, ${exact} bitwise equal, the others within the thresholds (min cosine ${minCosine!.toFixed(8)}, norm ratio deviation ${maxNormDeviation!.toExponential(2)})${also}`;
  return { passed: true, steps: n, exact, minCosine, maxNormDeviation, otherBuild, detail };
}
