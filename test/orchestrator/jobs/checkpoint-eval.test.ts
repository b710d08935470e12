// The held-out figures the orchestrator records in a job's checkpoints
// (src/orchestrator/jobs/checkpoint-eval.ts), measured on real tiny checkpoints:
// a GPT's loss equals heldoutLoss (src/train/local.ts) on the same held-out
// batches, an MLP's loss and accuracy equal evaluateClassifier over the
// held-out split; the same checkpoint measures the same every time; a corrupt
// checkpoint, one of another model and data that cannot be loaded are refused
// clearly; the event loop runs between batches; a job's checkpoint is
// encoded with the figures, or without them when they cannot be measured.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { datasetId, loadNamedCorpus } from '../../../src/data/dataset.ts';
import { loadSpamDatasetAsync, spamBatch } from '../../../src/data/spam.ts';
import { Engine } from '../../../src/engine/engine.ts';
import { AdamW, ADAMW_DEFAULTS } from '../../../src/model/adamw.ts';
import { encodeModelCheckpoint, encodeStage, loadModelParams, stageTensors } from '../../../src/model/checkpoint.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { partCount } from '../../../src/model/parts.ts';
import { Mlp } from '../../../src/model/mlp.ts';
import { modelParts, parseModelRef, rangeParams } from '../../../src/model/model-ref.ts';
import { decodeSafetensors, encodeSafetensors } from '../../../src/model/safetensors.ts';
import { CheckpointEvaluator, EVAL_BATCHES, gptEvalRows, heldoutMetadata, HELDOUT_SEED, mlpEvalRows } from '../../../src/orchestrator/jobs/checkpoint-eval.ts';
import { RunData } from '../../../src/orchestrator/training/run-data.ts';
import { evaluateClassifier } from '../../../src/train/classifier.ts';
import { heldoutLoss } from '../../../src/train/local.ts';
import { wholeModelBytes } from '../../helpers/whole-model.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

const micro = gptConfig('gpt-micro');
const whole = { from: 0, to: partCount(micro) };

/** A gpt-micro whole-model checkpoint of `seed`'s initial weights. */
function microCheckpoint(seed: number): Uint8Array {
  const stage = new GptStage(engine, micro, whole, { batchSize: 1, seed });
  const bytes = encodeStage(stage, 10);
  stage.release();
  return bytes;
}

test('a GPT checkpoint: its held-out loss is heldoutLoss on the same 4 batches, the same every time, counted in tokens', async () => {
  const evaluator = new CheckpointEvaluator(async () => engine, new RunData());
  const run = { model: 'gpt-micro', batchSize: 8, data: 'moby-dick' };
  const bytes = microCheckpoint(5);
  // the independent computation: a stage loaded from the file, heldoutLoss over the same batches
  const rows = gptEvalRows(rangeParams(parseModelRef('gpt-micro'), whole), micro.contextLength, run.batchSize);
  assert.equal(rows, 8, "gpt-micro evaluates the run's batch size");
  const stage = new GptStage(engine, micro, whole, { batchSize: rows });
  loadModelParams(parseModelRef('gpt-micro'), whole, stage.layout, stage.params.flat.data, decodeSafetensors(bytes));
  const expected = heldoutLoss(stage, loadNamedCorpus('moby-dick'), EVAL_BATCHES, rows, HELDOUT_SEED);
  stage.release();

  // the event loop runs between batches
  let turns = 0;
  let spinning = true;
  const spin = (): void => {
    turns++;
    if (spinning) setImmediate(spin);
  };
  setImmediate(spin);
  const f = await evaluator.evaluate(bytes, run);
  spinning = false;
  assert.ok(turns >= EVAL_BATCHES, `the event loop turned ${turns} times during the evaluation`);

  assert.ok(Number.isFinite(f.loss) && f.loss > 3 && f.loss < 8, `loss ${f.loss} (untrained: about ln 256 = 5.5)`);
  assert.ok(Math.abs(f.loss - expected) < 1e-9, `${f.loss} vs heldoutLoss ${expected}`);
  assert.equal(f.accuracy, null);
  assert.equal(f.items, EVAL_BATCHES * 8 * micro.contextLength);
  assert.deepEqual(heldoutMetadata(f), { heldoutLoss: String(f.loss), heldoutTokens: '512' });
  assert.equal(Number(heldoutMetadata(f).heldoutLoss), f.loss, 'the metadata string reads back exactly');

  // the same checkpoint (bytes or decoded) measures the same; another checkpoint differently
  assert.equal((await evaluator.evaluate(decodeSafetensors(bytes), run)).loss, f.loss);
  assert.notEqual((await evaluator.evaluate(microCheckpoint(6), run)).loss, f.loss);
  assert.equal((await evaluator.evaluate(bytes, run)).loss, f.loss, 'a kept evaluation model loads the weights anew');
  evaluator.close();
  await assert.rejects(evaluator.evaluate(bytes, run), /closing/);
});

test('the cost is bounded: gpt-small evaluates 1,024 tokens, a wide MLP a sample of the held-out split', () => {
  const small = parseModelRef('gpt-small');
  const params = rangeParams(small, { from: 0, to: modelParts(small) });
  assert.equal(gptEvalRows(params, 128, 12) * EVAL_BATCHES * 128, 1024);
  assert.equal(gptEvalRows(params, 128, 1), 1, 'never more than the batch size');
  assert.equal(gptEvalRows(rangeParams(parseModelRef('gpt-tiny'), { from: 0, to: 6 }), 64, 12), 12);
  assert.equal(mlpEvalRows(262_338, 1257), 1257, 'the spam classifier: the whole held-out split');
  assert.equal(mlpEvalRows(2 ** 26, 1257), 89, 'the largest MLP: the first 89 rows');
});

