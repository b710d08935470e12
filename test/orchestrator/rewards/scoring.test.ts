// Scoring (pure): weights by parameter share, penalties, proportional split,
// conservation of the emission.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount, rangeParamCount, splitEvenly } from '../../../src/model/parts.ts';
import { DROPPED_PENALTY, FAILED_CHECK_PENALTY, INVALID_PENALTY, scoreEpoch, splitEmission, stageSharesOf, unitWeight, type WorkRow } from '../../../src/orchestrator/rewards/scoring.ts';
import { prng } from '../../chain/helpers.ts';

const A = '0x00000000000000000000000000000000000000aA';
const B = '0x00000000000000000000000000000000000000bB';
const C = '0x00000000000000000000000000000000000000cC';
const row = (minerId: string, kind: WorkRow['kind'], stage: number | null, units = 1, runId: string | null = 'r'): WorkRow => ({ minerId, kind, stage, units, runId });

test('stage shares are the stages’ shares of the model’s parameters', () => {
  const config = gptConfig('gpt-tiny');
  const ranges = [{ from: 0, to: 2 }, { from: 2, to: partCount(config) }];
  const shares = stageSharesOf('gpt-tiny', ranges);
  const total = rangeParamCount(config, { from: 0, to: partCount(config) });
  assert.equal(shares[0], rangeParamCount(config, ranges[0]) / total);
  assert.ok(Math.abs(shares[0] + shares[1] - 1) < 1e-12);
  const even = stageSharesOf('gpt-tiny', splitEvenly(config, 2));
  assert.ok(Math.abs(even[0] - 0.5) < 0.2);
});

test('work is weighted by the stage’s parameter share; merges likewise', () => {
  const shares = { r: [0.75, 0.25] };
  const s = scoreEpoch([row(A, 'forward', 0, 4), row(A, 'backward', 0, 4), row(B, 'forward', 1, 4), row(B, 'backward', 1, 4), row(B, 'merge', 1, 2)], shares);
  assert.deepEqual(s.map((m) => m.miner), [A, B]);
  assert.equal(s[0].score, 8 * 0.75);
  assert.equal(s[1].score, 10 * 0.25);
  assert.deepEqual(s[1].units, { forward: 4, backward: 4, merge: 2, inference: 0, dropped: 0, invalid: 0, failed_check: 0 });
});

test('a dropped unit costs 3 done units, an invalid one 5; scores clip at 0', () => {
  assert.equal(DROPPED_PENALTY, 3);
  assert.equal(INVALID_PENALTY, 5);
  const shares = { r: [0.5, 0.5] };
  const s = scoreEpoch([row(A, 'forward', 0, 10), row(A, 'dropped', 0, 2), row(B, 'forward', 1, 10), row(B, 'invalid', 1, 1), row(C, 'forward', 0, 1), row(C, 'dropped', 0, 1)], shares);
  assert.equal(s[0].score, (10 - 6) * 0.5);
  assert.equal(s[1].score, (10 - 5) * 0.5);
  assert.equal(s[2].score, 0);
  assert.equal(s[2].penalty, 1.5);
  // unknown stage: an average stage of the run; no run: the average over runs
  assert.equal(unitWeight({ r: [0.9, 0.1] }, 'r', null), 0.5);
  assert.equal(unitWeight({ r: [0.9, 0.1], q: [0.2, 0.3, 0.5] }, null, null), (1 / 2 + 1 / 3) / 2);
  assert.equal(unitWeight({}, null, null), 1);
});

test('a failed spot check costs 10 done units', () => {
  assert.equal(FAILED_CHECK_PENALTY, 10);
  const s = scoreEpoch([row(A, 'forward', 0, 30), row(A, 'failed_check', 0, 2), row(B, 'forward', 0, 30), row(B, 'failed_check', 0, 4)], { r: [0.5, 0.5] });
  assert.equal(s[0].score, (30 - 20) * 0.5);
  assert.equal(s[0].units.failed_check, 2);
  assert.equal(s[1].score, 0);
  assert.equal(s[1].penalty, 20);
});

test('the emission is split in proportion to scores, exactly, remainder undistributed', () => {
  const E = 100n * 10n ** 18n;
  const split = splitEmission([{ miner: A, score: 3 }, { miner: B, score: 1 }, { miner: C, score: 0 }], E);
  assert.equal(split.rewards[0].amount, 75n * 10n ** 18n);
  assert.equal(split.rewards[1].amount, 25n * 10n ** 18n);
  assert.equal(split.rewards[2].amount, 0n);
  assert.equal(split.remainder, 0n);
  const thirds = splitEmission([{ miner: A, score: 1 }, { miner: B, score: 1 }, { miner: C, score: 1 }], 100n);
  assert.deepEqual(thirds.rewards.map((r) => r.amount), [33n, 33n, 33n]);
  assert.equal(thirds.remainder, 1n);
  const none = splitEmission([{ miner: A, score: 0 }], E);
  assert.equal(none.rewards[0].amount, 0n);
  assert.equal(none.remainder, E);
});

test('conservation: Σ amounts + remainder == emission for random epochs', () => {
  const rnd = prng(7);
  const kinds: WorkRow['kind'][] = ['forward', 'backward', 'merge', 'dropped', 'invalid'];
  for (let trial = 0; trial < 200; trial++) {
    const miners = Array.from({ length: 1 + Math.floor(rnd() * 30) }, (_, i) => `0x${(i + 1).toString(16).padStart(40, '0')}`);
    const rows: WorkRow[] = Array.from({ length: Math.floor(rnd() * 300) }, () =>
      row(miners[Math.floor(rnd() * miners.length)], kinds[Math.floor(rnd() * (rnd() < 0.8 ? 3 : 5))], rnd() < 0.1 ? null : Math.floor(rnd() * 3), 1 + Math.floor(rnd() * 3), rnd() < 0.05 ? null : 'r'),
    );
    const emission = BigInt(Math.floor(rnd() * 1e12)) * 10n ** BigInt(Math.floor(rnd() * 10));
    const scores = scoreEpoch(rows, { r: [0.5, 0.3, 0.2] });
    for (const s of scores) assert.ok(s.score >= 0);
    const split = splitEmission(scores, emission);
    const paid = split.rewards.reduce((a, r) => a + r.amount, 0n);
    assert.equal(paid + split.remainder, emission);
    assert.ok(split.remainder >= 0n && (paid === 0n || split.remainder < BigInt(split.rewards.length)));
    // proportional: a higher score never gets less
    const sorted = [...split.rewards].sort((a, b) => a.score - b.score);
    for (let i = 1; i < sorted.length; i++) assert.ok(sorted[i].amount >= sorted[i - 1].amount);
  }
});

test('inference units are work weighed by the stage share of the deployment they served, beside training', () => {
  const rows: WorkRow[] = [
    { minerId: 'a', runId: null, deploymentId: 'dep-1', kind: 'inference', units: 2, stage: 0 },
    { minerId: 'b', runId: null, deploymentId: 'dep-1', kind: 'inference', units: 2, stage: 1 },
    { minerId: 'b', runId: 'r', kind: 'forward', units: 1, stage: 0 },
  ];
  const s = scoreEpoch(rows, { 'dep-1': [0.25, 0.75], r: [0.5, 0.5] });
  assert.equal(s[0].score, 0.5);
  assert.equal(s[1].score, 1.5 + 0.5);
  assert.equal(s[1].units.inference, 2);
  assert.equal(unitWeight({ 'dep-1': [0.25, 0.75] }, 'dep-1', null), 0.5);
});
