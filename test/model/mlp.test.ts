// The plain MLP for tabular data: gradients by finite differences, a short
// training run that learns a non-linear rule, and predictions (argmax).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { AdamW } from '../../src/model/adamw.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { Mlp } from '../../src/model/mlp.ts';
import { checkGradient, fillRandom } from '../helpers/gradcheck.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

test('gradients of every parameter and of the input', () => {
  const mlp = new Mlp(engine, { inputs: 5, hidden: [9, 6], classes: 3 }, 8, 3);
  const x = fillRandom(new Float32Array(8 * 5), 4);
  const y = Int32Array.from([0, 1, 2, 1, 0, 2, 2, 1]);
  mlp.zeroGrad();
  mlp.forward(x, 8, y);
  const dx = mlp.backward().slice();
  const loss = (): number => mlp.forward(x, 8, y) as number;
  for (const name of mlp.params.names()) checkGradient(`mlp ${name}`, mlp.params.get(name).data, mlp.grads.get(name).data.slice(), loss, { eps: 1e-3 });
  checkGradient('mlp input', x, dx, loss, { eps: 1e-3 });
  mlp.release();
});

test('learns XOR of two features', () => {
  const B = 64;
  const mlp = new Mlp(engine, { inputs: 2, hidden: [16], classes: 2 }, B, 1);
  const opt = new AdamW(engine, mlp.params, mlp.grads, { lr: 0.02, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, gradClip: 0 });
  const r = mulberry32(5);
  const x = new Float32Array(B * 2), y = new Int32Array(B);
  let first = NaN, last = NaN;
  for (let step = 0; step < 300; step++) {
    for (let i = 0; i < B; i++) {
      const a = r() < 0.5 ? 0 : 1, b = r() < 0.5 ? 0 : 1;
      x[2 * i] = a + (r() - 0.5) * 0.2;
      x[2 * i + 1] = b + (r() - 0.5) * 0.2;
      y[i] = a ^ b;
    }
    mlp.zeroGrad();
    last = mlp.forward(x, B, y) as number;
    if (step === 0) first = last;
    mlp.backward();
    opt.update();
  }
  assert.ok(first > 0.5 && last < 0.1, `loss ${first} -> ${last}`);
  assert.throws(() => mlp.forward(new Float32Array(2).fill(NaN), 1, new Int32Array(1)), /not finite/);
  opt.release();
  mlp.release();
});

test('predict is the argmax of the logits, row by row', () => {
  const mlp = new Mlp(engine, { inputs: 4, hidden: [6], classes: 3 }, 10, 2);
  const x = fillRandom(new Float32Array(10 * 4), 8);
  const logits = (mlp.forward(x, 10) as Float32Array).slice();
  const predicted = mlp.predict(x, 10);
  assert.equal(predicted.length, 10);
  for (let b = 0; b < 10; b++) {
    const row = Array.from(logits.subarray(b * 3, b * 3 + 3));
    assert.equal(predicted[b], row.indexOf(Math.max(...row)));
  }
  assert.ok(new Set(predicted).size > 1, 'a random net should not give one class to every row');
  // a tie goes to the lowest class: all-zero weights give equal logits
  mlp.params.flat.data.fill(0);
  assert.deepEqual(mlp.predict(x.subarray(0, 8), 2), Int32Array.from([0, 0]));
  assert.throws(() => mlp.predict(x, 11), /up to 10 rows/);
  mlp.release();
});
