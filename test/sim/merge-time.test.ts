// A merge round's time on its replicas' links (src/sim/merge-time.ts): a
// merged stage's round carries no state upload (the orchestrator writes the
// state, src/orchestrator/training/merges.ts writeState); a stage of one replica
// uploads its own, 8 bytes per parameter.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { STATE_BYTES_PER_PARAM, stageMergeTraffic } from '../../src/sim/costs.ts';
import type { HardwareTable } from '../../src/sim/hardware.ts';
import { lastHeartbeatMs, mergeRequests, ORCHESTRATOR_TICK_MS, orchestratorRoundMs, stageMergeTime, type MergeWork } from '../../src/sim/merge-time.ts';
import { Rng } from '../../src/sim/rng.ts';
import { simOptions, simulate } from '../../src/sim/simulate.ts';

const link = { upMbps: 100, downMbps: 500, latencyMs: 20 };
const ms = (bytes: number, mbps: number): number => (bytes * 8) / (mbps * 1e6) * 1000;

test("a stage of one replica's round is its upload of 8 bytes per parameter from the heartbeat it learned on; a merged stage's is the butterfly's three phases, with no state upload", () => {
  const params = 4e9;
  const heartbeatMs = 1000;
  const tick = ORCHESTRATOR_TICK_MS;
  const one = stageMergeTime(params, [link], { heartbeatMs });
  const upload = ms(params * STATE_BYTES_PER_PARAM, link.upMbps);
  // it reports on its next heartbeat, and its upload (longer here) started on the heartbeat it learned on
  assert.ok(Math.abs(one.ms - (lastHeartbeatMs(heartbeatMs, 1) + Math.max(heartbeatMs, upload + 2 * link.latencyMs) + tick / 2)) < 1e-6, `${one.ms}`);
  assert.deepEqual([one.bytesPerReplica, one.bytesTotal, one.partitions], [0, params * STATE_BYTES_PER_PARAM, 0]);

  const R = 3;
  const three = stageMergeTime(params, [link, link, link], { heartbeatMs });
  const t = stageMergeTraffic(params, R);
  const phase = (transfer: number): number => lastHeartbeatMs(heartbeatMs, R) + transfer + 2 * link.latencyMs + tick / 2;
  // a replica reports it applied on its first heartbeat after it did: whole heartbeat periods after the one it learned on
  const applied = ms(t.downloadMerged, link.downMbps) + 2 * link.latencyMs;
  const apply = lastHeartbeatMs(heartbeatMs, R) + heartbeatMs * Math.ceil(applied / heartbeatMs) + tick / 2;
  const expected = phase(ms(t.uploadPseudoGradient, link.upMbps)) + phase(ms(t.downloadAsMerger, link.downMbps) + ms(t.uploadMerged, link.upMbps)) + apply;
  assert.ok(Math.abs(three.ms - expected) < 1e-6, `${three.ms} vs ${expected}`);
  assert.equal(three.bytesTotal, t.total * R, 'no state bytes');
  assert.ok(three.ms < upload, 'the whole round is shorter than one state upload');
  assert.deepEqual(stageMergeTime(params, [], { heartbeatMs }), { ms: 0, bytesPerReplica: 0, bytesTotal: 0, partitions: 0 });
});

test('simulated on 1 Mbit/s uplinks, merge rounds of 2 replicas per stage take less than one state upload; with one replica per stage they take more', () => {
  // gpt-tiny in 2 stages: a state upload takes minutes, a merge is due every 20 inner steps
  const hardware: HardwareTable = { classes: [{ name: 'box', share: 1, gflops: 1000, memoryGB: 8, upMbps: 1, downMbps: 100, latencyMs: 0, sessionHours: 1 }] };
  const base = { modelName: 'gpt-tiny', stages: 2, hours: 2, churn: 0, hardware, mergeEvery: 20, deadlineMs: 1e6, activationRatio: 100 };
  const pairs = simulate(simOptions({ ...base, miners: 4 }));
  const singles = simulate(simOptions({ ...base, miners: 2 }));
  assert.deepEqual(pairs.stages.map((s) => s.replicas), [2, 2]);
  assert.deepEqual(singles.stages.map((s) => s.replicas), [1, 1]);
  const upload = Math.max(...pairs.stages.map((s) => ms(s.params * STATE_BYTES_PER_PARAM, 1)));
  assert.ok(pairs.merges.rounds >= 2 && singles.merges.rounds >= 2, `${pairs.merges.rounds} and ${singles.merges.rounds} rounds`);
  assert.ok(pairs.merges.meanMs < upload, `mean round of 2 replicas ${pairs.merges.meanMs} ms, a state upload ${upload} ms`);
  assert.ok(singles.merges.meanMs > upload, `mean round of 1 replica ${singles.merges.meanMs} ms, a state upload ${upload} ms`);
});

test('on the protocol clocks a round lasts whole ticks; over many rounds one stage averages the mean waits, and the slower of two stages takes longer', () => {
  const fast = { upMbps: 1000, downMbps: 1000, latencyMs: 0.05 };
  const options = { heartbeatMs: 250, tickMs: 200 };
  const params = 437_504;
  const mean = stageMergeTime(params, [fast, fast], options).ms;
  const rng = new Rng(7);
  const one: number[] = [];
  const slower: number[] = [];
  for (let k = 0; k < 4000; k++) {
    const a = stageMergeTime(params, [fast, fast], { ...options, rng }).ms;
    const b = stageMergeTime(params, [fast, fast], { ...options, rng }).ms;
    one.push(a);
    slower.push(Math.max(a, b));
    assert.ok(Number.isInteger(Math.round(a / 200)) && Math.abs(a / 200 - Math.round(a / 200)) < 1e-9, `${a} ms is not a whole number of ticks`);
  }
  const avg = (xs: number[]): number => xs.reduce((x, y) => x + y, 0) / xs.length;
  // the walk and the means agree on one stage to within a few percent (the ticks and heartbeats are not independent)
  assert.ok(Math.abs(avg(one) / mean - 1) < 0.05, `walked ${avg(one)} ms, means ${mean} ms`);
  assert.ok(avg(slower) > avg(one) + 40, `the slower of two stages ${avg(slower)} ms, one ${avg(one)} ms`);
});

