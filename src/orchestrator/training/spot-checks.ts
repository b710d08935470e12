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
// A failed check is an offence (src/orchestrator/rewards/offences.ts): 'failed_check'
// work (a penalty in scoring) and, on a paid network, a slash.
import { randomInt } from 'node:crypto';
import type { Engine } from '../../engine/engine.ts';
import { GptStage } from '../../model/gpt.ts';
import { Mlp } from '../../model/mlp.ts';
import { gptConfigOf, modelParts, parseModelRef, rangeParams, type ModelRef } from '../../model/model-ref.ts';
import { decodeCheckBundle } from '../../protocol/check-bundle.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { remember } from '../cache.ts';
import { CHECK_ROWS, verifyForward, verifyMlpForward, type CheckContext, type CheckOutcome } from './spot-check-verify.ts';
import type { Offences } from '../rewards/offences.ts';
import { RunData } from './run-data.ts';
import type { StageStates } from './stage-states.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { HopClaim } from '../state/claims.ts';
import type { RunRecord } from '../state/runs.ts';
import type { SpotCheckRecord } from '../state/spot-checks.ts';

export interface SpotCheckOptions {
  /** share of forwards checked (0 disables) */
  rate: number;
  /** a check not answered within this long fails */
  timeoutMs: number;
}

export const SPOT_CHECK_DEFAULTS: SpotCheckOptions = { rate: 0.02, timeoutMs: 60_000 };

/** How long after it is asked a check is decided at the latest, and slashed: the unstake cooldown must be longer. */
export function slashWindowMs(o: Pick<SpotCheckOptions, 'timeoutMs'>): number {
  return 2 * o.timeoutMs + 60_000;
}

