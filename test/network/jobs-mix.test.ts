// Jobs of every kind of model on one real local network (an orchestrator and
// four miners of different memory sizes, each a process of its own), submitted
// together through the jobs API: a named GPT, the spam classifier (an MLP on
// the SpamAssassin features) and an inline GPT config all train through the
// ordinary run machinery (stages, merges, spot checks, checkpoints) and
// complete. Each lands on the smallest idle miner that holds its whole model;
// the classifier's downloaded checkpoint, loaded into an Mlp, classifies the
// held-out mail far better than always guessing the majority class; what the
// miners cannot train is refused with the reason.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { OrchestratorClient } from '../../src/api/client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobView } from '../../src/api/jobs.ts';
import type { RunView } from '../../src/api/schemas.ts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import { loadSpamDataset } from '../../src/data/spam.ts';
import { Engine } from '../../src/engine/engine.ts';
import { JOB_TEMPLATES } from '../../src/jobs/templates.ts';
import { isFinalJobStatus } from '../../src/jobs/status.ts';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { loadModelParams, modelCheckpointInfo } from '../../src/model/checkpoint.ts';
import { Mlp } from '../../src/model/mlp.ts';
import { parseModelRef, stageLayout } from '../../src/model/model-ref.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { checkWholeModel } from '../../src/model/whole-model.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { evaluateClassifier } from '../../src/train/classifier.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let jobs: JobClient;
/** Miners by the memory they offer: the smallest holds gpt-micro (2.3 MB at batch 8) but not the classifier (8.4 MB at batch 64). */
const MINERS = { 'm-4mb': '4MB', 'm-12mb': '12MB', 'm-64mb': '64MB', 'm-1gb': '1GB' } as const;

before(async () => {
  // spot checks on a tenth of the forwards, so that the classifier's run is checked several times
  await cluster.startOrchestrator(['--miner-timeout-ms', '4000', '--check-rate', '0.1']);
  await Promise.all(Object.entries(MINERS).map(([name, memory]) => cluster.startMiner(name, ['--memory', memory])));
  const key = loadOrCreateKeyFile(join(cluster.dir, 'dev', 'developer-key.json')).privateKey;
  jobs = new JobClient(new OrchestratorClient(cluster.url, { wallet: key }));
});
after(() => cluster.stop());

async function waitJob(id: string, pred: (j: JobView) => boolean, timeoutMs = 75_000): Promise<JobView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const j = await jobs.get(id);
    if (pred(j)) return j;
    if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify(j)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function download(job: JobView): Promise<Uint8Array> {
  const res = await jobs.openCheckpoint(job.id, job.checkpoints.at(-1)!.step);
  return new Uint8Array(await res.arrayBuffer());
}

const replicaNames = (run: RunView): string[] => run.stages.flatMap((s) => s.replicas.map((r) => r.name));

/** The classifier template with fewer steps. */
const classifierSpec = (over: { name?: string; steps: number; mergeEvery?: number; checkpointEvery: number }): JobSpec => ({
  ...JOB_TEMPLATES.classifier,
  name: over.name ?? JOB_TEMPLATES.classifier.name,
  model: { ...JOB_TEMPLATES.classifier.model, hidden: [64] },
  training: { ...JOB_TEMPLATES.classifier.training, steps: over.steps, mergeEvery: over.mergeEvery ?? JOB_TEMPLATES.classifier.training.mergeEvery },
  checkpointEvery: over.checkpointEvery,
});

/** Held-out accuracy of a downloaded classifier checkpoint, loaded into an Mlp (over the whole held-out split), and the majority class rate. */
async function heldoutAccuracy(bytes: Uint8Array): Promise<{ accuracy: number; majority: number }> {
  const file = decodeSafetensors(bytes);
  const engine = await Engine.create({ threads: 1 });
  try {
    const mlp = new Mlp(engine, { inputs: 4096, hidden: [64], classes: 2 }, 256);
    const model = parseModelRef('mlp:4096-64-2');
    loadModelParams(model, { from: 0, to: 1 }, stageLayout(model, { from: 0, to: 1 }), mlp.params.flat.data, file);
    const heldout = loadSpamDataset(4096).heldout;
    const spam = heldout.y.reduce((a, y) => a + y, 0);
    const { accuracy } = evaluateClassifier(mlp, heldout);
    mlp.release();
    return { accuracy, majority: Math.max(spam, heldout.rows - spam) / heldout.rows };
  } finally {
    await engine.close();
  }
}

