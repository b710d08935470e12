// Training the spam classifier in one process: an MLP over the SpamAssassin
// features (src/data/spam.ts), batches drawn by shard id from the training
// split, AdamW, held-out accuracy and loss at the end. In the same run, and
// on the same batches with the same optimizer settings, a logistic-regression
// baseline: an Mlp with `hidden: []` is one linear layer + softmax
// cross-entropy, i.e. multinomial logistic regression.
import { loadSpamDataset, spamBatch, SPAM_CLASSES, type SpamDataset, type SpamSplit } from '../data/spam.ts';
import type { Engine } from '../engine/engine.ts';
import { AdamW, ADAMW_DEFAULTS } from '../model/adamw.ts';
import { Mlp } from '../model/mlp.ts';

export interface ClassifierTrainOptions {
  /** hidden layer widths of the MLP ([] would make it the baseline itself) */
  hidden: number[];
  steps: number;
  batchSize: number;
  learningRate: number;
  seed: number;
  /** the data set (default: loadSpamDataset()) */
  dataset?: SpamDataset;
  onStep?: (info: ClassifierStepInfo) => void;
}

export interface ClassifierStepInfo {
  step: number;
  steps: number;
  /** training loss of the MLP on this step's batch */
  loss: number;
  /** training loss of the baseline on the same batch */
  baselineLoss: number;
  /** since the first step, both models and batch drawing included */
  elapsedMs: number;
}

export interface ClassifierTrainResult {
  /** fraction of held-out messages the MLP classifies correctly */
  accuracy: number;
  /** the same for the logistic-regression baseline */
  baselineAccuracy: number;
  /** mean cross-entropy over the held-out split (nats) */
  heldoutLoss: number;
  baselineHeldoutLoss: number;
  /** fraction of held-out messages in the most common class: what always guessing it scores */
  majorityRate: number;
  steps: number;
  /** wall time of the MLP's training steps (batch drawing and the baseline's steps not counted) */
  elapsedMs: number;
  /** wall time of the baseline's training steps */
  baselineElapsedMs: number;
  /** parameters of the MLP */
  params: number;
  baselineParams: number;
}

export interface SplitEvaluation {
  /** fraction of rows classified correctly */
  accuracy: number;
  /** mean cross-entropy (nats) */
  loss: number;
}

/** Accuracy and mean loss of `mlp` over a whole split, in batches of mlp.maxBatch, forward only. */
export function evaluateClassifier(mlp: Mlp, split: SpamSplit): SplitEvaluation {
  if (split.rows === 0) throw new Error('cannot evaluate on an empty split');
  const D = mlp.config.inputs;
  if (split.x.length !== split.rows * D) throw new RangeError(`split rows have ${split.x.length / split.rows} features, the mlp takes ${D}`);
  let correct = 0, lossSum = 0;
  for (let at = 0; at < split.rows; at += mlp.maxBatch) {
    const B = Math.min(mlp.maxBatch, split.rows - at);
    const x = split.x.subarray(at * D, (at + B) * D);
    const y = split.y.subarray(at, at + B);
    const predicted = mlp.predict(x, B);
    for (let b = 0; b < B; b++) if (predicted[b] === y[b]) correct++;
    lossSum += (mlp.forward(x, B, y) as number) * B;
  }
  return { accuracy: correct / split.rows, loss: lossSum / split.rows };
}

/** Fraction of rows of `split` that `mlp` classifies correctly. */
export function classifierAccuracy(mlp: Mlp, split: SpamSplit): number {
  return evaluateClassifier(mlp, split).accuracy;
}

/** One model and its optimizer, with the wall time its steps have taken. */
class Learner {
  readonly opt: AdamW;
  ms = 0;

  constructor(engine: Engine, readonly mlp: Mlp, lr: number) {
    this.opt = new AdamW(engine, mlp.params, mlp.grads, { ...ADAMW_DEFAULTS, lr });
  }

  /** One AdamW step on a batch; returns the batch loss. */
  step(x: Float32Array, y: Int32Array, B: number, step: number): number {
    const t0 = performance.now();
    this.mlp.zeroGrad();
    const loss = this.mlp.forward(x, B, y) as number;
    if (!Number.isFinite(loss)) throw new Error(`training diverged at step ${step + 1}: loss ${loss}`);
    this.mlp.backward();
    this.opt.update();
    this.ms += performance.now() - t0;
    return loss;
  }
}

/**
 * Trains the MLP and the logistic-regression baseline side by side, each step
 * on the same batch (spamBatch(dataset, seed, step)) with the same AdamW
 * settings, and evaluates both on the held-out split.
 */
export function trainClassifierLocal(engine: Engine, options: ClassifierTrainOptions): ClassifierTrainResult {
  const { steps, batchSize, learningRate, seed } = options;
  if (!(Number.isInteger(steps) && steps >= 1)) throw new RangeError(`steps must be a positive integer, got ${steps}`);
  if (!(Number.isInteger(batchSize) && batchSize >= 1)) throw new RangeError(`batch size must be a positive integer, got ${batchSize}`);
  if (!(learningRate > 0)) throw new RangeError(`learning rate must be positive, got ${learningRate}`);
  const dataset = options.dataset ?? loadSpamDataset();
  const classes = SPAM_CLASSES.length;
  const mlp = new Mlp(engine, { inputs: dataset.features, hidden: options.hidden, classes }, batchSize, seed);
  const baseline = new Mlp(engine, { inputs: dataset.features, hidden: [], classes }, batchSize, seed);
  const ours = new Learner(engine, mlp, learningRate);
  const theirs = new Learner(engine, baseline, learningRate);
  try {
    const start = performance.now();
    for (let step = 0; step < steps; step++) {
      const batch = spamBatch(dataset, seed, step, batchSize);
      const loss = ours.step(batch.x, batch.y, batch.B, step);
      const baselineLoss = theirs.step(batch.x, batch.y, batch.B, step);
      options.onStep?.({ step: step + 1, steps, loss, baselineLoss, elapsedMs: performance.now() - start });
    }
    const mlpEval = evaluateClassifier(mlp, dataset.heldout);
    const baselineEval = evaluateClassifier(baseline, dataset.heldout);
    const spam = dataset.heldout.y.reduce((n, c) => n + c, 0);
    return {
      accuracy: mlpEval.accuracy,
      baselineAccuracy: baselineEval.accuracy,
      heldoutLoss: mlpEval.loss,
      baselineHeldoutLoss: baselineEval.loss,
      majorityRate: Math.max(spam, dataset.heldout.rows - spam) / dataset.heldout.rows,
      steps,
      elapsedMs: ours.ms,
      baselineElapsedMs: theirs.ms,
      params: mlp.layout.size,
      baselineParams: baseline.layout.size,
    };
  } finally {
    ours.opt.release();
    theirs.opt.release();
    mlp.release();
    baseline.release();
  }
}