test('an MLP checkpoint: held-out loss and accuracy over the whole split, as evaluateClassifier computes them', async () => {
  const evaluator = new CheckpointEvaluator(async () => engine, new RunData());
  const config = { inputs: 256, hidden: [16], classes: 2 };
  const dataset = await loadSpamDatasetAsync(256);
  // a few training steps, so that it does better than a coin
  const mlp = new Mlp(engine, config, 32, 7);
  const opt = new AdamW(engine, mlp.params, mlp.grads, { ...ADAMW_DEFAULTS, lr: 5e-2 });
  for (let step = 0; step < 200; step++) {
    const b = spamBatch(dataset, 7, step, 32);
    mlp.zeroGrad();
    mlp.forward(b.x, b.B, b.y);
    mlp.backward();
    opt.update();
  }
  opt.release();
  const model = parseModelRef('mlp:256-16-2');
  const bytes = encodeModelCheckpoint(model, stageTensors(mlp), { range: { from: 0, to: 1 }, step: 200 });
  const expected = evaluateClassifier(mlp, dataset.heldout);
  mlp.release();

  const f = await evaluator.evaluate(bytes, { model: 'mlp:256-16-2', batchSize: 32, data: 'spam-assassin' });
  const spam = dataset.heldout.y.reduce((a, y) => a + y, 0);
  const majority = Math.max(spam, dataset.heldout.rows - spam) / dataset.heldout.rows;
  assert.equal(f.items, dataset.heldout.rows, 'every held-out example');
  assert.equal(f.accuracy, expected.accuracy);
  assert.ok(f.accuracy! > majority, `accuracy ${f.accuracy} above the majority class ${majority}`);
  assert.ok(Math.abs(f.loss - expected.loss) < 1e-5, `${f.loss} vs evaluateClassifier ${expected.loss}`);
  assert.deepEqual(Object.keys(heldoutMetadata(f)), ['heldoutLoss', 'heldoutAccuracy', 'heldoutExamples']);
  evaluator.close();
});

test('a corrupt checkpoint, one of another model and data that cannot be loaded are refused with the reason; the next evaluation still runs', async () => {
  const blobs = new Map<string, Uint8Array>();
  const evaluator = new CheckpointEvaluator(async () => engine, new RunData({ get: async (hex: string) => blobs.get(hex) ?? Promise.reject(new Error(`no blob ${hex}`)) }));
  const run = { model: 'gpt-micro', batchSize: 4, data: 'moby-dick' };
  const good = microCheckpoint(9);
  await assert.rejects(evaluator.evaluate(good.subarray(0, good.length - 100), run), { name: 'SafetensorsError' });
  await assert.rejects(evaluator.evaluate(new Uint8Array(16), run), { name: 'SafetensorsError' });
  // a NaN weight
  const file = decodeSafetensors(good);
  const tensors = [...file.tensors.values()].map((t) => ({ ...t, data: t.data.slice() }));
  tensors[0].data[3] = NaN;
  await assert.rejects(evaluator.evaluate(encodeSafetensors(tensors, file.metadata), run), /non-finite value at 3/);
  // a tensor missing
  await assert.rejects(evaluator.evaluate(encodeSafetensors(tensors.slice(1), file.metadata), run), /checkpoint lacks/);
  // another model's checkpoint
  await assert.rejects(evaluator.evaluate(wholeModelBytes(1, 7, gptConfig('gpt-tiny')), run), /not of 'gpt-micro'/);
  await assert.rejects(evaluator.evaluate(good, { ...run, model: 'mlp:256-16-2' }), /not of 'mlp:256-16-2'/);
  // an uploaded dataset: read from the blob store, checked against its id; a missing one is refused
  const text = new TextEncoder().encode('call me ishmael. '.repeat(200));
  const id = datasetId(text);
  await assert.rejects(evaluator.evaluate(good, { ...run, data: id }), /could not be loaded/);
  blobs.set(id.slice('sha256:'.length), text);
  const f = await evaluator.evaluate(good, { ...run, data: id });
  assert.ok(Number.isFinite(f.loss));
  assert.notEqual(f.loss, (await evaluator.evaluate(good, run)).loss, 'on its own bytes, not moby-dick');
  await assert.rejects(evaluator.evaluate(good, { ...run, data: '/etc/passwd' }), /could not be loaded/);
  evaluator.close();
});

test('a checkpoint kept by a job is encoded with its figures, or without them (and the reason logged) when they cannot be measured', async () => {
  const evaluator = new CheckpointEvaluator(async () => engine, new RunData());
  const run = { model: 'gpt-micro', batchSize: 4, data: 'moby-dick' };
  const file = decodeSafetensors(microCheckpoint(11));
  const whole = { model: parseModelRef('gpt-micro'), file, encode: (more = {}) => encodeSafetensors([...file.tensors.values()], { ...file.metadata, ...more }) };
  const errors: string[] = [];
  const measured = await evaluator.encodeMeasured(whole, run, (e) => errors.push(e.message));
  const meta = decodeSafetensors(measured.bytes).metadata;
  assert.equal(Number(meta.heldoutLoss), measured.heldout!.loss);
  assert.equal(meta.heldoutTokens, String(EVAL_BATCHES * 4 * micro.contextLength));
  const unmeasured = await evaluator.encodeMeasured(whole, { ...run, data: '/etc/passwd' }, (e) => errors.push(e.message));
  assert.equal(unmeasured.heldout, null);
  assert.deepEqual(Object.keys(decodeSafetensors(unmeasured.bytes).metadata), Object.keys(file.metadata), 'no held-out keys');
  assert.equal(errors.length, 1);
  assert.match(errors[0], /the data \/etc\/passwd of the run could not be loaded/);
  evaluator.close();
});