test('a named GPT, the spam classifier and an inline GPT, submitted together, each train on the smallest miner that holds it and complete', async () => {
  const t0 = Date.now();
  const gpt: JobSpec = { name: 'micro', model: 'gpt-micro', data: 'moby-dick', training: { steps: 60, batchSize: 8, learningRate: 3e-3, mergeEvery: 20 }, checkpointEvery: 30 };
  const classifier = classifierSpec({ steps: 150, checkpointEvery: 75 });
  const inline: JobSpec = {
    name: 'inline',
    model: { type: 'gpt', vocabSize: 256, contextLength: 32, channels: 32, layers: 2, heads: 4 },
    data: 'moby-dick',
    training: { steps: 40, batchSize: 8, learningRate: 3e-3, mergeEvery: 20 },
  };
  const submitted = await Promise.all([jobs.submit(gpt), jobs.submit(classifier), jobs.submit(inline)].map((p) => p));
  const done = await Promise.all(submitted.map((j) => waitJob(j.id, (v) => isFinalJobStatus(v.status))));
  for (const j of done) assert.equal(j.status, 'completed', JSON.stringify(j));
  const [g, c, i] = done;
  const [gRun, cRun, iRun] = await Promise.all(done.map((j) => cluster.run(j.runId!)));

  // the runs carry model references: a name, an MLP, an inline GPT
  assert.equal(gRun.model, 'gpt-micro');
  assert.equal(cRun.model, 'mlp:4096-64-2');
  assert.equal(iRun.model, 'gpt:v256.t32.c32.l2.h4.r4');
  assert.equal(cRun.stages.length, 1, 'an MLP is one stage');
  assert.deepEqual(cRun.stages[0].parts, [0, 1]);
  assert.equal(c.step, 150);
  assert.equal(c.tokens, 150 * 64, "an MLP job's tokens count examples");

  // placement: the smallest idle miner that holds the whole model; the classifier does not fit the 4 MB miner
  assert.deepEqual(replicaNames(gRun), ['m-4mb']);
  assert.deepEqual(replicaNames(cRun), ['m-12mb'], 'the classifier ran on the smallest miner that holds it');
  assert.deepEqual(replicaNames(iRun), ['m-64mb']);
  const events = await jobs.events(c.id);
  assert.ok(events.some((e) => /placed on miner m-12mb, the smallest idle miner/.test(e.message)), JSON.stringify(events.map((e) => e.message)));

  // the classifier's run was spot-checked (its loss recomputed by the orchestrator) and every check passed
  const checks = cRun.checks.reduce((a, m) => ({ passed: a.passed + m.passed, failed: a.failed + m.failed }), { passed: 0, failed: 0 });
  assert.ok(checks.passed >= 1, `the classifier's forwards were checked: ${JSON.stringify(cRun.checks)}`);
  assert.equal(checks.failed, 0, JSON.stringify(cRun.checks));
  for (const run of [gRun, iRun]) assert.equal(run.checks.reduce((a, m) => a + m.failed, 0), 0, `${run.model}: ${JSON.stringify(run.checks)}`);

  // the classifier's last checkpoint, downloaded and loaded into an Mlp, classifies held-out mail
  // every 75 steps (kept at the merge that follows) and at the end
  assert.ok(c.checkpoints.length >= 2 && c.checkpoints[0].step >= 75 && c.checkpoints.at(-1)!.step === 150, JSON.stringify(c.checkpoints));
  const bytes = await download(c);
  const file = decodeSafetensors(bytes);
  const info = modelCheckpointInfo(file);
  assert.deepEqual(info, { kind: 'mlp', config: { inputs: 4096, hidden: [64], classes: 2 }, from: 0, to: 1, step: 150 });
  assert.equal(file.metadata.model, 'mlp:4096-64-2');
  assert.equal(file.metadata.job, c.id);
  const { accuracy, majority } = await heldoutAccuracy(bytes);
  assert.ok(accuracy >= 0.9 && accuracy > majority + 0.2, `held-out accuracy ${accuracy.toFixed(4)}, majority class ${majority.toFixed(4)}`);
  // the orchestrator measured the same when it kept it: in its row and its metadata (every held-out message)
  const kept = c.checkpoints.at(-1)!;
  assert.ok(kept.heldoutAccuracy !== null && kept.heldoutAccuracy > majority, JSON.stringify(kept));
  assert.ok(Math.abs(kept.heldoutAccuracy - accuracy) < 1e-6, `the orchestrator measured ${kept.heldoutAccuracy}, the downloaded file classifies ${accuracy}`);
  assert.ok(Number.isFinite(kept.heldoutLoss) && kept.heldoutLoss! < Math.log(2), JSON.stringify(kept));
  assert.equal(Number(file.metadata.heldoutAccuracy), kept.heldoutAccuracy);
  assert.equal(Number(file.metadata.heldoutLoss), kept.heldoutLoss);
  assert.equal(file.metadata.heldoutExamples, String(loadSpamDataset(4096).heldout.rows));
  console.log(`classifier on one miner: ${c.step} steps, held-out accuracy ${accuracy.toFixed(4)} (majority class ${majority.toFixed(4)}); all three jobs done in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  // both the classifier's and the inline GPT's checkpoints are whole, publishable models
  assert.throws(() => checkWholeModel(new Uint8Array(0)));
  assert.equal(checkWholeModel(bytes).model, 'mlp:4096-64-2');
  const inlineInfo = checkWholeModel(await download(i));
  assert.deepEqual(inlineInfo.config, { vocabSize: 256, contextLength: 32, channels: 32, layers: 2, heads: 4, mlpRatio: 4 });
  assert.equal(inlineInfo.step, 40);
  assert.equal(g.step, 60);
});

test('what the miners cannot train is refused with the reason, nothing recorded', async () => {
  const refused = async (p: Promise<unknown>, pattern: RegExp): Promise<void> => {
    await assert.rejects(p, (e: unknown) => e instanceof NimbleError && e.status === 400 && pattern.test(e.message));
  };
  const before = (await cluster.api.runs()).length;
  await refused(cluster.createRun({ model: 'mlp:4096-64-2', data: 'spam-assassin', steps: 10, stages: 2 }), /MLP classifier trains as one stage/);
  await refused(cluster.createRun({ model: 'mlp:4096-64-2', data: 'moby-dick', steps: 10 }), /trains on 'spam-assassin'/);
  await refused(cluster.createRun({ model: 'gpt-micro', data: 'spam-assassin', steps: 10 }), /not available to miners/);
  await refused(cluster.createRun({ model: 'gpt:v128.t16.c16.l1.h2.r4', data: 'moby-dick', steps: 10 }), /vocabulary of 256, not 128/);
  await refused(cluster.createRun({ model: 'mlp:04096-2', data: 'spam-assassin', steps: 10 }), /inputs '04096' is not a positive integer/);
  await refused(cluster.createRun({ model: 'gpt:v256.t16.c16.l1.h3.r4', data: 'moby-dick', steps: 10 }), /channels must divide into heads/);
  assert.equal((await cluster.api.runs()).length, before, 'no run recorded');
  // a job spec the schema accepts but the miners cannot train
  const bytes: JobSpec = { name: 'v128', model: { type: 'gpt', vocabSize: 128, contextLength: 16, channels: 16, layers: 1, heads: 2 }, data: 'moby-dick', training: { steps: 10 } };
  await refused(jobs.submit(bytes), /cannot train this job: the data is bytes/);
});

test('the classifier upgraded mid-run onto replicas of its one stage: they merge, the job completes, and its checkpoint still classifies', async () => {
  const t0 = Date.now();
  const job = await jobs.submit(classifierSpec({ name: 'spam-upgrade', steps: 300, mergeEvery: 30, checkpointEvery: 300 }));
  await waitJob(job.id, (j) => j.step >= 40);
  // an MLP is not cut into stages: only replicas
  await assert.rejects(jobs.upgrade(job.id, { stages: 2, replicas: 1 }), (e: unknown) => e instanceof NimbleError && e.status === 400 && /upgrade it to replicas only/.test(e.message));
  await jobs.upgrade(job.id, { stages: 1, replicas: 2 });
  const done = await waitJob(job.id, (j) => isFinalJobStatus(j.status));
  assert.equal(done.status, 'completed', `${JSON.stringify(done)}\n${cluster.chargedDetails()}`);
  assert.equal(done.step, 300);
  const run = await cluster.run(done.runId!);
  assert.equal(run.stages.length, 1);
  // the miners that hold the classifier are its replicas (the 4 MB one does not)
  const names = replicaNames(run);
  assert.ok(names.length >= 2 && !names.includes('m-4mb'), `replicas: ${JSON.stringify(run.stages[0].replicas)}`);
  assert.ok(run.stages[0].round >= 2, `the replicas merged: ${JSON.stringify(run.stages[0])}`);
  assert.equal(run.checks.reduce((a, m) => a + m.failed, 0), 0, JSON.stringify(run.checks));
  const events = (await jobs.events(job.id)).map((e) => e.message);
  assert.ok(events.some((m) => /upgraded to 1 stage × 2 replicas: \d+ steps left, from the checkpoint at step \d+/.test(m)), events.join('\n'));
  const { accuracy, majority } = await heldoutAccuracy(await download(done));
  assert.ok(accuracy >= 0.9 && accuracy > majority + 0.2, `held-out accuracy ${accuracy.toFixed(4)}, majority class ${majority.toFixed(4)}`);
  console.log(`classifier upgraded to ${replicaNames(run).length} replicas: ${done.step} steps, held-out accuracy ${accuracy.toFixed(4)}, in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
});

test('a classifier with autoUpgrade that one miner cannot finish by its deadline is moved onto replicas by the orchestrator', async () => {
  const spec: JobSpec = { ...classifierSpec({ name: 'spam-auto', steps: 160, mergeEvery: 20, checkpointEvery: 160 }), autoUpgrade: true, limits: { deadline: '1s' } };
  const job = await jobs.submit(spec);
  const done = await waitJob(job.id, (j) => isFinalJobStatus(j.status));
  assert.equal(done.status, 'completed', `${JSON.stringify(done)}\n${cluster.chargedDetails()}`);
  const events = (await jobs.events(job.id)).map((e) => e.message);
  assert.ok(events.some((m) => /^auto-upgrade \(at \d+ examples\/s on one miner it would end .* past its deadline\): upgrade to 1 stage × \d replicas/.test(m)), events.join('\n'));
  const run = await cluster.run(done.runId!);
  assert.equal(run.stages.length, 1);
  assert.ok(replicaNames(run).length >= 2, `replicas: ${JSON.stringify(run.stages[0].replicas)}`);
});
