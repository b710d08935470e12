// The spam classifier job: an MLP over hashed byte n-grams of SpamAssassin
// mail (src/data/spam.ts), trained with AdamW in this process, against a
// logistic-regression baseline (an Mlp with no hidden layer) trained in the
// same run on the same batches with the same optimizer; held-out accuracy,
// held-out loss and the MLP's training time.
//
// `jobs-spam-network`: the same recipe as a job on a local network (an
// orchestrator in this process, two single-thread miner child processes),
// upgraded at once onto two replicas of its one stage that merge every 50
// inner steps each; the held-out accuracy of the checkpoint it ends with,
// downloaded and loaded into an Mlp, and the wall time from submission.
import { JobClient } from '../src/api/job-client.ts';
import { loadSpamDataset } from '../src/data/spam.ts';
import { Engine } from '../src/engine/engine.ts';
import { JOB_TEMPLATES } from '../src/jobs/templates.ts';
import { isFinalJobStatus } from '../src/jobs/status.ts';
import { loadModelParams } from '../src/model/checkpoint.ts';
import { Mlp } from '../src/model/mlp.ts';
import { parseModelRef, stageLayout } from '../src/model/model-ref.ts';
import { decodeSafetensors } from '../src/model/safetensors.ts';
import { evaluateClassifier, trainClassifierLocal, type ClassifierTrainOptions } from '../src/train/classifier.ts';
import type { Bench, BenchOptions, BenchResult } from './harness.ts';
import { startNet, stopNet } from './network.bench.ts';

/**
 * The reference recipe. lr 0.01 is the best of {0.003, 0.01, 0.03} for the
 * baseline, so it is not handicapped; both models are near convergence by
 * 2,000 steps (128k draws, about 27 epochs of the training split).
 */
export const SPAM_RECIPE: ClassifierTrainOptions = { hidden: [64], steps: 2000, batchSize: 64, learningRate: 0.01, seed: 1337 };

/** The classifier template (src/jobs/templates.ts) is the recipe: 2,000 steps of 64, lr 0.01, a merge every 50 inner steps per replica. */
const NETWORK_MINERS = 2;
const NETWORK_TIMEOUT_MS = 10 * 60_000;

async function networkBench(o: BenchOptions): Promise<BenchResult[]> {
  const spec = { ...JOB_TEMPLATES.classifier, name: 'bench-spam', limits: { timeout: '20m', idleTimeout: '2m', deadline: '20m' } };
  o.log(`starting an orchestrator and ${NETWORK_MINERS} miners`);
  const net = await startNet(Array.from({ length: NETWORK_MINERS }, () => ({ threads: 1 })));
  try {
    while (net.orch.coordinator.idleMiners().length < NETWORK_MINERS) await new Promise((r) => setTimeout(r, 50));
    const jobs = new JobClient(net.api);
    const t0 = performance.now();
    const job = await jobs.submit(spec);
    await jobs.upgrade(job.id, { stages: 1, replicas: NETWORK_MINERS });
    let last = 0;
    let view = await jobs.get(job.id);
    while (!isFinalJobStatus(view.status)) {
      if (performance.now() - t0 > NETWORK_TIMEOUT_MS) throw new Error(`job not done after ${NETWORK_TIMEOUT_MS / 1000} s: ${JSON.stringify(view)}`);
      if (performance.now() - last > 15_000) {
        last = performance.now();
        o.log(`step ${view.step} of ${view.steps}, loss ${view.loss?.toFixed(4) ?? '-'}`);
      }
      await new Promise((r) => setTimeout(r, 250));
      view = await jobs.get(job.id);
    }
    const ms = performance.now() - t0;
    if (view.status !== 'completed') throw new Error(`the job ended ${view.status}: ${view.message}`);
    const run = await net.api.run(view.runId!);
    const bytes = new Uint8Array(await (await jobs.openCheckpoint(job.id, view.checkpoints.at(-1)!.step)).arrayBuffer());
    const model = parseModelRef('mlp:4096-64-2');
    if (model.kind !== 'mlp') throw new Error('the template is an MLP');
    const engine = await Engine.create({ threads: 1 });
    try {
      const mlp = new Mlp(engine, model.config, 256);
      loadModelParams(model, { from: 0, to: 1 }, stageLayout(model, { from: 0, to: 1 }), mlp.params.flat.data, decodeSafetensors(bytes));
      const { accuracy, loss } = evaluateClassifier(mlp, loadSpamDataset(model.config.inputs).heldout);
      mlp.release();
      o.log(`${view.step} steps on ${run.stages[0].replicas.length} replicas, ${run.mergesDone} merge rounds, in ${(ms / 1000).toFixed(1)} s: held-out accuracy ${accuracy.toFixed(4)}, loss ${loss.toFixed(4)}`);
      return [
        { bench: 'jobs.spam.network_accuracy', value: accuracy, unit: 'fraction' },
        { bench: 'jobs.spam.network_heldout_loss', value: loss, unit: 'nats' },
        { bench: 'jobs.spam.network_ms', value: Math.round(ms), unit: 'ms' },
      ];
    } finally {
      await engine.close();
    }
  } finally {
    await stopNet(net);
  }
}

export const spamBenches: Bench[] = [
  { group: 'jobs-spam-network', run: networkBench },
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
