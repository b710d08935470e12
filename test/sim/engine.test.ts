// The simulator's clock and its hand-computable cases.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { activationFrameBytes } from '../../src/sim/costs.ts';
import { EventQueue } from '../../src/sim/event-queue.ts';
import type { HardwareTable } from '../../src/sim/hardware.ts';
import { Rng } from '../../src/sim/rng.ts';
import { simOptions, simulate } from '../../src/sim/simulate.ts';
import { GPT_CONFIGS } from '../../src/model/config.ts';
import { stageCost } from '../../src/planner/cost.ts';

/** One class of identical machines. */
function table(gflops: number, upMbps: number, downMbps = upMbps, latencyMs = 0): HardwareTable {
  return { classes: [{ name: 'box', share: 1, gflops, memoryGB: 8, upMbps, downMbps, latencyMs, sessionHours: 1 }] };
}

test('events come out by time, then in the order they were scheduled', () => {
  const q = new EventQueue<number>();
  const rng = new Rng(7);
  const pushed: { at: number; id: number }[] = [];
  for (let id = 0; id < 2000; id++) {
    const at = Math.floor(rng.next() * 50);
    q.push(at, id);
    pushed.push({ at, id });
  }
  const expected = [...pushed].sort((a, b) => a.at - b.at || a.id - b.id).map((e) => e.id);
  const got: number[] = [];
  for (let e = q.pop(); e; e = q.pop()) got.push(e.event);
  assert.deepEqual(got, expected);
  assert.equal(q.size, 0);
  assert.equal(q.peekTime(), Infinity);
  assert.throws(() => q.push(NaN, 1), RangeError);
});

test('2 stages, 1 miner each, slow links: tokens/s is a frame over the link', () => {
  const cfg = GPT_CONFIGS['gpt-tiny'];
  const opts = simOptions({ modelName: 'gpt-tiny', miners: 2, stages: 2, hours: 0.25, churn: 0, hardware: table(1000, 1), mergeEvery: 1e9, deadlineMs: 1e6 });
  const r = simulate(opts);
  assert.equal(r.stages.length, 2);
  assert.deepEqual(r.stages.map((s) => s.replicas), [1, 1]);
  // each microbatch crosses each 1 Mbit/s link once per direction (activation up from stage 0, gradient up from stage 1)
  const bytes = activationFrameBytes(cfg, 12, 'f16');
  const formula = (12 * cfg.contextLength) / ((bytes * 8) / 1e6);
  assert.ok(Math.abs(r.tokensPerS - formula) / formula < 0.02, `tokens/s ${r.tokensPerS} vs ${formula}`);
  // frames of microbatches still in flight at the end count too: a little above 2 frames per microbatch
  const perToken = (2 * bytes) / (12 * cfg.contextLength);
  assert.ok(r.bytesPerToken.activations >= perToken && r.bytesPerToken.activations < perToken * 1.01, `${r.bytesPerToken.activations} vs ${perToken}`);
  assert.equal(r.dropped.reissued, 0);
});

test('what-ifs: frames compressed R times more cross a slow link R times as often; more slots fill a pipeline that waits on latency', () => {
  const cfg = GPT_CONFIGS['gpt-tiny'];
  const base = { modelName: 'gpt-tiny', miners: 2, stages: 2, hours: 0.25, churn: 0, hardware: table(1000, 1), mergeEvery: 1e9, deadlineMs: 1e6 };
  const plain = simulate(simOptions(base));
  const squeezed = simulate(simOptions({ ...base, activationRatio: 8 }));
  const bytes = activationFrameBytes(cfg, 12, 'f16', 8);
  assert.ok(bytes < activationFrameBytes(cfg, 12, 'f16') / 7, `${bytes}`);
  const formula = (12 * cfg.contextLength) / ((bytes * 8) / 1e6);
  assert.ok(Math.abs(squeezed.tokensPerS - formula) / formula < 0.02, `tokens/s ${squeezed.tokensPerS} vs ${formula}`);
  assert.ok(squeezed.tokensPerS > 7 * plain.tokensPerS);
  assert.equal(squeezed.activationRatio, 8);
  assert.throws(() => activationFrameBytes(cfg, 12, 'f16', 0.5), RangeError);
  // 200 ms of latency each way and fast compute: each microbatch spends most of its time on the wire, so holding more of
  // them in flight multiplies what the stages do
  const far = { ...base, hardware: table(1000, 1e6, 1e6, 100), hours: 0.05 };
  const two = simulate(simOptions({ ...far, slots: 2 }));
  const eight = simulate(simOptions({ ...far, slots: 8 }));
  assert.equal(eight.slots, 8);
  assert.ok(eight.tokensPerS > 2.5 * two.tokensPerS, `${two.tokensPerS} → ${eight.tokensPerS}`);
  assert.throws(() => simOptions({ ...base, slots: 0 }), /slots must be an integer in \[1, 256\]/);
});

