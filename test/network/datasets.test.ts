// A job on the developer's own data, on a real local network (an
// orchestrator and a miner, each a process of its own): `nbcli job submit`
// packs the folder the spec names (relative to the spec file), uploads it
// once as a content-addressed dataset and submits the spec with its
// `sha256:` id; the miner downloads the dataset, checks it, caches it, and
// trains the job to completion, the orchestrator's spot checks recomputing
// its forwards on the dataset from its blob store. A second submit of the same data uploads
// nothing; its owner lists and deletes it with nbcli dataset.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { OrchestratorClient } from '../../src/api/client.ts';
import { DatasetClient } from '../../src/api/dataset-client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import { packDataset } from '../../src/data/dataset.ts';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
const DEV = () => join(cluster.dir, 'dev');
let jobs: JobClient;
let api: OrchestratorClient;

before(async () => {
  // a quarter of the forwards recomputed by the orchestrator, on the dataset read from its blob store
  await cluster.startOrchestrator(['--check-rate', '0.25']);
  await cluster.startMiner('m1');
  api = new OrchestratorClient(cluster.url, { wallet: loadOrCreateKeyFile(join(DEV(), 'developer-key.json')).privateKey });
  jobs = new JobClient(api);
});
after(() => cluster.stop());

/** About `bytes` of text made of a small vocabulary, different per seed. */
function text(bytes: number, seed: number): string {
  const words = ['the', 'whale', 'sea', 'ship', 'captain', 'harpoon', 'white', 'deep', 'sail', 'storm', 'Ahab', 'Ishmael', 'and', 'of', 'a', 'wind'];
  const rand = mulberry32(seed);
  const out: string[] = [];
  let n = 0;
  while (n < bytes) {
    const w = words[Math.floor(rand() * words.length)];
    const sep = rand() < 0.08 ? '.\n' : ' ';
    out.push(w + sep);
    n += w.length + sep.length;
  }
  return out.join('');
}

async function waitJob(id: string, pred: (j: JobView) => boolean, timeoutMs = 60_000): Promise<JobView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const j = await jobs.get(id);
    if (pred(j)) return j;
    if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify(j)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test("a job on a local folder: packed, uploaded once as a dataset, downloaded and verified by the miner, trained to completed", async () => {
  const project = join(cluster.dir, 'project');
  mkdirSync(join(project, 'data', 'more'), { recursive: true });
  writeFileSync(join(project, 'data', 'one.txt'), text(120_000, 1));
  writeFileSync(join(project, 'data', 'two.txt'), text(120_000, 2));
  writeFileSync(join(project, 'data', 'more', 'three.txt'), text(60_000, 3));
  writeFileSync(join(project, 'data', '.notes'), 'not packed');
  const spec: JobSpec = { name: 'own-data', model: 'gpt-micro', data: 'data', training: { steps: 40, batchSize: 8, mergeEvery: 10 }, checkpointEvery: 40 };
  const file = join(project, 'nimble.job.json');
  writeFileSync(file, JSON.stringify(spec));
  const packed = packDataset(join(project, 'data'));
  assert.deepEqual(packed.files, ['more/three.txt', 'one.txt', 'two.txt']);

  // submitted from another folder: the spec's path is taken from the spec file's folder
  const t0 = performance.now();
  const submitted = await cluster.nbcli(['job', 'submit', file, '--orchestrator', cluster.url], DEV());
  assert.equal(submitted.code, 0, submitted.stderr);
  const dataset = submitted.out.find((o) => o.event === 'dataset')!;
  assert.deepEqual({ id: dataset.id, bytes: dataset.bytes, files: dataset.files, uploaded: dataset.uploaded }, { id: packed.id, bytes: packed.bytes.length, files: 3, uploaded: true });
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;

  const job = await waitJob(id, (j) => !['waiting', 'started', 'executing'].includes(j.status));
  assert.equal(job.status, 'completed', JSON.stringify(job));
  assert.equal(job.spec.data, packed.id, 'the job names its data by content');
  assert.equal(job.step, 40);
  assert.ok(job.loss !== null && job.loss < Math.log(256), `loss ${job.loss}`);
  const run = await cluster.run(job.runId!);
  assert.equal(run.data, packed.id);
  const checks = run.checks.reduce((a, c) => ({ passed: a.passed + c.passed, failed: a.failed + c.failed }), { passed: 0, failed: 0 });
  assert.ok(checks.passed >= 1 && checks.failed === 0, `spot checks on the dataset: ${JSON.stringify(run.checks)}`);
  console.log(`# own-data job: submitted and completed in ${((performance.now() - t0) / 1000).toFixed(1)} s, loss ${job.loss?.toFixed(3)}`);

  // the miner downloaded it once, checked, into its data dir
  const cached = readFileSync(join(cluster.dir, 'm1', 'miner', 'datasets', packed.id.slice(7)));
  assert.equal(createHash('sha256').update(cached).digest('hex'), packed.id.slice(7));
  const logs = cluster.procs.find((p) => p.lines.some((l) => l.includes('downloaded dataset')))?.lines.filter((l) => l.includes('downloaded dataset')) ?? [];
  assert.equal(logs.length, 1, 'downloaded once');

  // the orchestrator keeps it for its owner
  const me = (await api.signed()).address;
  const view = await new DatasetClient(api).get(packed.id.slice(7), me);
  assert.equal(view?.bytes, packed.bytes.length);

  // the same data again: not uploaded a second time
  const again = await cluster.nbcli(['job', 'submit', file, '--orchestrator', cluster.url], DEV());
  assert.equal(again.code, 0, again.stderr);
  assert.equal(again.out.find((o) => o.event === 'dataset')!.uploaded, false);
  const second = again.out.find((o) => o.event === 'submitted')!.id as string;
  assert.equal((await jobs.cancel(second)).status, 'cancelled');

  // listed, and deleted by its owner once no job of theirs uses it
  const listed = await cluster.nbcli(['dataset', 'list', '--mine', '--orchestrator', cluster.url], DEV());
  assert.equal(listed.code, 0, listed.stderr);
  assert.deepEqual((listed.out[0] as unknown as { id: string }[]).map((d) => d.id), [packed.id]);
  const removed = await cluster.nbcli(['dataset', 'rm', packed.id, '--orchestrator', cluster.url], DEV());
  assert.equal(removed.code, 0, removed.stderr);
  assert.equal(await new DatasetClient(api).get(packed.id.slice(7), me), null);

  // a spec whose data is too small for its model is refused before anything is sent
  writeFileSync(join(project, 'tiny.txt'), 'too short');
  writeFileSync(join(project, 'tiny.json'), JSON.stringify({ ...spec, name: 'tiny', data: 'tiny.txt' }));
  const tiny = await cluster.nbcli(['job', 'submit', join(project, 'tiny.json'), '--orchestrator', cluster.url], DEV());
  assert.equal(tiny.code, 1);
  assert.match(tiny.stderr, /the data 'tiny\.txt' has 9 bytes; a model of context 16 needs at least \d+/);
});
