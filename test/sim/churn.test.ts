// Churn in the simulator: work in flight on a leaver is dropped and issued
// again, nothing is lost, and a seed fixes the whole run.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { HardwareTable } from '../../src/sim/hardware.ts';
import { REPLAN_BATCH_MS } from '../../src/sim/control.ts';
import { simOptions, simulate, simulateWorld } from '../../src/sim/simulate.ts';

const TABLE: HardwareTable = {
  classes: [
    { name: 'fast', share: 1, gflops: 20, memoryGB: 8, upMbps: 50, downMbps: 200, latencyMs: 20, sessionHours: 0.1 },
    { name: 'slow', share: 2, gflops: 5, memoryGB: 8, upMbps: 20, downMbps: 100, latencyMs: 30, sessionHours: 0.2 },
  ],
};

const options = (seed: number, churn = 1) =>
  simOptions({ modelName: 'gpt-tiny', miners: 12, stages: 3, hours: 0.5, churn, seed, hardware: TABLE, mergeEvery: 20, rejoinMs: 60_000 });

test('miners leave and join: in-flight work is dropped, charged, issued again, and no microbatch is lost', () => {
  const { world, report } = simulateWorld(options(3));
  assert.ok(report.churn.left > 5 && report.churn.joined > 5, `churn ${JSON.stringify(report.churn)}`);
  assert.ok(report.churn.replans > 0);
  assert.ok(report.dropped.byChurn > 0 && report.dropped.units > 0, `dropped ${JSON.stringify(report.dropped)}`);
  assert.ok(report.microbatchesDone > 0 && report.merges.rounds > 0);
  // every microbatch created is done, waiting to be issued again, or issued: exactly one of them
  const pending = new Set(world.pending);
  assert.equal(pending.size, world.pending.length, 'no microbatch is queued twice');
  let done = 0;
  for (const mb of world.microbatches) {
    const where = [mb.status === 'done', pending.has(mb.id), world.issued.has(mb.id)].filter(Boolean).length;
    assert.equal(where, 1, `microbatch ${mb.id} (${mb.status}) is in ${where} places`);
    if (mb.status === 'pending') assert.ok(pending.has(mb.id));
    if (mb.status === 'issued') assert.ok(world.issued.has(mb.id));
    if (mb.status === 'done') done++;
  }
  assert.equal(done, report.microbatchesDone);
  // re-issued work was issued again: attempts beyond the first exist
  assert.ok(world.microbatches.some((mb) => mb.attempt > 1));
  // no departed miner holds a stage of the final plan, unless the run ended while the replan that drops it waited
  // for its batch (it was noticed within REPLAN_BATCH_MS of the end)
  const lastReplan = world.now - REPLAN_BATCH_MS;
  for (const set of world.members) {
    for (const i of set) {
      const m = world.miners[i];
      assert.ok(!m.gone || (world.replanScheduled && m.leftAt! + world.options.minerTimeoutMs > lastReplan), `gone miner ${i} still planned`);
    }
  }
});

test('without churn nothing is dropped', () => {
  const r = simulate(options(3, 0));
  assert.equal(r.churn.left, 0);
  assert.equal(r.dropped.byChurn, 0);
  assert.equal(r.dropped.units, 0);
});

test('the same seed gives the same run; another seed another', () => {
  const a = simulate(options(11));
  const b = simulate(options(11));
  assert.deepEqual(a, b);
  const c = simulate(options(12));
  assert.notDeepEqual(a.series, c.series);
});

test('earnings: every epoch’s emission is split among the miners, and a class that does more work earns more per hour', () => {
  const r = simulate({ ...options(5, 0), hours: 1 });
  const total = r.classes.reduce((a, c) => a + c.earnedNim, 0);
  // one epoch of 100 NIM, minus the rounding remainder (under a wei per miner)
  assert.ok(Math.abs(total - 100) < 1e-3, `paid ${total}`);
  const fast = r.classes.find((c) => c.hardware === 'fast')!;
  const slow = r.classes.find((c) => c.hardware === 'slow')!;
  assert.ok(fast.nimPerMinerHour > slow.nimPerMinerHour, `${fast.nimPerMinerHour} vs ${slow.nimPerMinerHour}`);
});
