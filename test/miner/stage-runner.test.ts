import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import type { StageModel } from '../../src/miner/stage-model.ts';
import { HostStageTrainer } from '../../src/miner/stage-trainer-host.ts';
import { gptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { mulberry32 } from '../../src/model/init.ts';
import type { StageAssignment } from '../../src/protocol/messages.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const model = 'gpt-micro';
const B = 2;

/** The stage model of a runner whose trainer keeps its weights in host memory (a WASM stage). */
function stageOf(r: StageRunner): StageModel {
  assert.ok(r.trainer instanceof HostStageTrainer);
  return r.trainer.stage;
}

function assignment(stage: number, stageCount: number): StageAssignment {
  const range = splitEvenly(gptConfig(model), stageCount)[stage];
  return {
    runId: 'r1', stage, stageCount, from: range.from, to: range.to, model, data: 'moby-dick',
    batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2,
  };
}

function randomArray(n: number, seed: number, scale = 1): Float32Array {
  const rand = mulberry32(seed);
  return Float32Array.from({ length: n }, () => (rand() * 2 - 1) * scale);
}

test('a delayed backward uses the weights its forward used (weight stashing)', async () => {
  const config = gptConfig(model);
  const a = assignment(1, 3); // a middle stage: backward returns d(input)
  const runner = new StageRunner(engine, a, 2);
  const T = config.contextLength;
  const width = B * T * config.channels;
  const w0 = stageOf(runner).params.flat.data.slice();
  const x1 = randomArray(width, 1);
  const x2 = randomArray(width, 2);
  const g1 = randomArray(width, 3, 1e-3);
  const g2 = randomArray(width, 4, 1e-3);

  await runner.forwardMiddle(1, x1);
  await runner.forwardMiddle(2, x2);
  await runner.backward(2, g2); // inner step: the weights move
  assert.notDeepEqual(stageOf(runner).params.flat.data, w0);
  const wAfterFirstStep = stageOf(runner).params.flat.data.slice();
  const d1 = await runner.backward(1, g1);
  assert.ok(d1);

  // reference: the same forward and backward on a stage holding w0
  const ref = new GptStage(engine, config, { from: a.from, to: a.to }, { batchSize: B });
  ref.params.flat.data.set(w0);
  ref.forward(x1, B, T);
  ref.zeroGrad();
  const dRef = ref.backward(g1);
  assert.ok(dRef);
  assert.deepEqual(d1, dRef.slice(), 'd(input) is the gradient at the forward weights');
  assert.deepEqual(stageOf(runner).grads.flat.data.slice(), ref.grads.flat.data.slice(), 'parameter gradients too');
  // and the inner step moved the current weights, not the stashed ones
  assert.notDeepEqual(stageOf(runner).params.flat.data, wAfterFirstStep);
  assert.notDeepEqual(stageOf(runner).params.flat.data, w0);
  ref.release();
  runner.dispose();
});

test('a first stage stashes too: its parameter gradient matches the forward weights', async () => {
  const config = gptConfig(model);
  const a = assignment(0, 2);
  const runner = new StageRunner(engine, a, 2);
  const T = config.contextLength;
  const width = B * T * config.channels;
  const w0 = stageOf(runner).params.flat.data.slice();
  await runner.forwardFirst(1, 10);
  await runner.forwardFirst(2, 11);
  await runner.backward(2, randomArray(width, 5, 1e-3));
  const g1 = randomArray(width, 6, 1e-3);
  assert.equal(await runner.backward(1, g1), null);

  const ref = new StageRunner(engine, a, 1);
  stageOf(ref).params.flat.data.set(w0);
  await ref.forwardFirst(1, 10);
  const before = stageOf(ref).params.flat.data.slice();
  stageOf(ref).zeroGrad();
  await stageOf(ref).backward(g1, 0, stageOf(ref).params.flat.data);
  assert.deepEqual(stageOf(runner).grads.flat.data.slice(), stageOf(ref).grads.flat.data.slice());
  assert.deepEqual(stageOf(ref).params.flat.data.slice(), before);
  ref.dispose();
  runner.dispose();
});

test('a forward behind others in flight runs at the predicted weights, and its backward uses them', async () => {
  const config = gptConfig(model);
  const a = assignment(1, 3);
  const runner = new StageRunner(engine, a, 3);
  const T = config.contextLength;
  const width = B * T * config.channels;
  // one inner step so AdamW has moments
  await runner.forwardMiddle(1, randomArray(width, 1));
  await runner.backward(1, randomArray(width, 2, 1e-3));
  const current = stageOf(runner).params.flat.data.slice();
  await runner.forwardMiddle(2, randomArray(width, 3)); // nothing in flight: the current weights
  const kept2 = runner.keepForwardWeights(2)!;
  assert.deepEqual(await kept2.weights.read(), current);
  assert.equal(kept2.predictedSteps, 0);
  kept2.weights.release();
  const x3 = randomArray(width, 4);
  await runner.forwardMiddle(3, x3); // one in flight: one step ahead
  const used = runner.keepForwardWeights(3)!;
  assert.equal(used.predictedSteps, 1);
  const stashed = await used.weights.read();
  used.weights.release();
  assert.notDeepEqual(stashed, current);
  assert.deepEqual(stageOf(runner).params.flat.data.slice(), current, 'the current weights are untouched by the prediction');
  let worst = 0;
  for (let i = 0; i < current.length; i++) worst = Math.max(worst, Math.abs(stashed[i] - current[i]));
  assert.ok(worst > 0 && worst <= 1e-2 * 7.3, `moved ${worst}`);

  await runner.backward(2, randomArray(width, 5, 1e-3));
  const g3 = randomArray(width, 6, 1e-3);
  const d3 = await runner.backward(3, g3);
  const ref = new GptStage(engine, config, { from: a.from, to: a.to }, { batchSize: B });
  ref.params.flat.data.set(stashed);
  const out = (ref.forward(x3, B, T) as Float32Array).slice();
  ref.zeroGrad();
  assert.deepEqual(d3, (ref.backward(g3) as Float32Array).slice());
  assert.ok(out.length === width);
  ref.release();
  runner.dispose();
});

test('in flight: the miner slots, at most one more than the stages from here to the end (1F1B + 1)', async () => {
  const { inFlightLimit } = await import('../../src/miner/stage-runner.ts');
  assert.equal(inFlightLimit({ stage: 0, stageCount: 2 }, 3), 3);
  assert.equal(inFlightLimit({ stage: 0, stageCount: 2 }, 8), 3);
  assert.equal(inFlightLimit({ stage: 1, stageCount: 2 }, 3), 2);
  assert.equal(inFlightLimit({ stage: 2, stageCount: 4 }, 8), 3);
  assert.equal(inFlightLimit({ stage: 0, stageCount: 1 }, 3), 2);
  assert.equal(inFlightLimit({ stage: 0, stageCount: 8 }, 1), 1);
});

test('the stage state is a checkpoint with the outer momentum, byte for byte as before', async () => {
  const { CHECKPOINT_FORMAT, stageTensors } = await import('../../src/model/checkpoint.ts');
  const { encodeSafetensors } = await import('../../src/model/safetensors.ts');
  const a = assignment(1, 3);
  const runner = new StageRunner(engine, a, 1);
  const old = encodeSafetensors(
    [...stageTensors(stageOf(runner)), { name: 'outer.momentum', shape: [runner.paramCount], data: new Float32Array(runner.paramCount) }],
    { format: CHECKPOINT_FORMAT, config: JSON.stringify(gptConfig(model)), from: String(a.from), to: String(a.to), step: '3', outerStep: '0' },
  );
  assert.deepEqual(await runner.encodeState(3), old);
  runner.dispose();
});
