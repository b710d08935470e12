// Spot checks: the orchestrator recomputes a random sample of each miner's
// forwards and compares them with what the miner sent.
//
// 1. Commit. Every forward report carries the sha256 of the activation frame
//    the miner sent (outputSha) and received (inputSha); the last stage's
//    report carries its loss. They are stored (forward_commits).
// 2. Select. Each reported forward is checked with probability `rate`
//    (default 2%), drawn with a CSPRNG after the commitment arrived; the
//    heartbeat reply that acknowledges the report names it.
// 3. Prove. The miner uploads a bundle (src/protocol/check-bundle.ts): the
//    weights the forward used, the input frame it received, the output frame
//    it sent. A miner that does not answer within `timeoutMs` fails.
// 4. Verify. Output and input frames must hash to the commitments (the input
//    also to what the previous stage committed to sending); the weights must
//    lie within what AdamW can move in the inner steps since the last merge
//    from the stage's merged state; then the stage's forward is recomputed in
//    fp32 and compared: cosine similarity and norm ratio of the activation,
//    relative deviation of the loss. Thresholds per codec, from measuring
//    honest miners (docs/chain.md, `npm run bench -- --only spot-check`).
// A failed check is logged as 'failed_check' work (a penalty in scoring);
// past `slashAfter` failed checks in an epoch the miner's stake is slashed.
import { randomInt } from 'node:crypto';
import { loadCorpus, type ByteCorpus } from '../data/corpus.ts';
import { batchForShard } from '../data/batches.ts';
import { Engine } from '../engine/engine.ts';
import { ADAMW_DEFAULTS } from '../model/adamw.ts';
import { loadStageFrom } from '../model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../model/config.ts';
import { GptStage, rangeParamCount } from '../model/gpt.ts';
import { decodeSafetensors } from '../model/safetensors.ts';
import { decodeCheckBundle, type DecodedCheckBundle } from '../protocol/check-bundle.ts';
import type { Codec } from '../protocol/codec.ts';
import type { WorkReport } from '../protocol/messages.ts';
import type { BlobStore } from './blobs.ts';
import type { OrchestratorDb, RunRow, SpotCheckRow } from './db.ts';
import { CoordinatorError } from './errors.ts';

export interface SpotCheckOptions {
  /** share of forwards checked (0 disables) */
  rate: number;
  /** a check not answered within this long fails */
  timeoutMs: number;
  /** failed checks in one epoch after which the stake is slashed */
  slashAfter: number;
  /** share of the stake slashed */
  slashFraction: number;
}

export const SPOT_CHECK_DEFAULTS: SpotCheckOptions = { rate: 0.02, timeoutMs: 60_000, slashAfter: 3, slashFraction: 0.1 };

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
 * Most an AdamW step can move one weight, in units of lr: |m̂/√v̂| ≤
 * (1−β1)/√(1−β2) · (1 − β1²/β2)^(−1/2) ≈ 7.27 for β = (0.9, 0.999) by
 * Cauchy–Schwarz over the moment sums; 7.5 leaves room for the decay term.
 */
export const ADAM_STEP_BOUND = 7.5;

/** Recomputation stages and merged states kept between checks. */
const CACHE_ENTRIES = 4;
/** Sequences of a batch a check of a stage before the last recomputes. */
export const CHECK_ROWS = 2;

/** `k` distinct sequence indices in [0, n), drawn with a CSPRNG, ascending. */
function sampleRows(n: number, k: number): number[] {
  const picked = new Set<number>();
  while (picked.size < k) picked.add(randomInt(n));
  return [...picked].sort((a, b) => a - b);
}

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
  const last = ctx.range.to === ctx.config.layers + 2;
  const first = ctx.range.from === 0;
  if (b.meta.shard !== ctx.shard) return fail(`the bundle is for shard ${b.meta.shard}, the microbatch is shard ${ctx.shard}`);
  if (!first) {
    if (b.inputSha !== ctx.inputSha) return fail('the input frame is not the one the miner reported receiving');
    if (ctx.upstreamShas !== null && !ctx.upstreamShas.includes(b.inputSha ?? '')) return fail('the input frame is not the one the previous stage sent');
  }
  if (!last && b.outputSha !== ctx.outputSha) return fail('the output frame is not the one the miner reported sending');
  if (b.meta.samples > ctx.maxSamples) return fail(`claims ${b.meta.samples} inner steps since the merge; at most ${ctx.maxSamples} are possible`);
  if (ctx.thetaStart) {
    const bound = (b.meta.samples * ctx.lr * ADAM_STEP_BOUND) * (1 + ADAMW_DEFAULTS.weightDecay) + 1e-6;
    let worst = 0;
    let at = -1;
    for (let i = 0; i < b.weights.length; i++) {
      const d = Math.abs(b.weights[i] - ctx.thetaStart[i]);
      if (d > worst) {
        worst = d;
        at = i;
      }
    }
    if (worst > bound) return fail(`weight ${at} moved ${worst.toExponential(3)} from the merged state; ${b.meta.samples} AdamW steps move it at most ${bound.toExponential(3)}`);
  }
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

