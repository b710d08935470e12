// A merge round's time on its replicas' links (src/sim/merge-time.ts): a
// merged stage's round carries no state upload (the orchestrator writes the
// state, src/orchestrator/merges.ts writeState); a stage of one replica
// uploads its own, 8 bytes per parameter.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { STATE_BYTES_PER_PARAM, stageMergeTraffic } from '../../src/sim/costs.ts';
import type { HardwareTable } from '../../src/sim/hardware.ts';
import { lastHeartbeatMs, ORCHESTRATOR_TICK_MS, stageMergeTime } from '../../src/sim/merge-time.ts';
import { simOptions, simulate } from '../../src/sim/simulate.ts';

const link = { upMbps: 100, downMbps: 500, latencyMs: 20 };
const ms = (bytes: number, mbps: number): number => (bytes * 8) / (mbps * 1e6) * 1000;

test("a stage of one replica's round is its upload of 8 bytes per parameter after a heartbeat and a half; a merged stage's is the butterfly's three phases, with no state upload", () => {
  const params = 4e9;
  const heartbeatMs = 1000;
  const tick = ORCHESTRATOR_TICK_MS;
  const one = stageMergeTime(params, [link], { heartbeatMs });
  const upload = ms(params * STATE_BYTES_PER_PARAM, link.upMbps);
  assert.ok(Math.abs(one.ms - (lastHeartbeatMs(heartbeatMs, 1) + heartbeatMs + tick / 2 + upload)) < 1e-6, `${one.ms}`);
  assert.deepEqual([one.bytesPerReplica, one.bytesTotal, one.partitions], [0, params * STATE_BYTES_PER_PARAM, 0]);

  const R = 3;
  const three = stageMergeTime(params, [link, link, link], { heartbeatMs });
  const t = stageMergeTraffic(params, R);
  const phase = (transfer: number): number => lastHeartbeatMs(heartbeatMs, R) + transfer + 2 * link.latencyMs + tick / 2;
  const expected = phase(ms(t.uploadPseudoGradient, link.upMbps)) + phase(ms(t.downloadAsMerger, link.downMbps) + ms(t.uploadMerged, link.upMbps)) + phase(ms(t.downloadMerged, link.downMbps)) + heartbeatMs;
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
