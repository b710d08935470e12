// The cross-build probe (docs/inference.md, "Spot checks of inference": "Two
// kernel builds"). Miners run one of two WASM kernel builds, relaxed SIMD
// (fused multiply-add) or plain SIMD, which round differently, and the
// orchestrator cannot tell which a miner runs. For ordinary weights the
// difference is far inside the spot checks' thresholds (1 − cosine ~1e-14 on
// gpt-micro), but a model can be built to blow it up: huge opposing weights
// (+A and −A on two copies of one hidden unit) cancel exactly in real
// arithmetic and leave each build's own rounding, ~A × 6e-8, which a
// normalization after them turns into whatever deviation A asks for. Honest
// miners of the build the orchestrator does not run would then fail their
// checks and be slashed.
//
// So before a model is deployed its parts are run under both builds on a few
// synthetic prompts: for every stage a deployment could cut it into (every
// range [from, to) of parts), the two builds start from the same input and
// the worst row's 1 − cosine and |norm ratio − 1| between them is measured.
// That range's check thresholds are the training checks' (CHECK_THRESHOLDS)
// or MARGIN × the measured deviation, whichever is looser; a model for which
// some range would need thresholds looser than SEPARABLE (a check that lets
// ~10% noise through separates nothing) is refused at deploy, with the range
// and the deviation named.
//
// The probe samples a few prompts, and a model can be built to blow up only
// on others: the checks therefore also replay a window that fails on the
// orchestrator's build on the other build (./check-verify.ts), and pass an
// answer that matches either. The probe's thresholds bound what rounding
// other than the two builds' (another CPU's) may add.
import { Engine } from '../../engine/engine.ts';
import { inferenceFromCheckpoint } from '../../inference/load.ts';
import type { StageInference } from '../../inference/stage-inference.ts';
import { partCount } from '../../model/parts.ts';
import { decodeSafetensors } from '../../model/safetensors.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { BuildProbeStore } from '../state/build-probes.ts';
import { CHECK_THRESHOLDS, compare, type Thresholds } from '../training/spot-check-verify.ts';

/** A range's thresholds are at least this many times the deviation the two builds showed on it. */
export const MARGIN = 10;
/** The loosest thresholds a check may have and still catch a cheat (noise of ~10% on an answer: 1 − cosine ≈ 5e-3). */
export const SEPARABLE: Thresholds = { minCosine: 1 - 5e-3, maxNormDeviation: 0.1 };
/** Prompts probed, and the rows of each: a prefill, then single-row decode steps. */
export const PROBE_PROMPTS = 3;
const PREFILL_ROWS = 8;
const DECODE_STEPS = 3;

/** The worst deviation between the two builds on one range of parts. */
export interface RangeDeviation {
  from: number;
  to: number;
  /** the largest 1 − cosine of a row */
  oneMinusCosine: number;
  /** the largest |norm ratio − 1| of a row */
  normDeviation: number;
}

export interface BuildProbeResult {
  sha256: string;
  /** every range [from, to) of parts */
  ranges: RangeDeviation[];
  /** the range that deviates most (by 1 − cosine) */
  worst: RangeDeviation;
  /** why the model is refused (null: it deploys) */
  refused: string | null;
}

/** The deterministic prompts: token ids spread over the vocabulary, one list of rows per step. */
function probeSteps(vocab: number, context: number, prompt: number): Int32Array[] {
  const rows = Math.min(PREFILL_ROWS, Math.max(1, context - DECODE_STEPS));
  const total = Math.min(context, rows + DECODE_STEPS);
  let x = (prompt * 2654435761 + 12345) >>> 0;
  const ids = Int32Array.from({ length: total }, () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % vocab);
  const steps = [ids.subarray(0, rows)];
  for (let i = rows; i < total; i++) steps.push(ids.subarray(i, i + 1));
  return steps;
}

/** Worst row deviation of `b` from `a` (rows of `width`). */
function deviation(a: Float32Array, b: Float32Array, width: number): { oneMinusCosine: number; normDeviation: number } {
  let oneMinusCosine = 0;
  let normDeviation = 0;
  for (let r = 0; r < a.length / width; r++) {
    const { cosine, normRatio } = compare(a.subarray(r * width, (r + 1) * width), b.subarray(r * width, (r + 1) * width));
    const dev = Math.abs(normRatio - 1);
    oneMinusCosine = Math.max(oneMinusCosine, Number.isFinite(cosine) ? 1 - cosine : 2);
    normDeviation = Math.max(normDeviation, Number.isFinite(dev) ? dev : Infinity);
  }
  return { oneMinusCosine, normDeviation };
}

/** The thresholds a range's checks use, given what the probe measured on it. */
export function thresholdsFor(d: Pick<RangeDeviation, 'oneMinusCosine' | 'normDeviation'>): Thresholds {
  const base = CHECK_THRESHOLDS.f16;
  return { minCosine: Math.min(base.minCosine, 1 - MARGIN * d.oneMinusCosine), maxNormDeviation: Math.max(base.maxNormDeviation, MARGIN * d.normDeviation) };
}

