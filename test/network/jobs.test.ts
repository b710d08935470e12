// A developer's jobs on a real local network (an orchestrator and three
// miners, each a process of its own), driven through nbcli and the HTTP API:
// a job placed on one miner completes with its status history and
// checkpoints; a checkpoint downloads, resumes after an interruption and is
// checked against its sha256; wall-clock and idle limits end jobs; only the
// owner cancels or downloads; a kill -9 of the orchestrator loses no job,
// event or checkpoint.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
const DEV = () => join(cluster.dir, 'dev');
let jobs: JobClient;

before(async () => {
  await cluster.startOrchestrator(['--miner-timeout-ms', '4000']);
  await Promise.all(['m1', 'm2', 'm3'].map((n) => cluster.startMiner(n)));
  const key = loadOrCreateKeyFile(join(DEV(), 'developer-key.json')).privateKey;
  jobs = new JobClient(new OrchestratorClient(cluster.url, { wallet: key }));
});
after(() => cluster.stop());

const spec = (over: Partial<JobSpec> & { steps?: number } = {}): JobSpec => {
  const { steps, ...rest } = over;
  return { name: 'micro', model: 'gpt-micro', data: 'moby-dick', training: { steps: steps ?? 60, batchSize: 8, mergeEvery: 10 }, checkpointEvery: 20, ...rest };
};

async function waitJob(id: string, pred: (j: JobView) => boolean, timeoutMs = 120_000): Promise<JobView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    let j: JobView | undefined;
    try {
      j = await jobs.get(id);
    } catch {
      // the orchestrator is restarting
    }
    if (j && pred(j)) return j;
    if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify(j)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test('a job submitted with nbcli runs on one miner, completes with its status history, and keeps checkpoints that download, resume and verify', async () => {
  const file = join(cluster.dir, 'nimble.job.json');
  writeFileSync(file, JSON.stringify(spec()));
  const submitted = await cluster.nbcli(['job', 'submit', file, '--orchestrator', cluster.url], DEV());
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;

  // followed live by server-sent events until it ends
  const seen: string[] = [];
  let progress = 0;
  for await (const u of jobs.follow(id)) {
    if (u.kind === 'event' && u.event.kind === 'status') seen.push(u.event.status);
    if (u.kind === 'progress') progress++;
    if (u.kind === 'end') break;
  }
  const job = await jobs.get(id);
  assert.equal(job.status, 'completed', JSON.stringify(job));
  assert.equal(job.step, 60);
  assert.deepEqual(seen, ['waiting', 'started', 'executing', 'completed'].filter((s) => seen.includes(s)));
  assert.ok(seen.includes('completed') && seen.includes('executing'), `statuses seen: ${seen.join(' ')}`);
  assert.ok(progress >= 1, 'progress was streamed');
  const history = await jobs.events(id);
  assert.ok(history.every((e, i) => e.seq === i + 1 && (i === 0 || e.at >= history[i - 1].at)), 'events are in order, each with its time');
  assert.ok(history.some((e) => e.message.includes('smallest idle miner')), 'the placement is explained');

  // the default assignment: one miner holding the whole model
  const run = await cluster.run(job.runId!);
  assert.equal(run.stages.length, 1);
  assert.equal(run.stages[0].replicas.length, 1, 'one miner holds the whole model');

  // checkpoints every 20 steps and at the end, kept for 3 days after the end
  assert.ok(job.checkpoints.length >= 2, `checkpoints: ${JSON.stringify(job.checkpoints)}`);
  const last = job.checkpoints.at(-1)!;
  assert.equal(last.step, 60);
  assert.equal(last.expiresAt, job.endedAt! + 3 * 86_400_000);
  // each measured on held-out data when it was kept (a GPT: a loss, no accuracy)
  for (const c of job.checkpoints) assert.ok(Number.isFinite(c.heldoutLoss) && c.heldoutLoss! > 0 && c.heldoutAccuracy === null, JSON.stringify(c));

  // download with nbcli; then an interrupted download resumes from its part file
  const out = join(cluster.dir, 'ckpt.safetensors');
  const dl = await cluster.nbcli(['checkpoint', 'download', id, '--orchestrator', cluster.url, '--out', out], DEV());
  assert.equal(dl.code, 0, dl.stderr);
  const bytes = readFileSync(out);
  assert.equal(createHash('sha256').update(bytes).digest('hex'), last.sha256);
  // the file's metadata holds the same figure: 4 held-out batches of the job's 8 sequences of 16 bytes
  const meta = decodeSafetensors(new Uint8Array(bytes)).metadata;
  assert.equal(Number(meta.heldoutLoss), last.heldoutLoss);
  assert.equal(meta.heldoutTokens, String(4 * 8 * 16));
  assert.equal(meta.job, id);
  const resumed = join(cluster.dir, 'resumed.safetensors');
  writeFileSync(`${resumed}.part`, bytes.subarray(0, 1000));
  writeFileSync(`${resumed}.part.json`, JSON.stringify({ sha256: last.sha256 }));
  const again = await cluster.nbcli(['checkpoint', 'download', id, '--orchestrator', cluster.url, '--out', resumed], DEV());
  assert.equal(again.code, 0, again.stderr);
  assert.equal(again.out.find((o) => o.event === 'downloaded')!.resumedFrom, 1000);
  assert.deepEqual(readFileSync(resumed), bytes);
  // a part file that was tampered with fails the sha256 check, is deleted, and the next try starts over
  const bad = join(cluster.dir, 'bad.safetensors');
  writeFileSync(`${bad}.part`, Buffer.alloc(1000, 7));
  writeFileSync(`${bad}.part.json`, JSON.stringify({ sha256: last.sha256 }));
  const refused = await cluster.nbcli(['checkpoint', 'download', id, '--orchestrator', cluster.url, '--out', bad], DEV());
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, /sha256/);
  const retried = await cluster.nbcli(['checkpoint', 'download', id, '--orchestrator', cluster.url, '--out', bad], DEV());
  assert.equal(retried.code, 0, retried.stderr);
  assert.deepEqual(readFileSync(bad), bytes);

  // the checkpoints are their owner's
  const stranger = new JobClient(new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }));
  await assert.rejects(stranger.openCheckpoint(id, last.step), (e: unknown) => e instanceof NimbleError && e.status === 403);
});