test('2 stages, 1 miner each, fast links: tokens/s is the slower stage’s compute', () => {
  const cfg = GPT_CONFIGS['gpt-tiny'];
  const r = simulate(simOptions({ modelName: 'gpt-tiny', miners: 2, stages: 2, hours: 0.1, churn: 0, hardware: table(1, 1e6), mergeEvery: 1e9, deadlineMs: 1e6 }));
  const tokens = 12 * cfg.contextLength;
  const slowest = Math.max(...r.stages.map((s) => {
    const f = stageCost(cfg, s.range, 12, 3).flopsPerToken;
    return (tokens * (f.forward + f.backward)) / 1e9;
  }));
  const formula = tokens / slowest;
  assert.ok(Math.abs(r.tokensPerS - formula) / formula < 0.02, `tokens/s ${r.tokensPerS} vs ${formula}`);
  // the slower stage is busy all the time: utilization is its share plus the other's
  assert.ok(r.utilizationAssigned > 0.9, `utilization ${r.utilizationAssigned}`);
});

test('more replicas give more tokens/s while compute is the bottleneck; once the links are, faster compute adds nothing', () => {
  const run = (miners: number, gflops: number, up: number): number =>
    simulate(simOptions({ modelName: 'gpt-tiny', miners, stages: 2, hours: 0.1, churn: 0, hardware: table(gflops, up), mergeEvery: 1e9, deadlineMs: 1e6 })).tokensPerS;
  const t2 = run(2, 1, 1e6);
  const t4 = run(4, 1, 1e6);
  const t8 = run(8, 1, 1e6);
  // not quite 2×: the next hop is drawn at random (weighted by speed over queue), so replicas of a stage are not evenly loaded
  assert.ok(t4 > 1.6 * t2 && t8 > 1.6 * t4, `compute-bound: ${t2} → ${t4} → ${t8}`);
  // 1 Mbit/s links: ten times the compute changes nothing
  const slow = run(4, 1000, 1);
  const slowFaster = run(4, 10_000, 1);
  assert.ok(Math.abs(slowFaster - slow) / slow < 0.02, `link-bound: ${slow} vs ${slowFaster}`);
  // two replicas per stage: two 1 Mbit/s links per direction, each carrying one frame per microbatch, is
  // the bound; random routing loads the stage-1 replicas' uplinks (the gradients) unevenly, so it is not reached
  const cfg = GPT_CONFIGS['gpt-tiny'];
  const linkBound = (2 * 12 * cfg.contextLength) / ((activationFrameBytes(cfg, 12, 'f16') * 8) / 1e6);
  assert.ok(slow <= linkBound * 1.001 && slow > 0.6 * linkBound, `link-bound: ${slow} vs ${linkBound}`);
});

test('the series: utilization of the miners holding a stage, beside that of all miners, agree with the report', () => {
  // half the miners are too small to hold any stage of gpt-tiny
  const hardware: HardwareTable = {
    classes: [
      { name: 'box', share: 1, count: 4, gflops: 1, memoryGB: 8, upMbps: 1e6, downMbps: 1e6, latencyMs: 0, sessionHours: 1e6 },
      { name: 'tiny', share: 1, count: 4, gflops: 1, memoryGB: 1e-6, upMbps: 1e6, downMbps: 1e6, latencyMs: 0, sessionHours: 1e6 },
    ],
  };
  const r = simulate(simOptions({ modelName: 'gpt-tiny', miners: 8, stages: 2, hours: 0.1, churn: 0, hardware, mergeEvery: 1e9, deadlineMs: 1e6, samples: 20 }));
  const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  assert.equal(r.series.utilizationHolders.length, 20);
  assert.ok(Math.abs(mean(r.series.utilizationHolders) - r.utilizationAssigned) < 0.01, `${mean(r.series.utilizationHolders)} vs ${r.utilizationAssigned}`);
  assert.ok(Math.abs(mean(r.series.utilization) - r.utilization) < 0.01, `${mean(r.series.utilization)} vs ${r.utilization}`);
  // the four small miners are alive and idle: all miners' utilization is half the holders'
  assert.ok(Math.abs(r.utilization * 2 - r.utilizationAssigned) < 0.01, `${r.utilization} vs ${r.utilizationAssigned}`);
});