/**
 * Runs every part of the model file `bytes` under engine `a`'s build and
 * engine `b`'s, on PROBE_PROMPTS prompts, and measures each range of parts.
 * `pause` runs between steps (the caller's event loop).
 */
export async function probeBuilds(sha256: string, bytes: Uint8Array, a: Engine, b: Engine, pause: () => Promise<void> = () => Promise.resolve()): Promise<BuildProbeResult> {
  const file = decodeSafetensors(bytes);
  const parts: { a: StageInference; b: StageInference }[] = [];
  try {
    const first = inferenceFromCheckpoint(a, file, { from: 0, to: 1 }, { maxSessions: 1 });
    parts.push({ a: first, b: inferenceFromCheckpoint(b, file, { from: 0, to: 1 }, { maxSessions: 1 }) });
    const config = first.config;
    const P = partCount(config);
    for (let p = 1; p < P; p++) parts.push({ a: inferenceFromCheckpoint(a, file, { from: p, to: p + 1 }, { maxSessions: 1 }), b: inferenceFromCheckpoint(b, file, { from: p, to: p + 1 }, { maxSessions: 1 }) });
    const worst = new Map<string, RangeDeviation>();
    for (let prompt = 0; prompt < PROBE_PROMPTS; prompt++) {
      const steps = probeSteps(config.vocabSize, config.contextLength, prompt);
      // the input each part gets on build a's run from the prompt: what a stage starting there is sent
      const inputs: (Int32Array | Float32Array)[][] = [steps];
      for (let from = 0; from < P; from++) {
        // both builds from the same input at `from`, part after part: the deviation at `to` is the range [from, to)'s
        let xa: (Int32Array | Float32Array)[] = inputs[from];
        let xb: (Int32Array | Float32Array)[] = inputs[from];
        for (let p = from; p < P; p++) {
          const width = p === P - 1 ? config.vocabSize : config.channels;
          const ya = await runSteps(parts[p].a, xa, pause);
          const yb = await runSteps(parts[p].b, xb, pause);
          if (from === 0 && p + 1 < P) inputs.push(ya);
          for (let i = 0; i < ya.length; i++) {
            const d = deviation(ya[i], yb[i] as Float32Array, width);
            const key = `${from}/${p + 1}`;
            const w = worst.get(key) ?? { from, to: p + 1, oneMinusCosine: 0, normDeviation: 0 };
            w.oneMinusCosine = Math.max(w.oneMinusCosine, d.oneMinusCosine);
            w.normDeviation = Math.max(w.normDeviation, d.normDeviation);
            worst.set(key, w);
          }
          xa = ya;
          xb = yb;
        }
      }
    }
    const ranges = [...worst.values()];
    const bad = ranges.find((r) => {
      const t = thresholdsFor(r);
      return t.minCosine < SEPARABLE.minCosine || t.maxNormDeviation > SEPARABLE.maxNormDeviation;
    });
    const refused = bad
      ? `honest miners on the two kernel builds (relaxed and plain SIMD) answer parts [${bad.from}, ${bad.to}) of this model up to 1 − cosine ${bad.oneMinusCosine.toExponential(2)}, norm ratio deviation ${bad.normDeviation.toExponential(2)} apart on the deploy probe's prompts: a spot check loose enough to pass them (at most 1 − cosine ${(1 - SEPARABLE.minCosine).toExponential(0)}, ${SEPARABLE.maxNormDeviation.toExponential(0)}) would not catch a miner that changes its answers, so the model cannot be served with checks (weights that cancel each other before a normalization do this)`
      : null;
    return resultOf(sha256, ranges, refused);
  } finally {
    for (const p of parts) {
      p.a.release();
      p.b.release();
    }
  }
}

/** A probe's result from its ranges (the worst: the one that deviates most by 1 − cosine). */
function resultOf(sha256: string, ranges: RangeDeviation[], refused: string | null): BuildProbeResult {
  const worst = ranges.reduce((m, r) => (r.oneMinusCosine > m.oneMinusCosine ? r : m), ranges[0]);
  return { sha256, ranges, worst, refused };
}

/** One session's steps on a one-part stage, from an empty cache. */
async function runSteps(stage: StageInference, inputs: readonly (Int32Array | Float32Array)[], pause: () => Promise<void>): Promise<Float32Array[]> {
  stage.join('probe');
  try {
    const out: Float32Array[] = [];
    for (const input of inputs) {
      out.push(stage.run([{ session: 'probe', input }]));
      await pause();
    }
    return out;
  } finally {
    stage.leave('probe');
  }
}

/** The engine of the kernel build `primary` does not run (null: this runtime has only one). */
export async function otherBuildEngine(primary: Engine): Promise<Engine | null> {
  try {
    return await Engine.create({ threads: 1, simd: primary.relaxedSimd ? 'plain' : 'relaxed' });
  } catch {
    return null;
  }
}

