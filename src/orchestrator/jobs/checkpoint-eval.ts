// Held-out figures of a job's whole-model checkpoints, measured by the
// orchestrator when it keeps one (src/orchestrator/jobs/jobs.ts) and recorded in
// the checkpoint's metadata and row (docs/jobs.md, "Checkpoints and
// retention"). This evaluates what the network trained; it trains nothing.
//
// - A GPT: the mean cross-entropy of the next byte over EVAL_BATCHES batches
//   of the run's corpus' held-out tail, drawn as `heldoutLoss` of
//   src/train/local.ts draws them (batchForShard(heldout, HELDOUT_SEED, i,
//   rows, context)), so every checkpoint of a run is measured on the same
//   bytes. `rows` is the run's batch size, fewer when EVAL_MACS would be
//   passed.
// - An MLP classifier: the mean cross-entropy and the accuracy over the
//   first rows of the held-out split of its data (the whole split when
//   EVAL_MACS allows: the spam classifier's 1,257 messages).
//
// Cost, on one thread of the orchestrator's engine (forward only), measured
// through this class on a 2-core machine (median of 5; about 3,700 tokens/s
// for gpt-small, 19,000 for gpt-tiny): gpt-small evaluates 1,024 tokens (4
// batches of 2 sequences at any batch size from 2) in 0.28 s; gpt-tiny at batch 12 3,072 tokens in 0.16 s; gpt-micro at batch
// 12 768 tokens in 5 ms; the spam classifier (mlp:4096-64-2) its 1,257
// held-out messages in 23 ms. The first evaluation of a run also loads its
// data (for the classifier, the 1.4 s feature build, in slices). Evaluations
// run one at a time, in the background task that keeps a checkpoint,
// yielding to the event loop between batches (the loop is held for one
// batch at most: 70 ms for gpt-small), so heartbeats are served meanwhile.
import { batchForShard } from '../../data/batches.ts';
import type { SpamSplit } from '../../data/spam.ts';
import type { Engine } from '../../engine/engine.ts';
import { loadModelParams } from '../../model/checkpoint.ts';
import { GptStage } from '../../model/gpt.ts';
import { Mlp } from '../../model/mlp.ts';
import { modelParts, parseModelRef, rangeParams, type ModelRef } from '../../model/model-ref.ts';
import { decodeSafetensors, type SafetensorsFile } from '../../model/safetensors.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { remember } from '../cache.ts';
import type { AssembledCheckpoint } from '../training/checkpoint.ts';
import type { RunData } from '../training/run-data.ts';
import type { RunRecord } from '../state/runs.ts';

/** Held-out batches a GPT checkpoint is measured on. */
export const EVAL_BATCHES = 4;
/** The seed the held-out batches are drawn with (`heldoutLoss`'s default). */
export const HELDOUT_SEED = 424242;
/** Multiply-adds one evaluation may take, counted as parameters × tokens (or examples). */
export const EVAL_MACS = 6e9;
/** Rows an MLP is evaluated on at once. */
const MLP_CHUNK = 256;
/** Evaluation models kept between checkpoints (by model and rows). */
const MODEL_ENTRIES = 2;

/** What an evaluation measured. */
export interface HeldoutFigures {
  /** mean cross-entropy (nats) over the held-out tokens (a GPT) or examples (an MLP) evaluated */
  loss: number;
  /** an MLP's: the fraction of the held-out examples evaluated classified correctly; null for a GPT */
  accuracy: number | null;
  /** tokens (a GPT) or examples (an MLP) evaluated */
  items: number;
  /** wall time of the evaluation, yields included */
  ms: number;
}

/** What an evaluation needs of a run. */
export type EvalRun = Pick<RunRecord, 'model' | 'batchSize' | 'data'>;

/** Sequences per held-out batch for a GPT of `params` parameters and context `contextLength` trained at `batchSize`. */
export function gptEvalRows(params: number, contextLength: number, batchSize: number): number {
  return Math.max(1, Math.min(batchSize, Math.floor(EVAL_MACS / (EVAL_BATCHES * contextLength * params))));
}