/** Recomputation stages kept between checks. */
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
  /** recomputation stages (a GPT's) or models (an MLP's) by model/range/batch: a few */
  private readonly stages = new Map<string, GptStage | Mlp>();
  private expiredAt = -Infinity;

  constructor(
    private readonly state: OrchestratorState,
    /** the merged states weights are bound against */
    private readonly stageStates: StageStates,
    /** the orchestrator's engine, for recomputation */
    private readonly engine: () => Promise<Engine>,
    /** where a failed check is charged */
    private readonly offences: Offences,
    options: Partial<SpotCheckOptions> = {},
    private readonly now: () => number = Date.now,
    /** the runs' data (corpora, the spam features); the default reads no uploaded dataset */
    private readonly data: RunData = new RunData(),
  ) {
    this.options = { ...SPOT_CHECK_DEFAULTS, ...options };
    const o = this.options;
    if (!(o.rate >= 0 && o.rate <= 1)) throw new RangeError(`check rate must be in [0, 1], got ${o.rate}`);
  }

  /** A forward was claimed (its commitment is the claim): true when it is selected for a check. Call inside the claim's transaction. */
  onForward(run: RunRecord, claim: HopClaim): boolean {
    const rate = this.options.rate;
    if (rate <= 0 || randomInt(1_000_000) >= rate * 1_000_000) return false;
    this.state.spotChecks.ask({ runId: run.id, microbatch: claim.microbatch, attempt: claim.attempt, stage: claim.stage, minerId: claim.minerId, createdAt: this.now() });
    return true;
  }

  /**
   * The microbatches of `minerId`'s open checks, for its heartbeat reply: every
   * reply names them all until they are answered, and each check's timeout
   * starts with the first reply that named it.
   */
  deliver(minerId: string): number[] {
    const open = this.state.spotChecks.openOf(minerId);
    this.state.spotChecks.markDelivered(open.filter((c) => c.deliveredAt === null).map((c) => c.id), this.now());
    return [...new Set(open.map((c) => c.microbatch))];
  }

  /** After a restart: open checks get their whole timeout again (nobody could answer while the orchestrator was down). */
  restarted(): void {
    this.state.spotChecks.restartTimeouts(this.now());
  }

  /** Checks not answered within the timeout of their delivery fail. At most once a second. */
  expire(): void {
    const now = this.now();
    if (now - this.expiredAt < 1000) return;
    this.expiredAt = now;
    for (const c of this.state.spotChecks.deliveredBefore(now - this.options.timeoutMs)) this.decide(c, { passed: false, cosine: null, normRatio: null, detail: 'not answered in time' }, false);
  }

  /** A miner's answer to a check: validates and verifies it, records the outcome. */
  async submit(minerId: string, runId: string, microbatch: number, bytes: Uint8Array): Promise<CheckOutcome & { status: SpotCheckRecord['status'] }> {
    const check = this.state.spotChecks.asked(minerId, runId, microbatch);
    if (!check) throw new NimbleError('conflict', `no open spot check of microbatch ${microbatch} in run ${runId} for this miner`);
    const run = this.state.runs.get(runId)!;
    const stageRow = this.state.runs.stage(runId, check.stage)!;
    const mb = this.state.microbatches.get(microbatch);
    const model = parseModelRef(run.model);
    const range = { from: stageRow.fromPart, to: stageRow.toPart };
    const paramCount = rangeParams(model, range);
    const bundle = decodeCheckBundle(bytes, {
      paramCount,
      activationShape: model.kind === 'gpt' ? [run.batchSize * model.config.contextLength, model.config.channels] : [run.batchSize, model.config.inputs],
      hasInput: range.from > 0,
      hasOutput: range.to < modelParts(model),
      maxBytes: 64 + paramCount * 4 + 2 * (1 << 26),
    });
    const m = bundle.meta;
    if (m.runId !== runId || m.microbatch !== microbatch || m.stage !== check.stage) {
      throw new NimbleError('invalid', `bundle is for run ${m.runId} microbatch ${m.microbatch} stage ${m.stage}; the check is ${runId} ${microbatch} stage ${check.stage}`);
    }
    const own = this.state.claims.ofHop(microbatch, check.attempt, check.stage, 'forward').find((c) => c.minerId === minerId);
    const upstream = check.stage > 0 ? this.state.claims.ofHop(microbatch, check.attempt, check.stage - 1, 'forward') : [];
    // the weights are bound to the round the miner was in when it claimed the forward; any other round fails
    if (!own || m.round !== own.round) {
      const outcome: CheckOutcome = { passed: false, cosine: null, normRatio: null, detail: own ? `the bundle claims round ${m.round}; the forward was claimed in round ${own.round}` : 'no claim of this forward is kept' };
      return { ...outcome, status: this.decide(check, outcome) };
    }
    const start = await this.stageStates.at(run, check.stage, own.round);
    if (!start) {
      const outcome: CheckOutcome = { passed: false, cosine: null, normRatio: null, detail: `the merged state of round ${own.round} is not kept` };
      return { ...outcome, status: this.decide(check, outcome) };
    }
    const engine = await this.engine();
    if (model.kind === 'mlp') {
      const mlp = { config: model.config, dataset: await this.data.spamDataset(model.config.inputs), batchSize: run.batchSize, seed: run.seed, shard: mb?.shard ?? -1, lr: run.options.lr };
      const bound = { thetaStart: start.weights, decaySize: start.decaySize, maxSamples: 4 * run.mergeEvery + 64, loss: own.loss ?? null };
      const outcome = verifyMlpForward(engine, { ...mlp, ...bound }, bundle, this.scratchMlp(engine, model, run));
      return { ...outcome, status: this.decide(check, outcome) };
    }
    const config = model.config;
    const ctx: CheckContext = {
      config,
      range,
      batchSize: run.batchSize,
      seed: run.seed,
      corpus: range.from === 0 || range.to === modelParts(model) ? await this.data.corpus(run.data) : null,
      shard: mb?.shard ?? -1,
      codec: run.options.codec,
      lr: run.options.lr,
      thetaStart: start.weights,
      decaySize: start.decaySize,
      maxSamples: 4 * run.mergeEvery + 64,
      outputSha: own?.outputSha ?? null,
      inputSha: own?.inputSha ?? null,
      loss: own?.loss ?? null,
      upstreamShas: upstream.length ? upstream.map((c) => c.outputSha).filter((x): x is string => x !== null) : null,
    };
    const last = range.to === modelParts(model);
    if (!last && run.batchSize > CHECK_ROWS) ctx.rows = sampleRows(run.batchSize, CHECK_ROWS);
    const outcome = verifyForward(engine, ctx, bundle, this.scratchStage(engine, run, range, ctx.rows?.length ?? run.batchSize));
    return { ...outcome, status: this.decide(check, outcome) };
  }

  /** Records the outcome; a failure is an offence, which evicts the miner unless the check was merely left unanswered (`evict` false). */
  private decide(check: SpotCheckRecord, o: CheckOutcome, evict = true): SpotCheckRecord['status'] {
    const now = this.now();
    const status = o.passed ? 'passed' : 'failed';
    this.state.tx(() => {
      this.state.spotChecks.decide(check.id, { status, cosine: o.cosine, normRatio: o.normRatio, detail: o.detail }, now);
      if (o.passed) return;
      this.offences.charge(
        {
          minerId: check.minerId,
          runId: check.runId,
          stage: check.stage,
          kind: 'failed_check',
          detail: `spot check of microbatch ${check.microbatch}: ${o.detail}`,
          key: `spot check ${check.runId}/${check.id}: microbatch ${check.microbatch} stage ${check.stage}`,
          checkId: check.id,
          evict,
        },
        now,
      );
    });
    return status;
  }

  /** A stage to recompute in, kept for the next checks of the same shape. */
  private scratchStage(engine: Engine, run: RunRecord, range: { from: number; to: number }, batchSize: number): GptStage {
    const key = `${run.model}/${range.from}/${range.to}/${batchSize}`;
    const kept = this.stages.get(key);
    if (kept instanceof GptStage) return kept;
    const s = new GptStage(engine, gptConfigOf(run.model), range, { batchSize, seed: run.seed });
    remember(this.stages, key, s, CACHE_ENTRIES, (old) => old.release());
    return s;
  }

  /** An MLP to recompute an MLP run's loss in, kept for the next checks of the same model and batch. */
  private scratchMlp(engine: Engine, model: Extract<ModelRef, { kind: 'mlp' }>, run: RunRecord): Mlp {
    const key = `${model.ref}/${run.batchSize}`;
    const kept = this.stages.get(key);
    if (kept instanceof Mlp) return kept;
    const mlp = new Mlp(engine, model.config, run.batchSize, run.seed);
    remember(this.stages, key, mlp, CACHE_ENTRIES, (old) => old.release());
    return mlp;
  }

  /** Releases the recomputation stages (before the engine closes). */
  close(): void {
    for (const s of this.stages.values()) s.release();
    this.stages.clear();
  }
}
