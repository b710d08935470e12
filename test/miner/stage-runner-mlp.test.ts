// A miner's stage runner holding an MLP classifier (src/miner/stage-model.ts):
// one step is the spam batch of its shard forward, the loss, backward and an
// AdamW step, exactly as a plain Mlp would take it; replicas merge through the
// same pseudo-gradient and outer step as a GPT stage; its state checkpoints
// round-trip; an assignment it cannot train is refused.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadSpamDataset, spamBatch } from '../../src/data/spam.ts';
import { Engine } from '../../src/engine/engine.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { AdamW, ADAMW_DEFAULTS } from '../../src/model/adamw.ts';
import { encodeModelCheckpoint, layoutTensors, modelCheckpointInfo } from '../../src/model/checkpoint.ts';
import { Mlp } from '../../src/model/mlp.ts';
import { ModelRefError, parseModelRef } from '../../src/model/model-ref.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import type { StageAssignment } from '../../src/protocol/messages.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const model = 'mlp:256-16-2';
const config = { inputs: 256, hidden: [16], classes: 2 };
const B = 8;

function assignment(over: Partial<StageAssignment> = {}): StageAssignment {
  return { runId: 'r1', stage: 0, stageCount: 1, from: 0, to: 1, model, data: 'spam-assassin', batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2, ...over };
}

test('a step of an MLP stage is the shard batch forward, loss, backward and AdamW step of a plain Mlp', async () => {
  const runner = new StageRunner(engine, assignment(), 2);
  assert.equal(runner.paramCount, 256 * 16 + 16 + 16 * 2 + 2);
  assert.equal(runner.tokensPerMicrobatch, B, 'a microbatch is B examples');
  assert.equal(runner.corpus, null);
  const ref = new Mlp(engine, config, B, 7);
  assert.deepEqual(await runner.readWeights(), ref.params.flat.data, 'the same seeded init');
  const opt = new AdamW(engine, ref.params, ref.grads, { ...ADAMW_DEFAULTS, lr: 1e-2 });
  const dataset = loadSpamDataset(256);
  const losses: number[] = [];
  for (let shard = 0; shard < 60; shard++) {
    const { loss, dInput } = await runner.forwardBackwardLast(shard + 1, shard, null);
    assert.equal(dInput, null, 'nothing goes upstream');
    const batch = spamBatch(dataset, 7, shard, B);
    ref.zeroGrad();
    const expected = ref.forward(batch.x, B, batch.y) as number;
    ref.backward();
    opt.update();
    assert.equal(loss, expected, `step ${shard}`);
    losses.push(loss);
  }
  assert.deepEqual(await runner.readWeights(), ref.params.flat.data, 'the same weights after 60 steps');
  assert.equal(runner.samples, 60);
  assert.equal(runner.freeSlotCount, 2, 'each microbatch lets its slot go at once');
  const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  assert.ok(mean(losses.slice(-10)) < mean(losses.slice(0, 10)), `the loss falls: ${mean(losses.slice(0, 10))} → ${mean(losses.slice(-10))}`);
  await assert.rejects(runner.forwardFirst(99, 1), /one stage/);
  opt.release();
  ref.release();
  runner.dispose();
});

test('MLP replicas merge by the outer step of their mean pseudo-gradient and end identical', async () => {
  const a = new StageRunner(engine, assignment(), 2);
  const b = new StageRunner(engine, assignment(), 2);
  const start = (await a.readWeights());
  for (let i = 0; i < 10; i++) {
    await a.forwardBackwardLast(i + 1, 2 * i, null);
    await b.forwardBackwardLast(i + 100, 2 * i + 1, null);
  }
  const wa = (await a.readWeights());
  const wb = (await b.readWeights());
  const da = (await a.pseudoGradient());
  const db = (await b.pseudoGradient());
  for (let i = 0; i < start.length; i += 97) assert.ok(Math.abs(da[i] - (start[i] - wa[i])) < 1e-6, 'pseudo-gradient: start minus now');
  const mean = da.map((x, i) => (x + db[i]) / 2);
  await a.applyOuterStep(mean, 1, 1, 0);
  await b.applyOuterStep(mean, 1, 1, 0);
  const merged = await a.readWeights();
  assert.deepEqual(merged, await b.readWeights(), 'both replicas hold the same weights');
  for (let i = 0; i < start.length; i += 97) assert.ok(Math.abs(merged[i] - (wa[i] + wb[i]) / 2) < 1e-5, 'plain averaging at outer lr 1');
  assert.equal(a.round, 1);
  assert.equal(a.samples, 0);
  assert.ok((await a.pseudoGradient()).every((x) => x === 0), 'the next interval starts at the merged weights');
  a.dispose();
  b.dispose();
});

