// The spam classifier job: an MLP over hashed byte n-grams of SpamAssassin
// mail (src/data/spam.ts), trained with AdamW in this process, against a
// logistic-regression baseline (an Mlp with no hidden layer) trained in the
// same run on the same batches with the same optimizer; held-out accuracy,
// held-out loss and the MLP's training time.
import { loadSpamDataset } from '../src/data/spam.ts';
import { Engine } from '../src/engine/engine.ts';
import { trainClassifierLocal, type ClassifierTrainOptions } from '../src/train/classifier.ts';
import type { Bench, BenchResult } from './harness.ts';

/**
 * The reference recipe. lr 0.01 is the best of {0.003, 0.01, 0.03} for the
 * baseline, so it is not handicapped; both models are near convergence by
 * 2,000 steps (128k draws, about 27 epochs of the training split).
 */
export const SPAM_RECIPE: ClassifierTrainOptions = { hidden: [64], steps: 2000, batchSize: 64, learningRate: 0.01, seed: 1337 };

export const spamBenches: Bench[] = [
  {
    group: 'jobs-spam',
    async run(o): Promise<BenchResult[]> {
      const t0 = performance.now();
      const dataset = loadSpamDataset();
      o.log(`features: ${dataset.train.rows} training and ${dataset.heldout.rows} held-out messages x ${dataset.features} in ${Math.round(performance.now() - t0)} ms`);
      const r0 = SPAM_RECIPE;
      o.log(`training mlp hidden [${r0.hidden}] and the logistic-regression baseline: ${r0.steps} steps x ${r0.batchSize}, lr ${r0.learningRate}`);
      const engine = await Engine.create();
      try {
        const r = trainClassifierLocal(engine, { ...SPAM_RECIPE, dataset });
        o.log(`majority class ${r.majorityRate.toFixed(4)}; mlp ${r.params} params, baseline ${r.baselineParams}; baseline trained in ${Math.round(r.baselineElapsedMs)} ms`);
        return [
          { bench: 'jobs.spam.accuracy', value: r.accuracy, unit: 'fraction' },
          { bench: 'jobs.spam.baseline_accuracy', value: r.baselineAccuracy, unit: 'fraction' },
          { bench: 'jobs.spam.heldout_loss', value: r.heldoutLoss, unit: 'nats' },
          { bench: 'jobs.spam.baseline_heldout_loss', value: r.baselineHeldoutLoss, unit: 'nats' },
          { bench: 'jobs.spam.train_ms', value: Math.round(r.elapsedMs), unit: 'ms' },
        ];
      } finally {
        await engine.close();
      }
    },
  },
];
