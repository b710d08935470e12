// "Upgrade" on a real local network (an orchestrator and four miners, each a
// process of its own): a GPT job starts on one miner, `nbcli job upgrade`
// moves it mid-run onto 2 stages × 2 replicas from the checkpoint its first
// run ends with, and it completes there. Nothing trained is lost (the new
// run starts from the trained weights and goes on with the next shards) and
// its loss keeps falling.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { OrchestratorClient } from '../../src/api/client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import { isFinalJobStatus } from '../../src/jobs/status.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
const DEV = (): string => join(cluster.dir, 'dev');
let jobs: JobClient;

before(async () => {
  await cluster.startOrchestrator(['--miner-timeout-ms', '4000']);
  await Promise.all(['m1', 'm2', 'm3', 'm4'].map((n) => cluster.startMiner(n)));
  const key = loadOrCreateKeyFile(join(DEV(), 'developer-key.json')).privateKey;
  jobs = new JobClient(new OrchestratorClient(cluster.url, { wallet: key }));
});
after(() => cluster.stop());

async function waitJob(id: string, pred: (j: JobView) => boolean, timeoutMs = 120_000): Promise<JobView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const j = await jobs.get(id);
    if (pred(j)) return j;
    if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify(j)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The losses of a run's done microbatches in shard order, and its shards, from the orchestrator's SQLite file. */
