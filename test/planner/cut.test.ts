// cutStages: contiguous ranges covering every part, minimizing the largest
// stage's FLOPs (checked against brute force), optionally under a memory cap.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gptConfig, type GptConfig } from '../../src/model/config.ts';
import { partCount, splitEvenly, type StageRange } from '../../src/model/parts.ts';
import { stageCost } from '../../src/planner/cost.ts';
import { PlanError } from '../../src/planner/errors.ts';
import { cutStages } from '../../src/planner/placement.ts';
import { bruteForceMaxFlops, rangeFlops } from './helpers.ts';

const configs: Record<string, GptConfig> = {
  'gpt-micro': gptConfig('gpt-micro'),
  'gpt-tiny': gptConfig('gpt-tiny'),
  // a heavy head (V = 2048) and uneven costs
  'wide-vocab': { vocabSize: 2048, contextLength: 32, channels: 64, layers: 6, heads: 4, mlpRatio: 4 },
};

function assertCovers(ranges: StageRange[], parts: number, stages: number): void {
  assert.equal(ranges.length, stages);
  assert.equal(ranges[0].from, 0);
  assert.equal(ranges[ranges.length - 1].to, parts);
  for (let i = 0; i < ranges.length; i++) {
    assert.ok(ranges[i].from < ranges[i].to, 'non-empty');
    if (i > 0) assert.equal(ranges[i].from, ranges[i - 1].to, 'contiguous');
  }
}

for (const [name, config] of Object.entries(configs)) {
  test(`${name}: every stage count gives contiguous, covering cuts with the brute-force minimum of the largest stage`, () => {
    const P = partCount(config);
    for (let S = 1; S <= P; S++) {
      const ranges = cutStages(config, S);
      assertCovers(ranges, P, S);
      const max = Math.max(...ranges.map((r) => rangeFlops(config, r)));
      assert.equal(max, bruteForceMaxFlops(config, S), `S = ${S}`);
    }
  });
}

test('gpt-tiny cuts, for the record', () => {
  const t = configs['gpt-tiny'];
  assert.deepEqual(cutStages(t, 2), [{ from: 0, to: 3 }, { from: 3, to: 6 }]);
  assert.deepEqual(cutStages(t, 3), [{ from: 0, to: 2 }, { from: 2, to: 4 }, { from: 4, to: 6 }]);
  assert.deepEqual(cutStages(t, 6).map((r) => r.to - r.from), [1, 1, 1, 1, 1, 1]);
});

test('cuts balance compute, not parameters', () => {
  // the embedding holds many parameters but almost no FLOPs
  const config: GptConfig = { vocabSize: 4096, contextLength: 32, channels: 64, layers: 4, heads: 4, mlpRatio: 4 };
  const byParams = splitEvenly(config, 2);
  const byCompute = cutStages(config, 2);
  const worst = (rs: StageRange[]): number => Math.max(...rs.map((r) => rangeFlops(config, r)));
  assert.ok(worst(byCompute) < worst(byParams), `${JSON.stringify(byCompute)} vs ${JSON.stringify(byParams)}`);
});

test('a memory cap keeps every stage under it, at the least cost in FLOPs', () => {
  const t = configs['gpt-tiny'];
  const opts = { batchSize: 8, slots: 2, maxStageMemoryBytes: 30e6 };
  const ranges = cutStages(t, 4, opts);
  assertCovers(ranges, 6, 4);
  for (const r of ranges) assert.ok(stageCost(t, r, 8, 2).memoryBytes.total <= 30e6);
  // without the cap, 3 stages would do; with it, [2,4) (31.6 MB) is too big
  assert.throws(() => cutStages(t, 3, opts), (e: unknown) => e instanceof PlanError && /needs at least 4 stages/.test(e.message));
  assert.throws(
    () => cutStages(t, 6, { ...opts, maxStageMemoryBytes: 10e6 }),
    (e: unknown) => e instanceof PlanError && e.message === 'part 1 (block 0) alone needs 17.4 MB; the cap is 10 MB',
  );
  assert.throws(() => cutStages(t, 2, { maxStageMemoryBytes: 1e6 }), /needs batchSize and slots/);
});

test('stage counts outside [1, parts] are refused', () => {
  assert.throws(() => cutStages(configs['gpt-tiny'], 0), RangeError);
  assert.throws(() => cutStages(configs['gpt-tiny'], 7), /stages must be in \[1, 6\]/);
  assert.throws(() => cutStages(configs['gpt-tiny'], 2.5), RangeError);
});
