// Processor sharing of a shared host's cores (src/sim/host.ts), and the
// simulator on a local network whose processes share them, against hand
// computations.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { validateHardwareTable } from '../../src/sim/hardware.ts';
import { HostCores, processRate } from '../../src/sim/host.ts';
import { crowdedRateOf, predictLocal, type LocalNetwork } from '../../src/sim/calibrate.ts';

/** Runs the host to the end: the time each miner's job ended. */
function drain(h: HostCores, starts: { key: number; ms: number; at: number }[]): Map<number, number> {
  const ends = new Map<number, number>();
  const pending = [...starts].sort((a, b) => a.at - b.at);
  let now = 0;
  for (;;) {
    const next = h.nextEnd(now);
    if (pending.length && pending[0].at <= next) {
      const s = pending.shift()!;
      now = s.at;
      h.start(s.key, s.ms, now);
      continue;
    }
    if (next === Infinity) return ends;
    now = next;
    for (const k of h.takeDone(now).jobs) ends.set(k, now);
  }
}

test('three jobs of 100 ms on 2 cores share them: each runs at 2/3 and all end at 150 ms', () => {
  const ends = drain(new HostCores(2), [0, 1, 2].map((key) => ({ key, ms: 100, at: 0 })));
  for (const k of [0, 1, 2]) assert.ok(Math.abs(ends.get(k)! - 150) < 1e-6, `${k}: ${ends.get(k)}`);
});

test('crowded: 4 jobs of 100 ms on 2 cores at a crowded rate of 0.9 end at 222.2 ms; 3 lose half as much (157.9 ms); 2 lose nothing', () => {
  const ends = (n: number): number[] => [...drain(new HostCores(2, 0.9), Array.from({ length: n }, (_, key) => ({ key, ms: 100, at: 0 }))).values()];
  for (const e of ends(4)) assert.ok(Math.abs(e - 100 / ((2 / 4) * 0.9)) < 1e-6, `4: ${e}`);
  for (const e of ends(3)) assert.ok(Math.abs(e - 100 / ((2 / 3) * 0.95)) < 1e-6, `3: ${e}`);
  for (const e of ends(2)) assert.ok(Math.abs(e - 100) < 1e-6, `2: ${e}`);
  assert.equal(processRate(8, 2, 0.9), (2 / 8) * 0.9, 'past 2 × cores the loss stays');
  assert.throws(() => new HostCores(2, 0), /crowded rate/);
  assert.throws(() => new HostCores(2, 1.1), /crowded rate/);
});

test('the crowded rate measured (a job alone, then in more processes than cores) is the one processRate was given', () => {
  for (const [processes, cores, rate] of [[4, 2, 0.9], [3, 2, 0.8], [8, 4, 0.95], [5, 2, 1]] as const) {
    const crowdedMs = 74 / processRate(processes, cores, rate);
    assert.ok(Math.abs(crowdedRateOf(74, crowdedMs, processes, cores) - rate) < 1e-9, `${processes} on ${cores} at ${rate}`);
  }
  assert.equal(crowdedRateOf(74, 140, 4, 2), 1, 'faster than fair: nothing lost');
  assert.throws(() => crowdedRateOf(74, 150, 2, 2), /more processes than cores/);
  assert.throws(() => crowdedRateOf(0, 150, 4, 2), /positive/);
});

test('on 1 core a job that starts later slows the first: 100 ms from 0 and from 50 end at 150 and 200', () => {
  const ends = drain(new HostCores(1), [{ key: 0, ms: 100, at: 0 }, { key: 1, ms: 100, at: 50 }]);
  assert.ok(Math.abs(ends.get(0)! - 150) < 1e-6 && Math.abs(ends.get(1)! - 200) < 1e-6, JSON.stringify([...ends]));
});

test("the orchestrator's pieces run one after another, sharing the cores, and name the heartbeats they answer; a stopped job frees its share", () => {
  const h = new HostCores(1);
  h.start(0, 100, 0);
  h.addOrchestratorWork(20, 0, 7); // miner 7's heartbeat
  h.addOrchestratorWork(30, 0, 8); // then miner 8's
  // the core is shared by two: the first piece ends at 40, the second at 100, the miner's 100 ms at 150
  assert.equal(h.nextEnd(0), 40);
  assert.deepEqual(h.takeDone(40), { jobs: [], replies: [7] });
  assert.ok(Math.abs(h.nextEnd(40) - 100) < 1e-6);
  assert.deepEqual(h.takeDone(100), { jobs: [], replies: [8] });
  assert.ok(Math.abs(h.nextEnd(100) - 150) < 1e-6);
  h.stop(0, 120);
  assert.equal(h.nextEnd(120), Infinity);
  // a piece of no work is answered at once
  h.addOrchestratorWork(0, 130, 9);
  assert.deepEqual(h.takeDone(130), { jobs: [], replies: [9] });
  assert.throws(() => new HostCores(0), /cores/);
});