test('limits: past its wall-clock timeout a job ends timed_out; with every miner busy it ends idle_stopped; a stranger cannot cancel it, its owner can', async () => {
  // a spec the miners cannot train (an inline GPT whose vocabulary is not the bytes'): refused with a clear error, nothing recorded
  const inline = spec({ name: 'inline', model: { type: 'gpt', vocabSize: 128, contextLength: 16, channels: 16, layers: 1, heads: 2 } });
  await assert.rejects(jobs.submit(inline), (e: unknown) => e instanceof NimbleError && e.status === 400 && /vocabulary of 256/.test(e.message));
  // three long jobs take the three miners, one each; the fourth finds none free
  const slow = await jobs.submit(spec({ name: 'slow', steps: 100_000, limits: { timeout: '8s' } }));
  const busy = [await jobs.submit(spec({ name: 'busy-1', steps: 100_000 })), await jobs.submit(spec({ name: 'busy-2', steps: 100_000 }))];
  const idle = await jobs.submit(spec({ name: 'idle', limits: { idleTimeout: '2s' } }));

  const stopped = await waitJob(idle.id, (j) => !['waiting', 'started', 'executing'].includes(j.status), 60_000);
  assert.equal(stopped.status, 'idle_stopped', JSON.stringify(stopped));
  assert.match(stopped.message ?? '', /no progress for 2s/);

  // (event streams are bounded per client and in all: test/network/reads.test.ts)
  const stranger = new JobClient(new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }));
  await assert.rejects(stranger.cancel(busy[0].id), (e: unknown) => e instanceof NimbleError && e.status === 403);
  for (const b of busy) assert.equal((await jobs.cancel(b.id)).status, 'cancelled');
  await assert.rejects(jobs.cancel(busy[0].id), (e: unknown) => e instanceof NimbleError && e.status === 409);

  const timedOut = await waitJob(slow.id, (j) => !['waiting', 'started', 'executing'].includes(j.status), 60_000);
  assert.equal(timedOut.status, 'timed_out', JSON.stringify(timedOut));
  assert.match(timedOut.message ?? '', /wall-clock limit/);
  assert.equal((await cluster.run(timedOut.runId!)).status, 'cancelled', 'its run stopped and its miner is free');
  const statuses = (await jobs.events(slow.id)).filter((e) => e.kind === 'status').map((e) => e.status);
  assert.equal(statuses.at(-1), 'timed_out');
});

test('the orchestrator killed with SIGKILL mid-job and restarted: the job, its history and its checkpoints survive and it completes', async () => {
  const job = await jobs.submit(spec({ name: 'restart', steps: 120, checkpointEvery: 20 }));
  const before = await waitJob(job.id, (j) => j.checkpoints.length >= 1 && j.step >= 40);
  const eventsBefore = await jobs.events(job.id);
  cluster.orchestrator!.child.kill('SIGKILL');
  await new Promise((r) => cluster.orchestrator!.child.once('exit', r));
  await cluster.startOrchestrator(['--miner-timeout-ms', '4000']);
  const after = await jobs.get(job.id);
  assert.ok(after.step >= before.step, 'no progress lost');
  for (const c of before.checkpoints) assert.ok(after.checkpoints.some((x) => x.step === c.step && x.sha256 === c.sha256), `checkpoint ${c.step} kept`);
  const eventsAfter = await jobs.events(job.id);
  assert.deepEqual(eventsAfter.slice(0, eventsBefore.length), eventsBefore, 'no event lost or rewritten');
  const done = await waitJob(job.id, (j) => j.status === 'completed' || j.status === 'failed' || j.status === 'idle_stopped', 180_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.equal(done.checkpoints.at(-1)!.step, 120);
});
