// `nbcli up --job FILE` end to end: the whole local network (an orchestrator
// and a miner child process, unpaid) trains a tiny job from its spec file,
// follows it to completion, prints where its checkpoints download, and keeps
// serving so the printed download command works; Ctrl+C stops everything.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { Cluster, type Proc } from './helpers.ts';

const cluster = new Cluster();
let up: Proc | null = null;

/** SIGINT (up's Ctrl+C, which stops its miners), then the exit code. */
async function interrupt(p: Proc): Promise<number | null> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return p.child.exitCode;
  const exited = new Promise<number | null>((r) => p.child.once('exit', (code) => r(code)));
  p.child.kill('SIGINT');
  return Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), 15_000).unref())]);
}

after(async () => {
  if (up) await interrupt(up);
  await cluster.stop();
});

const spec: JobSpec = { name: 'up-micro', model: 'gpt-micro', data: 'moby-dick', training: { steps: 20, batchSize: 8, mergeEvery: 10 }, checkpointEvery: 10 };

test('up --job trains the job on a local network to completion and prints how to download its checkpoints', { timeout: 60_000 }, async () => {
  const file = join(cluster.dir, 'nimble.job.json');
  writeFileSync(file, JSON.stringify(spec));
  const home = join(cluster.dir, 'home');
  up = cluster.spawnNbcli(['up', '--job', file, '--miners', '1', '--no-chain', '--port', '0', '--data-dir', home], home);

  const printed = await up.waitFor((v) => v.event === 'checkpoints', 50_000);
  const events = up.lines.flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
  const submitted = events.find((e) => e.event === 'submitted')!;
  assert.ok(submitted, 'the job was submitted');
  const id = submitted.id as string;
  assert.equal(submitted.miners, 1, 'submitted once the miner joined');
  // followed as `nbcli job follow` prints it: status events, then the end
  const statuses = events.filter((e) => e.event === 'job' && e.kind === 'status').map((e) => e.status);
  assert.deepEqual(statuses.slice(-2), ['executing', 'completed'], `statuses: ${statuses.join(' ')}`);
  const ended = events.find((e) => e.event === 'ended')!;
  assert.equal(ended.status, 'completed', JSON.stringify(ended));
  assert.equal(ended.step, 20);

  // its checkpoints, and the command that downloads them from this network
  assert.equal(printed.id, id);
  const checkpoints = printed.checkpoints as { step: number; sha256: string; bytes: number }[];
  assert.equal(checkpoints.at(-1)?.step, 20, JSON.stringify(checkpoints));
  const download = printed.download as string[];
  assert.equal(download[0], 'nbcli');
  const out = join(cluster.dir, 'final.safetensors');
  const got = await cluster.nbcli([...download.slice(1), '--out', out], join(cluster.dir, 'dev'));
  assert.equal(got.code, 0, got.stderr);
  const bytes = readFileSync(out);
  assert.equal(bytes.length, checkpoints.at(-1)!.bytes);
  assert.equal(createHash('sha256').update(bytes).digest('hex'), checkpoints.at(-1)!.sha256);

  await up.waitFor((v) => v.event === 'serving');
  assert.equal(await interrupt(up), 130, 'Ctrl+C stops up and its miners');
});

test('up --job refuses the demo run\'s options and an invalid spec before starting anything', async () => {
  const file = join(cluster.dir, 'nimble.job.json');
  writeFileSync(file, JSON.stringify(spec));
  const home = join(cluster.dir, 'refused');
  const steps = await cluster.nbcli(['up', '--job', file, '--steps', '5', '--no-chain', '--port', '0', '--data-dir', home], home);
  assert.notEqual(steps.code, 0);
  assert.match(steps.stderr, /--steps is for the demo run only/);
  const bad = join(cluster.dir, 'bad.job.json');
  writeFileSync(bad, JSON.stringify({ ...spec, model: 'gpt-9' }));
  const invalid = await cluster.nbcli(['up', '--job', bad, '--no-chain', '--port', '0', '--data-dir', home], home);
  assert.notEqual(invalid.code, 0);
  assert.match(invalid.stderr, /\/model: expected a model name/);
});

test('up (the demo run) trains, publishes the model on the local chain, deploys it on its miners and prints a generation served through them', { timeout: 150_000 }, async () => {
  const home = join(cluster.dir, 'demo');
  process.env.NIMBLE_CHAIN_RPC = '';
  const run = await cluster.nbcli(['up', '--model', 'gpt-micro', '--steps', '16', '--miners', '2', '--stages', '2', '--eval-batches', '2', '--min-stake', '0', '--port', '0', '--data-dir', home], home);
  assert.equal(run.code, 0, run.stderr);
  const event = (name: string): Record<string, unknown> => {
    const e = run.out.find((v) => v.event === name);
    assert.ok(e, `no '${name}' event in ${run.out.map((v) => v.event).join(' ')}`);
    return e;
  };
  const published = event('published');
  assert.match(String(published.tx), /^0x[0-9a-f]{64}$/, 'published on the chain by up');
  const deployed = event('deployed').deployment as { status: string; stages: { miners: { state: string }[] }[] };
  assert.equal(deployed.status, 'serving');
  assert.equal(deployed.stages.length, 2, 'served across the 2 stage miners');
  const served = event('served');
  assert.equal(served.sha256, published.sha256);
  assert.equal(typeof served.text, 'string');
  // 200 tokens of bytes: at least 50 characters whatever UTF-8 the model made up
  assert.ok((served.text as string).length >= 50, `a generation of ${(served.text as string).length} characters`);
});
