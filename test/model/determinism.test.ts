// Same seed, same parameters after N steps, bit for bit, whatever the thread
// count: kernels split work so that no sum depends on how many threads run.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { splitCorpus } from '../../src/data/corpus.ts';
import { trainLocal } from '../../src/train/local.ts';

const text = new TextEncoder().encode('Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly November in my soul. '.repeat(40));

async function paramsAfter(threads: number, steps: number): Promise<{ params: Float32Array; loss: number }> {
  const engine = await Engine.create({ threads });
  try {
    const r = trainLocal(engine, { model: 'gpt-micro', corpus: splitCorpus('t', text), steps, batchSize: 4, evalBatches: 2, seed: 9 });
    const params = r.stage.params.flat.data.slice();
    r.stage.release();
    return { params, loss: r.finalLoss };
  } finally {
    await engine.close();
  }
}

test('1 and 3 threads give bitwise-identical parameters after 6 steps', async () => {
  const one = await paramsAfter(1, 6);
  const three = await paramsAfter(3, 6);
  assert.equal(one.loss, three.loss);
  assert.deepEqual(three.params, one.params);
});

test('a different seed gives different parameters', async () => {
  const engine = await Engine.create({ threads: 2 });
  try {
    const a = trainLocal(engine, { model: 'gpt-micro', corpus: splitCorpus('t', text), steps: 1, batchSize: 2, evalBatches: 1, seed: 1 });
    const b = trainLocal(engine, { model: 'gpt-micro', corpus: splitCorpus('t', text), steps: 1, batchSize: 2, evalBatches: 1, seed: 2 });
    assert.notDeepEqual(a.stage.params.flat.data.slice(), b.stage.params.flat.data.slice());
    a.stage.release();
    b.stage.release();
  } finally {
    await engine.close();
  }
});