test("an MLP stage's state round-trips through its checkpoint, and a whole-model checkpoint gives a later run its start", async () => {
  const a = new StageRunner(engine, assignment(), 2);
  for (let i = 0; i < 5; i++) await a.forwardBackwardLast(i + 1, i, null);
  await a.applyOuterStep((await a.pseudoGradient()).map((x) => x * 0.5), 1, 0.7, 0.9);
  const state = (await a.encodeState(1));
  const file = decodeSafetensors(state);
  assert.deepEqual(modelCheckpointInfo(file), { kind: 'mlp', config, from: 0, to: 1, step: 1 });
  assert.equal(file.metadata.outerStep, '1');
  assert.ok(file.tensors.has('outer.momentum'));

  const b = new StageRunner(engine, assignment(), 2);
  b.loadState(state, 1);
  assert.deepEqual(await b.readWeights(), await a.readWeights());
  assert.equal(b.round, 1);
  assert.deepEqual((await b.encodeState(1)), state, 'the same state, byte for byte');

  // a state of another model is refused and the weights stay
  const other = new StageRunner(engine, assignment({ model: 'mlp:256-8-2' }), 2);
  const before = (await b.readWeights());
  const otherState = await other.encodeState(1);
  assert.throws(() => b.loadState(otherState, 1), /not of 'mlp:256-16-2'/);
  assert.deepEqual(await b.readWeights(), before);

  // the whole model as the orchestrator assembles it (no outer tensors) starts a later run
  const whole = encodeModelCheckpoint(parseModelRef(model), layoutTensors(a.trainer.layout, await a.readWeights()), { range: { from: 0, to: 1 }, step: 5, extra: { model } });
  const c = new StageRunner(engine, assignment({ runId: 'r2' }), 2);
  c.loadInitial(whole);
  assert.deepEqual(await c.readWeights(), await a.readWeights());
  assert.ok((await c.pseudoGradient()).every((x) => x === 0));
  for (const r of [a, b, c, other]) r.dispose();
});

test('an MLP assignment the stage cannot train is refused', () => {
  assert.throws(() => new StageRunner(engine, assignment({ stageCount: 2 }), 2), /an MLP is one stage/);
  assert.throws(() => new StageRunner(engine, assignment({ data: 'moby-dick' }), 2), /trains on 'spam-assassin'/);
  assert.throws(() => new StageRunner(engine, assignment({ model: 'mlp:256-16-3' }), 2), /2 classes/);
  assert.throws(() => new StageRunner(engine, assignment({ model: 'mlp:99999-2' }), 2), /features must be an integer from 1 to 16384/);
  assert.throws(() => new StageRunner(engine, assignment({ model: 'mlp:256-16' }), 2), /2 classes/);
  assert.throws(() => new StageRunner(engine, assignment({ model: 'mlp:256-x-2' }), 2), ModelRefError);
  // a GPT on bytes needs the bytes' vocabulary
  assert.throws(() => new StageRunner(engine, assignment({ model: 'gpt:v128.t16.c16.l1.h2.r4', data: 'moby-dick', to: 3 }), 2), /byte data needs 256/);
});

test("a miner takes an MLP stage once its features are built: in the background, the first time, while it keeps serving", async () => {
  const { stageDataReady } = await import('../../src/miner/create-stage-trainer.ts');
  const { loadSpamDatasetAsync } = await import('../../src/data/spam.ts');
  const a = assignment({ model: 'mlp:96-8-2' });
  const lines: string[] = [];
  assert.equal(stageDataReady(a, (l) => lines.push(l)), false, 'not built yet: the build starts');
  let ticks = 0;
  const timer = setInterval(() => ticks++, 5);
  await loadSpamDatasetAsync(96);
  clearInterval(timer);
  assert.ok(ticks >= 3, `the event loop kept turning while it was built (${ticks} timer ticks)`);
  assert.equal(stageDataReady(a), true);
  assert.deepEqual(lines, ['built the spam-assassin features (96 buckets)']);
  // a GPT's, or a reference that does not parse (refused by the runner itself), never waits here
  assert.equal(stageDataReady(assignment({ model: 'gpt-micro', data: 'moby-dick' })), true);
  assert.equal(stageDataReady(assignment({ model: 'mlp:x' })), true);
});
