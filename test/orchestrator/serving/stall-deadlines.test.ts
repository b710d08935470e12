// When a stage miner is taken as hung (src/orchestrator/serving/stall-deadlines.ts):
// the whole timeout until a miner has answered STALL_WARMUP_CALLS decode
// calls, then STALL_FACTOR times its usual decode time, scaled by rows, never
// below the floor nor above the timeout; prefills do not move the usual time.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { STALL_FACTOR, STALL_FLOOR_MS, STALL_WARMUP_CALLS, StallDeadlines } from '../../../src/orchestrator/serving/stall-deadlines.ts';

test('the whole timeout until measured; then STALL_FACTOR × the usual decode time, scaled by rows, within [floor, timeout]', () => {
  const d = new StallDeadlines(30_000);
  assert.equal(d.deadline('m', 4), 30_000);
  for (let i = 0; i < STALL_WARMUP_CALLS - 1; i++) d.note('m', 200, 4, false);
  assert.equal(d.deadline('m', 4), 30_000, 'not yet trusted');
  d.note('m', 200, 4, false);
  assert.equal(d.deadline('m', 4), STALL_FACTOR * 200);
  assert.equal(d.deadline('m', 1), STALL_FACTOR * 200, 'fewer rows never shorten it');
  assert.equal(d.deadline('m', 16), Math.min(30_000, STALL_FACTOR * 200 * 4), 'a prefill of 16 rows gets 4 times a 4-row decode');
  assert.equal(d.deadline('m', 400), 30_000, 'never above the timeout');
  // prefills do not count; a fast miner keeps the floor
  d.note('m', 29_000, 64, true);
  assert.equal(d.deadline('m', 4), STALL_FACTOR * 200);
  const fast = new StallDeadlines(30_000);
  for (let i = 0; i < STALL_WARMUP_CALLS; i++) fast.note('f', 0.3, 4, false);
  assert.equal(fast.deadline('f', 4), STALL_FLOOR_MS);
  assert.equal(fast.deadline('other', 4), 30_000, 'per miner');
});