/** Held-out examples an MLP of `params` parameters is evaluated on, of a split of `rows`. */
export function mlpEvalRows(params: number, rows: number): number {
  return Math.max(1, Math.min(rows, Math.floor(EVAL_MACS / params)));
}

/** The checkpoint metadata that records the figures: `heldoutLoss`, and `heldoutTokens` (a GPT) or `heldoutAccuracy` and `heldoutExamples` (an MLP). */
export function heldoutMetadata(f: HeldoutFigures | null): Record<string, string> {
  if (!f) return {};
  if (f.accuracy === null) return { heldoutLoss: String(f.loss), heldoutTokens: String(f.items) };
  return { heldoutLoss: String(f.loss), heldoutAccuracy: String(f.accuracy), heldoutExamples: String(f.items) };
}

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Measures checkpoints on held-out data, one at a time, on the orchestrator's engine. */
export class CheckpointEvaluator {
  /** evaluation models (a GPT's whole-model stage, or an MLP) by model/rows */
  private readonly models = new Map<string, GptStage | Mlp>();
  /** the evaluation running or last queued: the next one starts after it */
  private tail: Promise<unknown> = Promise.resolve();
  private closed = false;

  constructor(
    /** the orchestrator's engine (the one spot checks recompute with) */
    private readonly engine: () => Promise<Engine>,
    private readonly data: RunData,
  ) {}

  /**
   * The held-out figures of a whole-model checkpoint of `run`'s model: its
   * bytes, or the file decoded. The file must be a valid checkpoint of that
   * model holding all of it, every tensor in its shape and finite (a
   * SafetensorsError, 400, names the first problem); the run's data must be
   * loadable.
   */
  evaluate(checkpoint: Uint8Array | SafetensorsFile, run: EvalRun): Promise<HeldoutFigures> {
    const next = this.tail.then(() => this.measure(checkpoint, run));
    this.tail = next.catch(() => undefined);
    return next;
  }

  /**
   * An assembled checkpoint of `run`, measured and encoded with the figures
   * in its metadata (heldoutMetadata); one that cannot be measured is
   * encoded without them, `onError` told why.
   */
  async encodeMeasured(whole: AssembledCheckpoint, run: EvalRun, onError: (err: Error) => void): Promise<{ bytes: Uint8Array; heldout: HeldoutFigures | null }> {
    let heldout: HeldoutFigures | null = null;
    try {
      heldout = await this.evaluate(whole.file, run);
    } catch (err) {
      onError(err as Error);
    }
    return { bytes: whole.encode(heldoutMetadata(heldout)), heldout };
  }

  private async measure(checkpoint: Uint8Array | SafetensorsFile, run: EvalRun): Promise<HeldoutFigures> {
    const t0 = performance.now();
    const file = checkpoint instanceof Uint8Array ? decodeSafetensors(checkpoint) : checkpoint;
    const model = parseModelRef(run.model);
    const engine = await this.engine();
    this.checkOpen();
    const f = model.kind === 'gpt' ? await this.gpt(engine, model, file, run) : await this.mlp(engine, model, file, run);
    return { ...f, ms: performance.now() - t0 };
  }

  private async gpt(engine: Engine, model: Extract<ModelRef, { kind: 'gpt' }>, file: SafetensorsFile, run: EvalRun): Promise<Omit<HeldoutFigures, 'ms'>> {
    const corpus = await this.data.corpus(run.data);
    if (!corpus) throw new NimbleError('unreachable', `the data ${run.data.slice(0, 80)} of the run could not be loaded`);
    const T = model.config.contextLength;
    const range = { from: 0, to: modelParts(model) };
    const rows = gptEvalRows(rangeParams(model, range), T, run.batchSize);
    this.checkOpen();
    const stage = this.model(`${model.ref}/${rows}`, () => new GptStage(engine, model.config, range, { batchSize: rows, seed: 1 }));
    if (!(stage instanceof GptStage)) throw new Error('evaluation model of the wrong kind');
    loadModelParams(model, range, stage.layout, stage.params.flat.data, file);
    let sum = 0;
    for (let i = 0; i < EVAL_BATCHES; i++) {
      await yieldToLoop();
      this.checkOpen();
      const batch = batchForShard(corpus.heldout, HELDOUT_SEED, i, rows, T);
      sum += stage.forward(batch.inputs, rows, T, batch.targets) as number;
    }
    const loss = sum / EVAL_BATCHES;
    if (!Number.isFinite(loss)) throw new NimbleError('invalid', `the checkpoint's held-out loss is ${loss}`);
    return { loss, accuracy: null, items: EVAL_BATCHES * rows * T };
  }