export interface BuildProbeDeps {
  /** the model store's files */
  blobs: BlobStore;
  /** where probes are kept across restarts (../state/build-probes.ts; absent: in memory only, as in tests of the probe alone) */
  store?: BuildProbeStore;
  /** the orchestrator's verification engine (the build its checks replay on) */
  engine: () => Promise<Engine>;
  log?: (line: string) => void;
  pause?: () => Promise<void>;
}

/** The largest model file probed (an imported model of gigabytes is not: see make). */
export const PROBE_MAX_BYTES = 256 << 20;

/** Probes kept (by model file). */
const KEPT = 64;

/**
 * The probes of the models deployed here, made once per model file (at
 * deploy, or by the first check of a model deployed before) and kept in the
 * state: after a restart a deployment's checks have the same thresholds and
 * its model is not probed again. What the checks' thresholds for a range
 * are, and whether a model may deploy.
 */
export class BuildProbes {
  private readonly done = new Map<string, Promise<BuildProbeResult | null>>();
  private other: Promise<Engine | null> | null = null;
  private readonly log: (line: string) => void;
  private readonly pause: () => Promise<void>;

  constructor(private readonly deps: BuildProbeDeps) {
    this.log = deps.log ?? (() => {});
    this.pause = deps.pause ?? (() => new Promise((r) => setImmediate(r)));
  }

  /** The engine of the build the orchestrator's checks do not run (null: none on this runtime). */
  otherEngine(): Promise<Engine | null> {
    return (this.other ??= this.deps.engine().then(otherBuildEngine));
  }

  /** The probe of a model file (null: it could not be made here, one build only or the file unreadable). */
  probe(sha256: string): Promise<BuildProbeResult | null> {
    let p = this.done.get(sha256);
    if (!p) {
      p = this.make(sha256);
      this.done.set(sha256, p);
      if (this.done.size > KEPT) this.done.delete(this.done.keys().next().value!);
    }
    return p;
  }

  /** Refuses a model the checks cannot separate honest miners of the two builds from cheats on. */
  async checkDeployable(sha256: string, name: string): Promise<void> {
    const r = await this.probe(sha256);
    if (r?.refused) throw new NimbleError('unstable_model', `model ${sha256.slice(0, 12)} ('${name}') is refused: ${r.refused}`, 422);
  }

  /** The thresholds of a check of parts [from, to) of a model file: the training checks', or the probe's where looser. */
  async thresholds(sha256: string, from: number, to: number): Promise<Thresholds> {
    const r = await this.probe(sha256);
    const d = r?.ranges.find((x) => x.from === from && x.to === to);
    return d ? thresholdsFor(d) : CHECK_THRESHOLDS.f16;
  }

  /** Releases the other build's engine. */
  async close(): Promise<void> {
    const e = await this.other;
    this.other = null;
    await e?.close();
  }

  private async make(sha256: string): Promise<BuildProbeResult | null> {
    const kept = this.deps.store?.get(sha256);
    if (kept) return resultOf(kept.sha256, kept.ranges, kept.refused);
    try {
      const [a, b] = [await this.deps.engine(), await this.otherEngine()];
      if (!b) {
        this.log(`build probe of ${sha256.slice(0, 12)}: this runtime has one kernel build only; the checks keep their thresholds`);
        return null;
      }
      const size = (await this.deps.blobs.size(sha256)) ?? 0;
      if (size > PROBE_MAX_BYTES) {
        // every part of the model under both builds, held at once: past this the probe would cost the orchestrator the model
        // twice over in memory and minutes of a deploy request
        this.log(`build probe of ${sha256.slice(0, 12)}: not probed (${size} bytes, more than ${PROBE_MAX_BYTES}); its checks keep their thresholds and replay a failing step on the other build`);
        return null;
      }
      const bytes = await this.deps.blobs.get(sha256);
      const t0 = Date.now();
      const r = await probeBuilds(sha256, bytes, a, b, this.pause);
      this.deps.store?.put(r, Date.now());
      const t = thresholdsFor(r.worst);
      this.log(
        `build probe of ${sha256.slice(0, 12)}: ${r.ranges.length} ranges of parts in ${Date.now() - t0} ms, worst [${r.worst.from}, ${r.worst.to}) 1 − cosine ${r.worst.oneMinusCosine.toExponential(2)}, norm ratio deviation ${r.worst.normDeviation.toExponential(2)}: ` +
          (r.refused ? 'REFUSED' : `its checks at least 1 − cosine ${(1 - t.minCosine).toExponential(2)}, norm deviation ${t.maxNormDeviation.toExponential(2)}`),
      );
      return r;
    } catch (err) {
      this.done.delete(sha256);
      this.log(`build probe of ${sha256.slice(0, 12)} failed: ${(err as Error).message}`);
      return null;
    }
  }
}
