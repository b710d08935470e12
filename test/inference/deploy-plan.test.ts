// Placing a deployed GPT on miners: the memory an inference stage needs is
// what StageInference really allocates (weights, a KV cache per session, one
// call's buffers), and planDeployment cuts the model and takes exactly
// `replicas` miners per stage, the fastest that keep every stage coverable,
// with the fewest stages that fit when the count is not given, and refuses
// with the numbers when nothing fits.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { inferenceStageCost, pickMiners, pickReplacements, planDeployment, inferenceDemands, servingRate, uploadBytesPerToken } from '../../src/inference/deploy-plan.ts';
import { StageInference, stageParamLayout } from '../../src/inference/stage-inference.ts';
import { gptConfig } from '../../src/model/config.ts';
import { partCount } from '../../src/model/parts.ts';
import { PlanError } from '../../src/planner/errors.ts';
import { cutStages } from '../../src/planner/placement.ts';

const TINY = gptConfig('gpt-tiny');
const MICRO = gptConfig('gpt-micro');
const GB = 1e9;

test('an inference stage costs what StageInference allocates: weights, every session’s KV cache, one call’s buffers', async () => {
  const engine = await Engine.create({ threads: 1 });
  try {
    for (const config of [MICRO, TINY]) {
      const P = partCount(config);
      for (const range of [{ from: 0, to: P }, { from: 0, to: 2 }, { from: 2, to: P }, { from: 1, to: 2 }]) {
        for (const sessions of [1, 5]) {
          const cost = inferenceStageCost(config, range, sessions);
          const before = engine.heap.stats().inUse;
          const stage = new StageInference(engine, config, range, new Float32Array(stageParamLayout(config, range).size), { maxSessions: sessions });
          for (let i = 0; i < sessions; i++) stage.join(`s${i}`);
          const used = engine.heap.stats().inUse - before;
          stage.release();
          assert.equal(cost.memoryBytes.weights, stageParamLayout(config, range).size * 4);
          // the heap rounds each allocation up to 64 bytes: at most 16 buffers plus one cache per session
          assert.ok(used >= cost.memoryBytes.total && used - cost.memoryBytes.total <= 64 * (16 + sessions), `[${range.from}, ${range.to}) × ${sessions}: allocated ${used}, costed ${cost.memoryBytes.total}`);
        }
      }
    }
  } finally {
    await engine.close();
  }
});

const miner = (id: string, gflops: number, memoryBytes = GB, bandwidthMbps = 1000) => ({ id, gflops, memoryBytes, bandwidthMbps });

test('a deployment takes exactly `replicas` miners per stage, the fastest, cut as training cuts', () => {
  const miners = [miner('a', 5), miner('b', 50), miner('c', 20), miner('d', 40), miner('e', 10)];
  const plan = planDeployment({ config: TINY, miners, replicas: 2, stages: 2, sessions: 16 });
  assert.deepEqual(plan.stages.map((s) => s.range), cutStages(TINY, 2));
  assert.deepEqual(plan.stages.map((s) => s.miners.length), [2, 2]);
  assert.deepEqual(plan.stages.flatMap((s) => s.miners).sort(), ['b', 'c', 'd', 'e'], 'the slowest miner is left out');
  // the assigner balances the picked speeds: the fastest and the slowest of them share a stage
  assert.ok(plan.stages.some((s) => s.miners.includes('b') && s.miners.includes('e')), JSON.stringify(plan.stages.map((s) => s.miners)));
  assert.equal(plan.bottleneckTokensPerS, Math.min(...plan.stages.map((s) => s.throughputTokensPerS)));
  for (const s of plan.stages) assert.equal(s.memoryBytes, inferenceStageCost(TINY, s.range, 16).memoryBytes.total);
});

test('without a stage count the fewest stages that fit are taken; a miner too small for the whole model makes it cut', () => {
  const whole = inferenceStageCost(TINY, { from: 0, to: partCount(TINY) }, 16).memoryBytes.total;
  assert.equal(planDeployment({ config: TINY, miners: [miner('a', 10), miner('b', 10)], replicas: 1, sessions: 16 }).stages.length, 1);
  const small = [miner('a', 10, whole * 0.7), miner('b', 10, whole * 0.7)];
  const cut = planDeployment({ config: TINY, miners: small, replicas: 1, sessions: 16 });
  assert.equal(cut.stages.length, 2);
  assert.deepEqual(cut.stages.map((s) => s.miners.length), [1, 1]);
});

test('memory decides who holds which stage: the big stage goes to the miner that fits it', () => {
  const ranges = cutStages(MICRO, 2);
  const demands = inferenceDemands(MICRO, ranges, 16);
  const big = Math.max(...demands.map((d) => d.memoryBytes));
  const small = Math.min(...demands.map((d) => d.memoryBytes));
  assert.ok(big > small);
  // the fastest miner fits only the small stage: the big one takes the slower miner that fits it
  const miners = [miner('fast-small', 100, small), miner('slow-big', 1, big), miner('mid-small', 50, small)];
  const plan = planDeployment({ config: MICRO, miners, replicas: 1, stages: 2, sessions: 16 });
  const bigStage = demands.findIndex((d) => d.memoryBytes === big);
  assert.deepEqual(plan.stages[bigStage].miners, ['slow-big']);
  assert.deepEqual(plan.stages[1 - bigStage].miners, ['fast-small']);
  assert.deepEqual(pickMiners(demands, miners, 1).map((m) => m.id).sort(), ['fast-small', 'slow-big']);
});