/** Selection, answers and expiry of spot checks, on the orchestrator's database. */
export class SpotChecks {
  readonly options: SpotCheckOptions;
  private engine: Promise<Engine> | null = null;
  private readonly corpora = new Map<string, ByteCorpus | null>();
  /** recomputation stages by model/range/batch, and merged states by run/stage/round: a few of each */
  private readonly stages = new Map<string, GptStage>();
  private readonly thetas = new Map<string, Float32Array | null>();
  private expiredAt = -Infinity;

  constructor(
    private readonly db: OrchestratorDb,
    private readonly blobs: BlobStore,
    options: Partial<SpotCheckOptions> = {},
    private readonly now: () => number = Date.now,
  ) {
    this.options = { ...SPOT_CHECK_DEFAULTS, ...options };
    const o = this.options;
    if (!(o.rate >= 0 && o.rate <= 1)) throw new RangeError(`check rate must be in [0, 1], got ${o.rate}`);
    if (!(o.slashFraction >= 0 && o.slashFraction <= 1)) throw new RangeError(`slash fraction must be in [0, 1], got ${o.slashFraction}`);
    if (!Number.isInteger(o.slashAfter) || o.slashAfter < 1) throw new RangeError(`slashAfter must be a positive integer, got ${o.slashAfter}`);
  }

  /** Records a forward's commitment; returns true when it is selected for a check. Call inside the report's transaction. */
  onForward(run: RunRow, minerId: string, r: WorkReport): boolean {
    const now = this.now();
    this.db.putForwardCommit({ microbatch: r.microbatch, stage: r.stage, miner_id: minerId, output_sha: r.outputSha ?? null, input_sha: r.inputSha ?? null, loss: r.loss ?? null, at: now });
    const rate = this.options.rate;
    if (rate <= 0 || randomInt(1_000_000) >= rate * 1_000_000) return false;
    this.db.insertSpotCheck({ run_id: run.id, microbatch: r.microbatch, stage: r.stage, miner_id: minerId, created_at: now });
    return true;
  }

  /** Checks nobody answered in time fail; old commitments are let go. At most once a second. */
  expire(): void {
    const now = this.now();
    if (now - this.expiredAt < 1000) return;
    this.expiredAt = now;
    for (const c of this.db.checksAskedBefore(now - this.options.timeoutMs)) this.decide(c, { passed: false, cosine: null, normRatio: null, detail: 'not answered in time' });
    this.db.deleteForwardCommitsBefore(now - Math.max(10 * 60_000, 2 * this.options.timeoutMs));
  }

  /** A miner's answer to a check: validates and verifies it, records the outcome. */
  async submit(minerId: string, runId: string, microbatch: number, bytes: Uint8Array): Promise<CheckOutcome & { status: SpotCheckRow['status'] }> {
    const check = this.db.askedCheck(minerId, runId, microbatch);
    if (!check) throw new CoordinatorError(409, `no open spot check of microbatch ${microbatch} in run ${runId} for this miner`);
    const run = this.db.run(runId)!;
    const stageRow = this.db.stages(runId)[check.stage];
    const mb = this.db.microbatch(microbatch);
    const config = gptConfig(run.model);
    const range = { from: stageRow.from_part, to: stageRow.to_part };
    const opts = JSON.parse(run.options) as { codec: Codec; lr: number };
    const paramCount = rangeParamCount(config, range);
    const bundle = decodeCheckBundle(bytes, {
      paramCount,
      activationShape: [run.batch_size * config.contextLength, config.channels],
      hasInput: range.from > 0,
      hasOutput: range.to < config.layers + 2,
      maxBytes: 64 + paramCount * 4 + 2 * (1 << 26),
    });
    const m = bundle.meta;
    if (m.runId !== runId || m.microbatch !== microbatch || m.stage !== check.stage) {
      throw new CoordinatorError(400, `bundle is for run ${m.runId} microbatch ${m.microbatch} stage ${m.stage}; the check is ${runId} ${microbatch} stage ${check.stage}`);
    }
    const own = this.db.forwardCommits(microbatch, check.stage).find((c) => c.miner_id === minerId);
    const upstream = check.stage > 0 ? this.db.forwardCommits(microbatch, check.stage - 1) : [];
    const ctx: CheckContext = {
      config,
      range,
      batchSize: run.batch_size,
      seed: run.seed,
      corpus: range.from === 0 || range.to === config.layers + 2 ? this.corpus(run.data) : null,
      shard: mb?.shard ?? -1,
      codec: opts.codec,
      lr: opts.lr,
      thetaStart: await this.thetaStart(run, check.stage, m.round, range),
      maxSamples: 4 * run.merge_every + 64,
      outputSha: own?.output_sha ?? null,
      inputSha: own?.input_sha ?? null,
      loss: own?.loss ?? null,
      upstreamShas: upstream.length ? upstream.map((c) => c.output_sha).filter((x): x is string => x !== null) : null,
    };
    const last = range.to === config.layers + 2;
    if (!last && run.batch_size > CHECK_ROWS) ctx.rows = sampleRows(run.batch_size, CHECK_ROWS);
    const engine = await this.engineReady();
    const outcome = verifyForward(engine, ctx, bundle, this.scratchStage(engine, run, range, ctx.rows?.length ?? run.batch_size));
    return { ...outcome, status: this.decide(check, outcome) };
  }