const miner = (name: string, throttle = 1): LocalNetwork['miners'][number] => ({ name, gflops: 40, memoryBytes: 8e9, bandwidthMbps: 1e5, threads: 1, throttle });
// stage 0: forward 30 + backward 50 ms; stage 1 (the last): one 70 ms job; measured on a core of 40 GFLOP/s
const jobTimes = { referenceGflops: 40, stages: [{ forwardMs: 30, backwardMs: 50 }, { forwardMs: 70, backwardMs: 0 }] };
const pipeline: LocalNetwork = { miners: [miner('a'), miner('b')], model: 'gpt-tiny', stages: 2, batchSize: 12, mergeEvery: 1e9 };

test('2 miners on 1 shared core are bound by the core: a microbatch every (80 + 70 + overheads + orchestrator) ms', () => {
  const host = { cores: 1, hopOverheadMs: [10, 6], orchestratorMsPerMicrobatch: 4 };
  const p = predictLocal(pipeline, { jobTimes, hours: 0.1, host });
  const hand = (768 * 1000) / (80 + 70 + 10 + 6 + 4);
  assert.ok(Math.abs(p.tokensPerS - hand) / hand < 0.03, `${p.tokensPerS} vs ${hand}`);
  // on 2 cores the same network is bound by its slower stage, 80 + 10 ms, less the orchestrator's share
  const two = predictLocal(pipeline, { jobTimes, hours: 0.1, host: { ...host, cores: 2 } });
  assert.ok(two.tokensPerS > p.tokensPerS * 1.5 && two.tokensPerS <= (768 * 1000) / 90, `${two.tokensPerS}`);
});

test("heartbeats cost the core too: 10 ms of CPU each (the orchestrator's and the miner's) take up to 8% of a core from 2 miners beating every 250 ms or later", () => {
  const host = { cores: 1, hopOverheadMs: [10, 6], orchestratorMsPerMicrobatch: 4 };
  const without = predictLocal(pipeline, { jobTimes, hours: 0.1, host }).tokensPerS;
  const beating = predictLocal(pipeline, { jobTimes, hours: 0.1, host: { ...host, orchestratorMsPerHeartbeat: 5, minerMsPerHeartbeat: 5 } }).tokensPerS;
  // at most 2 × 4 heartbeats a second of 10 ms: 8% of the core; fewer when jobs hold the timers back (a period of 400 ms: 5%)
  const drop = 1 - beating / without;
  assert.ok(drop > 0.03 && drop <= 0.09, `${without} → ${beating} tokens/s (${(100 * drop).toFixed(1)}%)`);
  // the miner's part alone, and the orchestrator's alone, each take about half of it
  for (const only of [{ minerMsPerHeartbeat: 5 }, { orchestratorMsPerHeartbeat: 5 }]) {
    const part = 1 - predictLocal(pipeline, { jobTimes, hours: 0.1, host: { ...host, ...only } }).tokensPerS / without;
    assert.ok(part > drop / 4 && part < (drop * 3) / 4, `${JSON.stringify(only)}: ${(100 * part).toFixed(1)}% of ${(100 * drop).toFixed(1)}%`);
  }
});

test('a throttled miner rests (1 − t) ÷ t of its work after each job: at 0.5 every stage takes twice as long', () => {
  // miners of 10 GFLOP/s take 4 × the job times (stage 0: 320 ms), slow enough that the issue limit does not bind
  const slow = (name: string, throttle = 1): LocalNetwork['miners'][number] => ({ ...miner(name, throttle), gflops: 10 });
  const alone = predictLocal({ ...pipeline, miners: [slow('a'), slow('b')] }, { jobTimes, hours: 0.2 });
  // both throttled (the planner, not told of throttles, may give either miner either stage)
  const throttled = predictLocal({ ...pipeline, miners: [slow('a', 0.5), slow('b', 0.5)] }, { jobTimes, hours: 0.2 });
  const hand = (ms: number): number => (768 * 1000) / ms;
  assert.ok(Math.abs(alone.tokensPerS - hand(320)) / hand(320) < 0.03, `${alone.tokensPerS} vs ${hand(320)}`);
  assert.ok(Math.abs(throttled.tokensPerS - hand(640)) / hand(640) < 0.03, `${throttled.tokensPerS} vs ${hand(640)}`);
});

test('a hardware table gives a class a throttle in (0, 1]; anything else is refused with its path', () => {
  const klass = { name: 'home', share: 1, gflops: 100, memoryGB: 8, upMbps: 20, downMbps: 200, latencyMs: 20, sessionHours: 6 };
  assert.equal(validateHardwareTable({ classes: [{ ...klass, throttle: 0.5 }] }).classes[0].throttle, 0.5);
  for (const throttle of [0, 1.5, -1]) assert.throws(() => validateHardwareTable({ classes: [{ ...klass, throttle }] }), /\/classes\/0\/throttle/);
});
