// AdamW against a plain double-precision implementation: decay on the decay
// range only, bias correction, and clipping by the global norm.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { AdamW, adamMoveBound, adamStepBound, ADAMW_DEFAULTS, firstOutOfReach, reach } from '../../src/model/adamw.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { FlatTensors, ParamLayout } from '../../src/model/params.ts';
import { fillRandom } from '../helpers/gradcheck.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

test('three steps match the reference, with and without clipping', () => {
  for (const gradClip of [0, 0.5]) {
    const layout = new ParamLayout([
      { name: 'b', shape: [7], decay: false, init: { kind: 'zeros' } },
      { name: 'w', shape: [5, 6], decay: true, init: { kind: 'zeros' } },
    ]);
    assert.equal(layout.decaySize, 30);
    const params = new FlatTensors(layout, engine);
    const grads = new FlatTensors(layout, engine);
    fillRandom(params.flat.data, 1);
    const cfg = { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8, weightDecay: 0.1, gradClip };
    const opt = new AdamW(engine, params, grads, cfg);
    const p = Float64Array.from(params.flat.data);
    const m = new Float64Array(p.length), v = new Float64Array(p.length);
    for (let step = 1; step <= 3; step++) {
      fillRandom(grads.flat.data, 10 + step, 2);
      const g = Float64Array.from(grads.flat.data);
      const norm = Math.sqrt(g.reduce((a, x) => a + x * x, 0));
      const used = opt.update();
      assert.ok(Math.abs(used - norm) < 1e-5);
      const scale = gradClip > 0 && norm > gradClip ? gradClip / norm : 1;
      for (let i = 0; i < p.length; i++) {
        const gi = g[i] * scale;
        m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * gi;
        v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * gi * gi;
        const mhat = m[i] / (1 - cfg.beta1 ** step), vhat = v[i] / (1 - cfg.beta2 ** step);
        const wd = i < layout.decaySize ? cfg.weightDecay : 0;
        p[i] -= cfg.lr * (mhat / (Math.sqrt(vhat) + cfg.eps) + wd * p[i]);
      }
    }
    for (let i = 0; i < p.length; i++) assert.ok(Math.abs(p[i] - params.flat.data[i]) < 1e-5, `param ${i}: ${params.flat.data[i]} vs ${p[i]}`);
    opt.release();
  }
});

test('predict: where the next steps go from the current moments (SpecTrain), θ before the first step', () => {
  const layout = new ParamLayout([{ name: 'w', shape: [40], decay: true, init: { kind: 'zeros' } }]);
  const params = new FlatTensors(layout, engine);
  const grads = new FlatTensors(layout, engine);
  fillRandom(params.flat.data, 2);
  fillRandom(grads.flat.data, 3);
  const opt = new AdamW(engine, params, grads, { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, gradClip: 0 });
  const out = new Float32Array(40);
  assert.deepEqual(opt.predict(out, 3), params.flat.data, 'no moments yet: no prediction');
  opt.update();
  const predicted = opt.predict(new Float32Array(40), 1).slice();
  // with the same gradient again, Adam's second step is exactly the predicted one
  opt.update();
  for (let i = 0; i < 40; i++) assert.ok(Math.abs(predicted[i] - params.flat.data[i]) < 1e-6, `${i}: ${predicted[i]} vs ${params.flat.data[i]}`);
  // d steps ahead is d times one step
  const now = params.flat.data.slice();
  const one = opt.predict(new Float32Array(40), 1);
  const two = opt.predict(new Float32Array(40), 2);
  for (let i = 0; i < 40; i++) assert.ok(Math.abs(two[i] - now[i] - 2 * (one[i] - now[i])) < 1e-6);
  assert.throws(() => opt.predict(new Float32Array(3), 1), RangeError);
  opt.release();
  engine.free(params.flat);
  engine.free(grads.flat);
});

test('adamStepBound is the tightest bound on |m̂/√v̂|: no gradient sequence exceeds it, the worst one approaches it', () => {
  const { beta1, beta2 } = ADAMW_DEFAULTS;
  const B = adamStepBound();
  assert.ok(Math.abs(B - 7.2696) < 1e-3, `B = ${B}`);
  const ratio = (g: (k: number) => number, t: number): number => {
    let m = 0;
    let v = 0;
    for (let k = 0; k < t; k++) {
      m = beta1 * m + (1 - beta1) * g(k);
      v = beta2 * v + (1 - beta2) * g(k) ** 2;
    }
    return Math.abs(m / (1 - beta1 ** t)) / Math.sqrt(v / (1 - beta2 ** t));
  };
  // random gradients stay far below it
  const rand = mulberry32(3);
  for (let trial = 0; trial < 20; trial++) assert.ok(ratio(() => rand() * 2 - 1, 500) < B);
  // the Cauchy–Schwarz equality case: g_k ∝ (β1/β2)^(t−k) (recent gradients largest) comes within 0.1%
  const t = 20_000;
  const worst = ratio((k) => (beta1 / beta2) ** (t - k), t);
  assert.ok(worst <= B * (1 + 1e-9) && worst > B * 0.999, `worst ${worst} vs bound ${B}`);
  // the move bound: decay adds wd·|w| per step, none without decay
  assert.equal(adamMoveBound(0.5, 10, 1e-3, 0), 10 * 1e-3 * B);
  assert.ok(adamMoveBound(0.5, 10, 1e-3, 0.1) > adamMoveBound(0.5, 10, 1e-3, 0));
});

test('firstOutOfReach finds the first weight beyond reach(), in the decayed range or after it', () => {
  const n = 1000, decaySize = 600, steps = 7, lr = 2e-3;
  const rng = mulberry32(3);
  const theta0 = new Float32Array(n).map(() => (rng() - 0.5) * 8);
  const inside = theta0.map((t, i) => t + (rng() < 0.5 ? -1 : 1) * reach(t, i < decaySize, steps, lr) * 0.999);
  assert.equal(firstOutOfReach(inside, theta0, decaySize, steps, lr), -1);
  for (const at of [0, 599, 600, 999, 123, 876]) {
    const w = inside.slice();
    // 0.1% past its own bound; the weights around it stay inside theirs (a decayed weight's bound is larger than a plain one's)
    w[at] = theta0[at] + reach(theta0[at], at < decaySize, steps, lr) * 1.001;
    assert.equal(firstOutOfReach(w, theta0, decaySize, steps, lr), at, `weight ${at}`);
    if (at < 999) w[999] = Number.NaN;
    assert.equal(firstOutOfReach(w, theta0, decaySize, steps, lr), at, 'the first one');
  }
  const nan = inside.slice();
  nan[700] = Number.NaN;
  assert.equal(firstOutOfReach(nan, theta0, decaySize, steps, lr), 700, 'a NaN is never within reach');
});