  private decide(check: SpotCheckRow, o: CheckOutcome): SpotCheckRow['status'] {
    const now = this.now();
    const status = o.passed ? 'passed' : 'failed';
    this.db.tx(() => {
      this.db.decideCheck(check.id, { status, decided_at: now, cosine: o.cosine, norm_ratio: o.normRatio, detail: o.detail.slice(0, 500) });
      if (!o.passed) this.db.logWork(check.miner_id, check.run_id, 'failed_check', 1, now, check.stage, `spot check of microbatch ${check.microbatch}: ${o.detail}`.slice(0, 500));
    });
    return status;
  }

  /** A stage to recompute in, kept for the next checks of the same shape. */
  private scratchStage(engine: Engine, run: RunRow, range: { from: number; to: number }, batchSize: number): GptStage {
    const key = `${run.model}/${range.from}/${range.to}/${batchSize}`;
    let s = this.stages.get(key);
    if (!s) {
      s = new GptStage(engine, gptConfig(run.model), range, { batchSize, seed: run.seed });
      remember(this.stages, key, s, (old) => old.release());
    }
    return s;
  }

  /** The stage's weights after merge round `round` (the initial weights for round 0); null when not kept. */
  private async thetaStart(run: RunRow, stage: number, round: number, range: { from: number; to: number }): Promise<Float32Array | null> {
    const key = `${run.id}/${stage}/${round}`;
    if (this.thetas.has(key)) return this.thetas.get(key)!;
    const theta = await this.loadThetaStart(run, stage, round, range);
    if (theta) remember(this.thetas, key, theta);
    return theta;
  }

  private async loadThetaStart(run: RunRow, stage: number, round: number, range: { from: number; to: number }): Promise<Float32Array | null> {
    const config = gptConfig(run.model);
    let blob: string | null = null;
    if (round > 0) {
      blob = this.db.mergeRound(run.id, stage, round)?.state_blob ?? null;
      const s = this.db.stages(run.id)[stage];
      if (!blob && s.round === round) blob = s.state_blob;
      if (!blob) return null;
    }
    const engine = await this.engineReady();
    const g = new GptStage(engine, config, range, { batchSize: 1, seed: run.seed });
    try {
      if (blob) loadStageFrom(g, decodeSafetensors(await this.blobs.get(blob)));
      return g.params.flat.data.slice();
    } finally {
      g.release();
    }
  }

  private corpus(spec: string): ByteCorpus | null {
    if (!this.corpora.has(spec)) {
      try {
        this.corpora.set(spec, loadCorpus(spec));
      } catch {
        this.corpora.set(spec, null);
      }
    }
    return this.corpora.get(spec)!;
  }

  private engineReady(): Promise<Engine> {
    return (this.engine ??= Engine.create({ threads: 1 }));
  }

  async close(): Promise<void> {
    for (const s of this.stages.values()) s.release();
    this.stages.clear();
    this.thetas.clear();
    if (this.engine) await (await this.engine).close();
    this.engine = null;
  }
}

/** Keeps at most CACHE_ENTRIES entries in `map`, dropping the oldest. */
function remember<T>(map: Map<string, T>, key: string, value: T, drop?: (old: T) => void): void {
  map.set(key, value);
  while (map.size > CACHE_ENTRIES) {
    const [oldKey, old] = map.entries().next().value!;
    map.delete(oldKey);
    drop?.(old);
  }
}