  private async mlp(engine: Engine, model: Extract<ModelRef, { kind: 'mlp' }>, file: SafetensorsFile, run: EvalRun): Promise<Omit<HeldoutFigures, 'ms'>> {
    const dataset = await this.data.spamDataset(model.config.inputs);
    if (!dataset) throw new NimbleError('unreachable', `the data ${run.data.slice(0, 80)} of the run could not be loaded`);
    const split = dataset.heldout;
    const rows = mlpEvalRows(rangeParams(model, { from: 0, to: 1 }), split.rows);
    const chunk = Math.min(rows, MLP_CHUNK);
    this.checkOpen();
    const mlp = this.model(`${model.ref}/${chunk}`, () => new Mlp(engine, model.config, chunk, 1));
    if (!(mlp instanceof Mlp)) throw new Error('evaluation model of the wrong kind');
    loadModelParams(model, { from: 0, to: 1 }, mlp.layout, mlp.params.flat.data, file);
    let correct = 0, lossSum = 0;
    for (let at = 0; at < rows; at += chunk) {
      await yieldToLoop();
      this.checkOpen();
      const r = classify(mlp, split, at, Math.min(chunk, rows - at));
      correct += r.correct;
      lossSum += r.lossSum;
    }
    const loss = lossSum / rows;
    if (!Number.isFinite(loss)) throw new NimbleError('invalid', `the checkpoint's held-out loss is ${loss}`);
    return { loss, accuracy: correct / rows, items: rows };
  }

  /** The evaluation model kept under `key`, made by `make` when there is none. */
  private model(key: string, make: () => GptStage | Mlp): GptStage | Mlp {
    const kept = this.models.get(key);
    if (kept) return kept;
    const m = make();
    remember(this.models, key, m, MODEL_ENTRIES, (old) => old.release());
    return m;
  }

  private checkOpen(): void {
    if (this.closed) throw new NimbleError('conflict', 'the orchestrator is closing: checkpoint evaluation stopped');
  }

  /** Releases the evaluation models (before the engine closes); an evaluation under way stops at its next batch. */
  close(): void {
    this.closed = true;
    for (const m of this.models.values()) m.release();
    this.models.clear();
  }
}

/** Rows [at, at + B) of `split` through `mlp` (one forward): how many it classifies right (argmax, the lowest class on a tie, as Mlp.predict) and their summed cross-entropy. */
function classify(mlp: Mlp, split: SpamSplit, at: number, B: number): { correct: number; lossSum: number } {
  const D = mlp.config.inputs, C = mlp.config.classes;
  const logits = mlp.forward(split.x.subarray(at * D, (at + B) * D), B) as Float32Array;
  let correct = 0, lossSum = 0;
  for (let b = 0; b < B; b++) {
    const row = logits.subarray(b * C, (b + 1) * C);
    let best = 0;
    for (let c = 1; c < C; c++) if (row[c] > row[best]) best = c;
    let sumExp = 0;
    for (let c = 0; c < C; c++) sumExp += Math.exp(row[c] - row[best]);
    const y = split.y[at + b];
    if (best === y) correct++;
    lossSum += Math.log(sumExp) - (row[y] - row[best]);
  }
  return { correct, lossSum };
}

/** The figures in words, for a job's history: `, held-out loss 2.1234` (and `, accuracy 0.9812` for an MLP); nothing without figures. */
export function heldoutWords(f: HeldoutFigures | null): string {
  if (!f) return '';
  return `, held-out loss ${f.loss.toFixed(4)}${f.accuracy === null ? '' : `, accuracy ${f.accuracy.toFixed(4)}`}`;
}
