// The spam classifier: a short run of the MLP and its logistic-regression
// baseline beats always guessing the common class on held-out mail, and the
// figures it returns agree with each other; accuracy counts argmax hits.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { buildSpamDataset, loadSpamDataset, SPAM_FEATURES, type SpamMessage } from '../../src/data/spam.ts';
import { Engine } from '../../src/engine/engine.ts';
import { Mlp } from '../../src/model/mlp.ts';
import { classifierAccuracy, evaluateClassifier, trainClassifierLocal, type ClassifierStepInfo } from '../../src/train/classifier.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

test('a short run beats the majority class on held-out mail, and its figures agree', () => {
  const dataset = loadSpamDataset();
  const steps = 120;
  const seen: ClassifierStepInfo[] = [];
  const options = { hidden: [16], steps, batchSize: 32, learningRate: 0.01, seed: 7, dataset };
  const r = trainClassifierLocal(engine, { ...options, onStep: (s) => void seen.push(s) });
  const spam = dataset.heldout.y.reduce((n, c) => n + c, 0);
  assert.equal(r.majorityRate, Math.max(spam, dataset.heldout.rows - spam) / dataset.heldout.rows);
  assert.ok(r.accuracy > r.majorityRate + 0.15, `mlp ${r.accuracy} vs majority ${r.majorityRate}`);
  assert.ok(r.baselineAccuracy > r.majorityRate + 0.1, `baseline ${r.baselineAccuracy} vs majority ${r.majorityRate}`);
  for (const a of [r.accuracy, r.baselineAccuracy]) {
    const hits = a * dataset.heldout.rows;
    assert.ok(a <= 1 && Math.abs(hits - Math.round(hits)) < 1e-6, `${a} is not k / ${dataset.heldout.rows}`);
  }
  // below the loss of a coin flip, ln 2
  assert.ok(r.heldoutLoss > 0 && r.heldoutLoss < Math.LN2, `${r.heldoutLoss}`);
  assert.ok(r.baselineHeldoutLoss > 0 && r.baselineHeldoutLoss < Math.LN2, `${r.baselineHeldoutLoss}`);
  assert.equal(r.steps, steps);
  assert.equal(r.params, SPAM_FEATURES * 16 + 16 + 16 * 2 + 2);
  assert.equal(r.baselineParams, SPAM_FEATURES * 2 + 2);
  assert.ok(r.elapsedMs > 0 && r.baselineElapsedMs > 0);
  assert.deepEqual(seen.map((s) => s.step), Array.from({ length: steps }, (_, i) => i + 1));
  assert.ok(seen.every((s) => s.steps === steps && Number.isFinite(s.loss) && Number.isFinite(s.baselineLoss)));
  assert.ok(seen[seen.length - 1].elapsedMs >= r.elapsedMs + r.baselineElapsedMs);
  // same options, same figures
  const again = trainClassifierLocal(engine, options);
  assert.deepEqual([again.accuracy, again.baselineAccuracy, again.heldoutLoss, again.baselineHeldoutLoss], [r.accuracy, r.baselineAccuracy, r.heldoutLoss, r.baselineHeldoutLoss]);
  assert.throws(() => trainClassifierLocal(engine, { ...options, steps: 0 }), /steps/);
});

test('classifierAccuracy counts argmax hits over every row, in batches', () => {
  const messages: SpamMessage[] = Array.from({ length: 40 }, (_, i) => ({
    id: String(i).padStart(5, '0'),
    group: i % 3 ? 'easy-ham-1' : 'spam-1',
    text: `Subject: message ${i}\n\nbody number ${i * 7919}`,
  }));
  const d = buildSpamDataset(messages, 32);
  const mlp = new Mlp(engine, { inputs: 32, hidden: [8], classes: 2 }, 5, 3);
  try {
    for (const split of [d.train, d.heldout]) {
      let hits = 0;
      for (let r = 0; r < split.rows; r++) {
        const [c] = mlp.predict(split.x.subarray(r * 32, (r + 1) * 32), 1);
        if (c === split.y[r]) hits++;
      }
      assert.equal(classifierAccuracy(mlp, split), hits / split.rows);
      const e = evaluateClassifier(mlp, split);
      assert.equal(e.accuracy, hits / split.rows);
      assert.ok(e.loss > 0 && Number.isFinite(e.loss));
    }
    assert.throws(() => classifierAccuracy(mlp, { x: new Float32Array(0), y: new Int32Array(0), rows: 0 }), /empty/);
  } finally {
    mlp.release();
  }
});