test('a deployment that cannot fit is refused with the numbers', () => {
  assert.throws(() => planDeployment({ config: TINY, miners: [], replicas: 1, sessions: 16 }), (e: unknown) => e instanceof PlanError && /no miner serving inference is free/.test(e.message));
  assert.throws(
    () => planDeployment({ config: TINY, miners: [miner('a', 10)], replicas: 1, stages: 2, sessions: 16 }),
    (e: unknown) => e instanceof PlanError && /2 stages need at least 2 miners; 1 available/.test(e.message),
  );
  assert.throws(
    () => planDeployment({ config: TINY, miners: [miner('a', 10, 1000), miner('b', 10, 1000)], replicas: 1, sessions: 16 }),
    (e: unknown) => e instanceof PlanError && /needs .*B; the largest miner has 1 kB/.test(e.message),
  );
  assert.throws(() => planDeployment({ config: TINY, miners: [miner('a', 10)], replicas: 0, sessions: 16 }), RangeError);
  assert.throws(() => planDeployment({ config: TINY, miners: [miner('a', 10)], replicas: 1, stages: partCount(TINY) + 1, sessions: 16 }), RangeError);
});

test('replacements are the fastest free miners that fit the stage', () => {
  const load = { flopsPerToken: 1e6, uploadBytesPerToken: 512 };
  const picked = pickReplacements(500, load, [miner('a', 5, 1000), miner('b', 50, 100), miner('c', 20, 600), miner('d', 40, 500)], 2);
  assert.deepEqual(picked.map((m) => m.id), ['d', 'c']);
  assert.deepEqual(pickReplacements(500, load, [miner('b', 50, 100)], 1), []);
  // by serving rate: a fast miner on a thin uplink serves fewer tokens than a slower one on a good link; no uplink, no pick
  const thin = pickReplacements(500, load, [miner('fast-thin', 40, 600, 0.4), miner('slow-wide', 20, 600, 100), miner('mute', 90, 600, 0)], 3);
  assert.deepEqual(thin.map((m) => m.id), ['slow-wide', 'fast-thin']);
});

test('upload bandwidth: a replica serves at the lesser of its compute and its upload over the row it sends per token; a miner with no upload serves nothing', () => {
  const P = partCount(TINY);
  assert.equal(uploadBytesPerToken(TINY, { from: 0, to: 2 }), TINY.channels * 2, 'an f16 activation row');
  assert.equal(uploadBytesPerToken(TINY, { from: 2, to: P }), TINY.vocabSize * 4, 'the last stage sends f32 logits');
  const load = { flopsPerToken: 2e6, uploadBytesPerToken: 1000 };
  assert.equal(servingRate(miner('m', 10, GB, 1000), load), 5_000, 'compute: 10 GFLOP/s over 2 MFLOP');
  assert.equal(servingRate(miner('m', 10, GB, 0.8), load), 100, 'upload: 0.8 Mbit/s over 1,000 bytes');
  assert.equal(servingRate(miner('m', 10, GB, 0), load), 0);
  // two stages; the fastest miner's link is too thin to keep up: the plan says so and counts its tokens/s at its upload
  const plan = planDeployment({ config: TINY, miners: [miner('fast-thin', 100, GB, 0.05), miner('b', 20), miner('c', 20), miner('mute', 500, GB, 0)], replicas: 1, stages: 2, sessions: 16 });
  const ids = plan.stages.flatMap((s) => s.miners);
  assert.ok(!ids.includes('mute'), 'a miner with no upload is never picked');
  assert.deepEqual(ids.sort(), ['b', 'c'], 'the miners whose links keep up are picked before the fast one on a thin link');
  for (const s of plan.stages) assert.equal(s.limitedBy, 'compute');
  const thin = planDeployment({ config: TINY, miners: [miner('fast-thin', 100, GB, 0.05)], replicas: 1, sessions: 16 });
  assert.equal(thin.stages[0].limitedBy, 'upload');
  assert.equal(thin.stages[0].throughputTokensPerS, (0.05e6 / 8) / (TINY.vocabSize * 4));
  assert.equal(thin.bottleneckTokensPerS, thin.stages[0].throughputTokensPerS);
  assert.throws(
    () => planDeployment({ config: TINY, miners: [miner('mute', 500, GB, 0), miner('mute2', 5, GB, 0)], replicas: 1, sessions: 16 }),
    (e: unknown) => e instanceof PlanError && /2 free miners serving inference report no upload bandwidth/.test(e.message),
  );
});
