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
import { Engine } from '../engine/engine.ts';
import { loadStageFrom } from '../model/checkpoint.ts';
import { gptConfig } from '../model/config.ts';
import { GptStage, partCount, rangeParamCount } from '../model/gpt.ts';
import { decodeSafetensors } from '../model/safetensors.ts';
import { decodeCheckBundle } from '../protocol/check-bundle.ts';
import { NimbleError } from '../protocol/errors.ts';
import type { WorkReport } from '../protocol/messages.ts';
import type { BlobStore } from './blobs.ts';
import { CHECK_ROWS, verifyForward, type CheckContext, type CheckOutcome } from './spot-check-verify.ts';
import type { OrchestratorState } from './state/index.ts';
import type { RunRecord } from './state/runs.ts';
import type { SpotCheckRecord } from './state/spot-checks.ts';

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

/** Recomputation stages and merged states kept between checks. */
const CACHE_ENTRIES = 4;

/** `k` distinct sequence indices in [0, n), drawn with a CSPRNG, ascending. */
function sampleRows(n: number, k: number): number[] {
  const picked = new Set<number>();
  while (picked.size < k) picked.add(randomInt(n));
  return [...picked].sort((a, b) => a - b);
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
    private readonly state: OrchestratorState,
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
  onForward(run: RunRecord, minerId: string, r: WorkReport): boolean {
    const now = this.now();
    this.state.spotChecks.putCommit({ microbatch: r.microbatch, stage: r.stage, minerId, outputSha: r.outputSha ?? null, inputSha: r.inputSha ?? null, loss: r.loss ?? null, at: now });
    const rate = this.options.rate;
    if (rate <= 0 || randomInt(1_000_000) >= rate * 1_000_000) return false;
    this.state.spotChecks.ask({ runId: run.id, microbatch: r.microbatch, stage: r.stage, minerId, createdAt: now });
    return true;
  }

  /** Checks nobody answered in time fail; old commitments are let go. At most once a second. */
  expire(): void {
    const now = this.now();
    if (now - this.expiredAt < 1000) return;
    this.expiredAt = now;
    for (const c of this.state.spotChecks.askedBefore(now - this.options.timeoutMs)) this.decide(c, { passed: false, cosine: null, normRatio: null, detail: 'not answered in time' });
    this.state.spotChecks.deleteCommitsBefore(now - Math.max(10 * 60_000, 2 * this.options.timeoutMs));
  }

  /** A miner's answer to a check: validates and verifies it, records the outcome. */
  async submit(minerId: string, runId: string, microbatch: number, bytes: Uint8Array): Promise<CheckOutcome & { status: SpotCheckRecord['status'] }> {
    const check = this.state.spotChecks.asked(minerId, runId, microbatch);
    if (!check) throw new NimbleError('conflict', `no open spot check of microbatch ${microbatch} in run ${runId} for this miner`);
    const run = this.state.runs.get(runId)!;
    const stageRow = this.state.runs.stage(runId, check.stage)!;
    const mb = this.state.microbatches.get(microbatch);
    const config = gptConfig(run.model);
    const range = { from: stageRow.fromPart, to: stageRow.toPart };
    const paramCount = rangeParamCount(config, range);
    const bundle = decodeCheckBundle(bytes, {
      paramCount,
      activationShape: [run.batchSize * config.contextLength, config.channels],
      hasInput: range.from > 0,
      hasOutput: range.to < partCount(config),
      maxBytes: 64 + paramCount * 4 + 2 * (1 << 26),
    });
    const m = bundle.meta;
    if (m.runId !== runId || m.microbatch !== microbatch || m.stage !== check.stage) {
      throw new NimbleError('invalid', `bundle is for run ${m.runId} microbatch ${m.microbatch} stage ${m.stage}; the check is ${runId} ${microbatch} stage ${check.stage}`);
    }
    const own = this.state.spotChecks.commits(microbatch, check.stage).find((c) => c.minerId === minerId);
    const upstream = check.stage > 0 ? this.state.spotChecks.commits(microbatch, check.stage - 1) : [];
    const ctx: CheckContext = {
      config,
      range,
      batchSize: run.batchSize,
      seed: run.seed,
      corpus: range.from === 0 || range.to === partCount(config) ? this.corpus(run.data) : null,
      shard: mb?.shard ?? -1,
      codec: run.options.codec,
      lr: run.options.lr,
      thetaStart: await this.thetaStart(run, check.stage, m.round, range),
      maxSamples: 4 * run.mergeEvery + 64,
      outputSha: own?.outputSha ?? null,
      inputSha: own?.inputSha ?? null,
      loss: own?.loss ?? null,
      upstreamShas: upstream.length ? upstream.map((c) => c.outputSha).filter((x): x is string => x !== null) : null,
    };
    const last = range.to === partCount(config);
    if (!last && run.batchSize > CHECK_ROWS) ctx.rows = sampleRows(run.batchSize, CHECK_ROWS);
    const engine = await this.engineReady();
    const outcome = verifyForward(engine, ctx, bundle, this.scratchStage(engine, run, range, ctx.rows?.length ?? run.batchSize));
    return { ...outcome, status: this.decide(check, outcome) };
  }

  private decide(check: SpotCheckRecord, o: CheckOutcome): SpotCheckRecord['status'] {
    const now = this.now();
    const status = o.passed ? 'passed' : 'failed';
    this.state.tx(() => {
      this.state.spotChecks.decide(check.id, { status, cosine: o.cosine, normRatio: o.normRatio, detail: o.detail }, now);
      if (!o.passed) this.state.ledger.logWork({ minerId: check.minerId, runId: check.runId, kind: 'failed_check', stage: check.stage, detail: `spot check of microbatch ${check.microbatch}: ${o.detail}` }, now);
    });
    return status;
  }

  /** A stage to recompute in, kept for the next checks of the same shape. */
  private scratchStage(engine: Engine, run: RunRecord, range: { from: number; to: number }, batchSize: number): GptStage {
    const key = `${run.model}/${range.from}/${range.to}/${batchSize}`;
    let s = this.stages.get(key);
    if (!s) {
      s = new GptStage(engine, gptConfig(run.model), range, { batchSize, seed: run.seed });
      remember(this.stages, key, s, (old) => old.release());
    }
    return s;
  }

  /** The stage's weights after merge round `round` (the initial weights for round 0); null when not kept. */
  private async thetaStart(run: RunRecord, stage: number, round: number, range: { from: number; to: number }): Promise<Float32Array | null> {
    const key = `${run.id}/${stage}/${round}`;
    if (this.thetas.has(key)) return this.thetas.get(key)!;
    const theta = await this.loadThetaStart(run, stage, round, range);
    if (theta) remember(this.thetas, key, theta);
    return theta;
  }

  private async loadThetaStart(run: RunRecord, stage: number, round: number, range: { from: number; to: number }): Promise<Float32Array | null> {
    const config = gptConfig(run.model);
    let blob: string | null = null;
    if (round > 0) {
      blob = this.state.mergeRounds.get({ runId: run.id, stage, round })?.stateBlob ?? null;
      const s = this.state.runs.stage(run.id, stage);
      if (!blob && s?.round === round) blob = s.stateBlob;
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
