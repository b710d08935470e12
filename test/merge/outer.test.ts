import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createOuterState, outerStep } from '../../src/merge/outer.ts';
import { bitwiseEqual, expectMergeError, randomVector } from './helpers.ts';

test('Nesterov outer step against a hand computation', () => {
  const state = createOuterState(2, { lr: 0.5, momentum: 0.5 });
  // step 1: m = Δ = [0.5, -1]; θ = θs − 0.5·(Δ + 0.5·m)
  const theta1 = outerStep(state, Float32Array.from([1, 2]), Float32Array.from([0.5, -1]));
  assert.deepEqual(state.momentumBuffer, Float32Array.from([0.5, -1]));
  assert.deepEqual(theta1, Float32Array.from([0.625, 2.75]));
  assert.equal(state.step, 1);
  // step 2: m = 0.5·m + Δ = [0.5, -0.5]; θ = [0.625 − 0.5·(0.25 + 0.25), 2.75 − 0.5·(0 − 0.25)]
  const theta2 = outerStep(state, theta1, Float32Array.from([0.25, 0]));
  assert.deepEqual(state.momentumBuffer, Float32Array.from([0.5, -0.5]));
  assert.deepEqual(theta2, Float32Array.from([0.375, 2.875]));
  assert.equal(state.step, 2);
});

test('defaults lr 0.7, momentum 0.9 against a float64 reference over 5 steps', () => {
  const n = 1000;
  const state = createOuterState(n);
  assert.equal(state.lr, 0.7);
  assert.equal(state.momentum, 0.9);
  let theta = randomVector(n, 1);
  const m = new Float64Array(n);
  let ref = Float64Array.from(theta);
  for (let s = 0; s < 5; s++) {
    const delta = randomVector(n, 10 + s, 0.01);
    theta = outerStep(state, theta, delta);
    for (let i = 0; i < n; i++) {
      m[i] = 0.9 * m[i] + delta[i];
      ref[i] = ref[i] - 0.7 * (delta[i] + 0.9 * m[i]);
    }
    for (let i = 0; i < n; i++) assert.ok(Math.abs(theta[i] - ref[i]) < 1e-5, `step ${s} value ${i}: ${theta[i]} vs ${ref[i]}`);
    ref = Float64Array.from(theta); // compare step by step from the float32 weights
    for (let i = 0; i < n; i++) m[i] = state.momentumBuffer[i];
  }
  assert.equal(state.step, 5);
});

test('two replicas applying the same Δ to the same θ_start stay bitwise identical, in place or not', () => {
  const n = 4099;
  const a = createOuterState(n);
  const b = createOuterState(n);
  let thetaA = randomVector(n, 2);
  const thetaB = thetaA.slice();
  for (let s = 0; s < 10; s++) {
    const delta = randomVector(n, 30 + s, 0.05);
    thetaA = outerStep(a, thetaA, delta); // fresh buffer
    outerStep(b, thetaB, delta.slice(), thetaB); // in place
    assert.ok(bitwiseEqual(thetaA, thetaB), `weights differ after step ${s}`);
    assert.ok(bitwiseEqual(a.momentumBuffer, b.momentumBuffer), `momentum differs after step ${s}`);
  }
});

test('outer state: refuses bad hyperparameters; a refused step leaves the state unchanged', () => {
  const state = createOuterState(4);
  expectMergeError(() => createOuterState(4, { lr: 0 }), 'bad_argument');
  expectMergeError(() => createOuterState(4, { momentum: 1 }), 'bad_argument');
  expectMergeError(() => createOuterState(-1), 'bad_argument');

  const theta = Float32Array.from([1, 2, 3, 4]);
  expectMergeError(() => outerStep(state, theta, new Float32Array(3)), 'length_mismatch');
  expectMergeError(() => outerStep(state, new Float32Array(3), new Float32Array(4)), 'length_mismatch');
  expectMergeError(() => outerStep(state, theta, Float32Array.from([0, NaN, 0, 0])), 'non_finite');
  expectMergeError(() => outerStep(state, theta, Float32Array.from([0, 0, 0, 3e38])), 'non_finite'); // overflows float32
  assert.equal(state.step, 0);
  assert.ok(state.momentumBuffer.every((v) => v === 0));
  assert.deepEqual(theta, Float32Array.from([1, 2, 3, 4]));
});
