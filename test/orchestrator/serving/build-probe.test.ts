// The cross-build probe (src/orchestrator/serving/build-probe.ts) and the
// checks' replay on the other kernel build (check-verify.ts), on real
// engines of both builds: a model with huge opposing weights before a
// normalization puts honest miners of the two builds past the training
// checks' thresholds (an honest plain-SIMD miner's window fails against the
// relaxed replay: what got honest miners slashed); with the probe's
// thresholds and the other build's replay it passes, bit for bit, while a
// miner that changes its answers still fails; a model whose builds are too
// far apart for any check is refused at deploy.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { inferenceFromCheckpoint } from '../../../src/inference/load.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount } from '../../../src/model/parts.ts';
import { probeBuilds, thresholdsFor, SEPARABLE } from '../../../src/orchestrator/serving/build-probe.ts';
import type { RecordedWindow } from '../../../src/orchestrator/serving/check-recorder.ts';
import { verifyWindow } from '../../../src/orchestrator/serving/check-verify.ts';
import { CHECK_THRESHOLDS } from '../../../src/orchestrator/training/spot-check-verify.ts';
import { opposingWeightsBytes, wholeModelBytes } from '../../helpers/whole-model.ts';

const CONFIG = gptConfig('gpt-micro');
const P = partCount(CONFIG);
let relaxed: Engine;
let plain: Engine;

before(async () => {
  relaxed = await Engine.create({ threads: 1, simd: 'relaxed' });
  plain = await Engine.create({ threads: 1, simd: 'plain' });
  assert.equal(relaxed.relaxedSimd, true);
  assert.equal(plain.relaxedSimd, false);
});
after(async () => {
  await relaxed.close();
  await plain.close();
});

/** A window of parts [from, to) answered by a miner on `engine` (its first stage fed tokens, the others rows of activations), maybe tampered with. */
function window(engine: Engine, bytes: Uint8Array, from: number, to: number, tamper?: (out: Float32Array) => void): RecordedWindow {
  const stage = inferenceFromCheckpoint(engine, bytes, { from, to }, { maxSessions: 1 });
  const feed = from === 0 ? null : inferenceFromCheckpoint(engine, bytes, { from: 0, to: from }, { maxSessions: 1 });
  try {
    stage.join('s');
    feed?.join('s');
    const steps: RecordedWindow['steps'] = [];
    const tokens = [Int32Array.from([5, 77, 140, 32, 9, 201, 66, 3, 180, 12]), Int32Array.of(99), Int32Array.of(250), Int32Array.of(17)];
    for (const t of tokens) {
      const input = feed ? feed.run([{ session: 's', input: t }]) : Float32Array.from(t);
      const output = stage.run([{ session: 's', input: feed ? input : t }]);
      tamper?.(output);
      steps.push({ input, output });
    }
    return { deploymentId: 'dep-x', sha256: 'x', model: 'gpt-micro', stage: from === 0 ? 0 : 1, minerId: '0xm', session: 's', seq: 1, steps, bytes: 0 };
  } finally {
    stage.release();
    feed?.release();
  }
}

const noise = (out: Float32Array): void => out.forEach((v, i) => (out[i] = v * (1 + 0.2 * Math.sin(i * 12.9898)) + 0.01 * Math.cos(i)));

test('an ordinary model: the two builds are far inside the checks, which keep the training thresholds', async () => {
  const r = await probeBuilds('x', wholeModelBytes(41, 500), relaxed, plain);
  assert.equal(r.refused, null);
  assert.equal(r.ranges.length, (P * (P + 1)) / 2, 'every range of parts');
  for (const d of r.ranges) assert.deepEqual(thresholdsFor(d), CHECK_THRESHOLDS.f16, `[${d.from}, ${d.to})`);
  assert.ok(r.worst.oneMinusCosine < 1e-10);
});

test('opposing weights before a norm: an honest plain-SIMD window fails the training thresholds against the relaxed replay, passes with the probe and the other build, and noise still fails', async () => {
  const bytes = opposingWeightsBytes(3e4);
  const r = await probeBuilds('x', bytes, relaxed, plain);
  assert.equal(r.refused, null, 'checks with looser thresholds still separate');
  const cut = { from: 0, to: 3 };
  const d = r.ranges.find((x) => x.from === cut.from && x.to === cut.to)!;
  const t = thresholdsFor(d);
  assert.ok(t.maxNormDeviation > CHECK_THRESHOLDS.f16.maxNormDeviation, `the probe loosened [0, 3): ${JSON.stringify(d)}`);
  assert.ok(t.minCosine >= SEPARABLE.minCosine && t.maxNormDeviation <= SEPARABLE.maxNormDeviation);

  const replay = inferenceFromCheckpoint(relaxed, bytes, cut, { maxSessions: 1 });
  const other = inferenceFromCheckpoint(plain, bytes, cut, { maxSessions: 1 });
  try {
    const honest = window(plain, bytes, cut.from, cut.to);
    // what the checks did before: the relaxed replay alone, the training thresholds: an honest miner fails
    const before = await verifyWindow(replay, honest);
    assert.equal(before.passed, false, before.detail);
    // now, each defence alone passes it: the probe's thresholds on the relaxed replay…
    const probed = await verifyWindow(replay, honest, { thresholds: t });
    assert.equal(probed.passed, true, probed.detail);
    // …and the other build's replay, bit for bit, under the training thresholds
    const crossed = await verifyWindow(replay, honest, { other });
    assert.equal(crossed.passed, true, crossed.detail);
    // the steps that failed on the relaxed replay are the plain replay's bit for bit
    assert.ok(crossed.otherBuild > 0 && crossed.exact >= crossed.otherBuild, crossed.detail);
    assert.match(crossed.detail, /matching the other kernel build's recomputation/);
    assert.equal((await verifyWindow(replay, honest, { thresholds: t, other })).passed, true);
    // a relaxed-SIMD miner is exact on the first replay, the other never run
    assert.equal((await verifyWindow(replay, window(relaxed, bytes, cut.from, cut.to), { thresholds: t, other })).otherBuild, 0);
    // a miner that changes its answers fails on both builds, on either build of its own
    for (const engine of [plain, relaxed]) {
      const cheat = await verifyWindow(replay, window(engine, bytes, cut.from, cut.to, noise), { thresholds: t, other });
      assert.equal(cheat.passed, false, cheat.detail);
      assert.match(cheat.detail, /off the recomputation on both kernel builds/);
    }
  } finally {
    replay.release();
    other.release();
  }
});

test('a model whose builds are too far apart for any check is refused, naming the range and the deviation', async () => {
  const r = await probeBuilds('x', opposingWeightsBytes(1e6), relaxed, plain);
  assert.ok(r.refused);
  assert.match(r.refused, /answer parts \[\d, \d\) of this model up to 1 − cosine [\d.e+-]+, norm ratio deviation [\d.e+-]+ apart/);
  assert.match(r.refused, /would not catch a miner that changes its answers/);
});
