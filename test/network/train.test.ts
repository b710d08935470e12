// A run with 2 stages and 4 miners (real processes) trains: the loss falls,
// merges happen, every miner's work is logged, and the merged model is served.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stop());

test('2 stages x 2 replicas train gpt-micro: the loss falls and replicas merge', async () => {
  await cluster.startOrchestrator();
  await Promise.all(['a', 'b', 'c', 'd'].map((n, i) => cluster.startMiner(n, ['--throttle', String([1, 0.8, 0.6, 0.5][i])])));
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 160, stages: 2, mergeEvery: 10, batchSize: 8, lr: 0.003, minMiners: 4 });
  const losses: number[] = [];
  const done = await cluster.waitRun(run.id, (v) => {
    if (v.loss !== null) losses.push(v.loss);
    return v.status === 'completed' || v.status === 'failed';
  });
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.equal(done.microbatchesDone, 160);
  assert.equal(done.stages.length, 2);
  for (const s of done.stages) {
    assert.equal(s.replicas.length, 2, `stage ${s.stage} replicas`);
    assert.ok(s.round >= 2, `stage ${s.stage} merged ${s.round} times`);
    assert.equal(s.mode, 'training');
  }
  assert.ok(done.mergesDone >= 2);
  assert.ok(losses.length > 5);
  const early = losses.slice(0, 3).reduce((a, b) => a + b, 0) / 3;
  const late = losses.slice(-3).reduce((a, b) => a + b, 0) / 3;
  assert.ok(early > 4.5 && late < early - 1, `loss ${early.toFixed(3)} -> ${late.toFixed(3)}`);
  assert.ok(done.bytesSent > 0);
  // every miner did forward and backward work; merges were logged
  const work = await cluster.api.work();
  const miners = new Set(work.filter((w) => w.kind === 'forward' && w.units > 0).map((w) => w.miner));
  assert.equal(miners.size, 4);
  assert.ok(work.some((w) => w.kind === 'merge' && w.units > 0));
  // the merged model is one whole checkpoint
  const ckpt = await cluster.api.checkpoint(run.id);
  const info = checkpointInfo(decodeSafetensors(ckpt));
  assert.equal(info.from, 0);
  assert.equal(info.to, 4);
});