test("the round's compute: each replica's on its path, and the orchestrator's work for every stage holds a phase open at least that long", () => {
  const fast = { upMbps: 1000, downMbps: 1000, latencyMs: 0 };
  const params = 1e6;
  const none: MergeWork = { uploadMsPerParam: 0, mergeMsPerParam: 0, applyMsPerParam: 0, checkMsPerParam: 0, mergedMsPerParam: 0, writeMsPerParam: 0 };
  const base = stageMergeTime(params, [fast, fast], { heartbeatMs: 250 }).ms;
  // 1e-4 ms a value: 100 ms of upload, 200 ms of merging (two inputs a value), 100 ms of applying a replica
  const replica = stageMergeTime(params, [fast, fast], { heartbeatMs: 250, work: { ...none, uploadMsPerParam: 1e-4, mergeMsPerParam: 1e-4, applyMsPerParam: 1e-4 } }).ms;
  // the applying replica's 100 ms still fit before its next heartbeat: upload and merge add theirs
  assert.ok(Math.abs(replica - base - 300) < 1e-6, `${replica} vs ${base}`);
  const work = { ...none, checkMsPerParam: 1e-3, mergedMsPerParam: 1e-3, writeMsPerParam: 1e-3 };
  const orchestrator = orchestratorRoundMs([{ params, replicas: 2 }, { params, replicas: 2 }, { params, replicas: 1 }], work);
  // checks: 2 stages x 2 replicas x 1e6 values; merged: 2 stages x 2 mergers; writes: 2 merged states and one checked upload
  assert.deepEqual(orchestrator, { upload: 4000, merge: 4000, apply: 3000 });
  const held = stageMergeTime(params, [fast, fast], { heartbeatMs: 250, work, orchestrator }).ms;
  assert.ok(Math.abs(held - (4000 + 4000 + 3000 + 3 * 100)) < 1e-6, `${held}`);
  // a single replica's round waits for the orchestrator's applying work too, from the opening (its upload takes 8 ms here)
  const single = stageMergeTime(params, [fast], { heartbeatMs: 250, work, orchestrator }).ms;
  assert.ok(Math.abs(single - (3000 + 100)) < 1e-6, `${single}`);
  assert.ok(Math.abs(stageMergeTime(params, [fast], { heartbeatMs: 250 }).ms - (125 + 250 + 100)) < 1e-6);
  assert.throws(() => simOptions({ modelName: 'gpt-tiny', miners: 4, mergeWork: { ...none, checkMsPerParam: -1 } }), /compute per value must be finite numbers ≥ 0/);
  assert.throws(() => simOptions({ modelName: 'gpt-tiny', miners: 4, mergeWork: { ...none, requestMs: Number.NaN } }), /compute per value must be finite numbers ≥ 0/);
});

test("a round's requests: each replica's one after another on its path, half of each the orchestrator's on its one thread", () => {
  const fast = { upMbps: 1000, downMbps: 1000, latencyMs: 0 };
  const params = 1e6;
  // 2 replicas, 4 partitions: 4 frames up; 4 partitions merged, each 2 frames down and 1 up; 4 merged frames down
  assert.deepEqual(mergeRequests(params, 2), { upload: 4, merge: 12, apply: 4 });
  // 4 replicas, 8 partitions: each merges 4, with 4 inputs and an upload each
  assert.deepEqual(mergeRequests(params, 4), { upload: 8, merge: 20, apply: 8 });
  const none: MergeWork = { uploadMsPerParam: 0, mergeMsPerParam: 0, applyMsPerParam: 0, checkMsPerParam: 0, mergedMsPerParam: 0, writeMsPerParam: 0 };
  const work = { ...none, requestMs: 10 };
  const base = stageMergeTime(params, [fast, fast], { heartbeatMs: 250 }).ms;
  // 40 ms and 120 ms more on the upload and merge paths; applying's 40 ms fit before the next heartbeat
  assert.ok(Math.abs(stageMergeTime(params, [fast, fast], { heartbeatMs: 250, work }).ms - base - 160) < 1e-6);
  // the orchestrator serves every replica's: 2 stages x 2 replicas x (4, 12, 4) requests x 5 ms; a single replica's state upload, one
  assert.deepEqual(orchestratorRoundMs([{ params, replicas: 2 }, { params, replicas: 2 }, { params, replicas: 1 }], work), { upload: 80, merge: 240, apply: 85 });
  // a durable blob write of 20 ms: each of a replica's 4 uploads and its 4 merged partitions' waits for it (applying downloads only, and still fits before the next heartbeat)
  const durable = { ...work, putMs: 20 };
  assert.ok(Math.abs(stageMergeTime(params, [fast, fast], { heartbeatMs: 250, work: durable }).ms - base - 160 - 160) < 1e-6);
  // and the orchestrator waits for it once per stage state it writes or takes
  assert.deepEqual(orchestratorRoundMs([{ params, replicas: 2 }, { params, replicas: 2 }, { params, replicas: 1 }], durable), { upload: 80, merge: 240, apply: 145 });
});