function trained(runId: string): { losses: number[]; shards: number[] } {
  const db = new Database(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
  try {
    const rows = db.prepare("SELECT shard, loss FROM microbatches WHERE run_id = ? AND status = 'done' ORDER BY shard").all(runId) as { shard: number; loss: number }[];
    return { losses: rows.map((r) => r.loss), shards: rows.map((r) => r.shard) };
  } finally {
    db.close();
  }
}

/** Reads `trained(runId)` every 100 ms until `stop()`, keeping the fullest (an ended run's rows are collected soon after it ends). */
function watchTrained(runId: string): { stop(): Promise<{ losses: number[]; shards: number[] }> } {
  let best = trained(runId);
  let running = true;
  const loop = (async () => {
    while (running) {
      const now = trained(runId);
      if (now.shards.length >= best.shards.length) best = now;
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return best;
    },
  };
}

const mean = (xs: number[]): number => xs.reduce((a, x) => a + x, 0) / xs.length;

test('upgrade moves a running GPT job from one miner to 2 stages × 2 replicas from its checkpoint: nothing trained is lost and its loss keeps falling', async (t) => {
  const job = await jobs.submit({ name: 'grow', model: 'gpt-micro', data: 'moby-dick', training: { steps: 240, batchSize: 8, mergeEvery: 10, learningRate: 3e-3 }, checkpointEvery: 40 });
  const early = await waitJob(job.id, (j) => j.status === 'executing' && j.step >= 60 && j.checkpoints.length >= 1);
  const firstRun = early.runId!;
  const firstRows = watchTrained(firstRun);
  t.after(() => firstRows.stop());
  assert.equal((await cluster.run(firstRun)).stages.length, 1, 'it starts on one miner');

  // an impossible group is refused with a clear error; a stranger cannot upgrade it
  await assert.rejects(jobs.upgrade(job.id, { stages: 2, replicas: 3 }), (e: unknown) => e instanceof NimbleError && e.status === 409 && /needs 6 miners and 4 are alive/.test(e.message));
  const up = await cluster.nbcli(['job', 'upgrade', job.id, '--stages', '2', '--replicas', '2', '--orchestrator', cluster.url], DEV());
  assert.equal(up.code, 0, JSON.stringify(up));
  assert.deepEqual((up.out[0] as unknown as JobView).upgrade, { stages: 2, replicas: 2 });
  // (a second upgrade while this one is under way is refused: test/orchestrator/jobs/job-upgrade.test.ts; here the first run may already have ended)

  const moved = await waitJob(job.id, (j) => j.runId !== firstRun, 120_000);
  const done1 = await cluster.run(firstRun);
  assert.equal(done1.status, 'completed', 'the first run finished what it had issued and merged');
  const a = await firstRows.stop();
  const secondRows = watchTrained(moved.runId!);
  t.after(() => secondRows.stop());
  const grouped = await cluster.waitRun(moved.runId!, (v) => v.status === 'executing' && v.stages.length === 2 && v.stages.every((s) => s.replicas.length === 2), 120_000);
  assert.equal(grouped.steps, 240 - done1.microbatchesDone, 'the new run trains the steps left');

  const done = await waitJob(job.id, (j) => isFinalJobStatus(j.status), 240_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.equal(done.step, 240, JSON.stringify(done));
  const steps = done.checkpoints.map((c) => c.step);
  assert.ok(steps.includes(done1.microbatchesDone), `the first run's final state is a checkpoint (${steps.join(', ')})`);
  assert.equal(steps.at(-1), 240, `checkpoint steps ${steps.join(', ')}`);
  assert.ok(steps.every((s, i) => i === 0 || s > steps[i - 1]), 'checkpoint steps only grow');
  const history = (await jobs.events(job.id)).map((e) => e.message);
  assert.ok(history.some((m) => /upgraded to 2 stages × 2 replicas/.test(m)), history.join('\n'));

  // nothing trained is lost: the new run goes on with the next shards, from the trained weights
  const b = await secondRows.stop();
  assert.equal(a.shards.length, done1.microbatchesDone, `the first run's done microbatches: ${JSON.stringify(done1)}`);
  assert.equal(Math.min(...b.shards), done1.microbatchesDone, 'the new run starts at the first shard not trained');
  assert.equal(b.shards.length, 240 - done1.microbatchesDone, 'the new run trained the rest');
  const firstLosses = mean(a.losses.slice(0, 5));
  const lastBefore = mean(a.losses.slice(-10));
  const firstAfter = mean(b.losses.slice(0, 10));
  const lastAfter = mean(b.losses.slice(-10));
  const figures = `first run ${firstLosses.toFixed(3)} → ${lastBefore.toFixed(3)}; upgraded run ${firstAfter.toFixed(3)} → ${lastAfter.toFixed(3)}`;
  t.diagnostic(`mean loss of 5 / 10 microbatches: ${figures}`);
  assert.ok(Math.abs(firstAfter - lastBefore) < Math.abs(firstAfter - firstLosses), `the upgraded run starts where the first ended, not from scratch: ${figures}`);
  assert.ok(lastAfter < firstAfter, `its loss keeps falling: ${figures}`);
});

test('--auto-upgrade: a job one miner cannot finish by its deadline is upgraded by the orchestrator itself, once, and completes on the group', async () => {
  const file = join(cluster.dir, 'auto.job.json');
  writeFileSync(file, JSON.stringify({ name: 'auto', model: 'gpt-micro', data: 'moby-dick', training: { steps: 160, batchSize: 8, mergeEvery: 10 }, checkpointEvery: 40, limits: { deadline: '3s' } }));
  const submitted = await cluster.nbcli(['job', 'submit', file, '--auto-upgrade', '--orchestrator', cluster.url], DEV());
  assert.equal(submitted.code, 0, JSON.stringify(submitted));
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;
  const first = await waitJob(id, (j) => j.runId !== null);
  const done = await waitJob(id, (j) => isFinalJobStatus(j.status), 240_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.equal(done.step, 160);
  assert.equal(done.spec.autoUpgrade, true);
  const messages = (await jobs.events(id)).map((e) => e.message);
  const auto = messages.filter((m) => m.startsWith('auto-upgrade'));
  assert.equal(auto.length, 1, messages.join('\n'));
  assert.match(auto[0], /past its deadline/);
  assert.notEqual(done.runId, first.runId);
  assert.equal((await cluster.run(done.runId!)).stages.length, 2, 'it ended on 2 stages');
});
