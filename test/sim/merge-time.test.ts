// A merge round's time on its replicas' links (src/sim/merge-time.ts), and
// the what-if that takes the state save off the round (SimOptions.stateSave).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { STATE_BYTES_PER_PARAM } from '../../src/sim/costs.ts';
import type { HardwareTable } from '../../src/sim/hardware.ts';
import { stageMergeTime } from '../../src/sim/merge-time.ts';
import { simOptions, simulate } from '../../src/sim/simulate.ts';

const link = { upMbps: 100, downMbps: 500, latencyMs: 20 };

test("with the state save aside a round is shorter by the saving replica's upload of 8 bytes per parameter, which is still reported", () => {
  const params = 4e9;
  const upload = (params * STATE_BYTES_PER_PARAM * 8) / (100 * 1e6) * 1000;
  for (const replicas of [[link], [link, link, link]]) {
    const inRound = stageMergeTime(params, replicas, { heartbeatMs: 1000 });
    const aside = stageMergeTime(params, replicas, { heartbeatMs: 1000, stateAside: true });
    assert.ok(Math.abs(inRound.stateUploadMs - upload) < 1e-6, `${inRound.stateUploadMs} vs ${upload}`);
    assert.equal(aside.stateUploadMs, inRound.stateUploadMs);
    // identical links: the saving replica is the slowest of the apply phase, so the whole upload leaves the round
    assert.ok(Math.abs(inRound.ms - aside.ms - upload) < 1e-6, `${replicas.length} replicas: ${inRound.ms} - ${aside.ms} vs ${upload}`);
    assert.equal(aside.bytesTotal, inRound.bytesTotal);
  }
  assert.deepEqual(stageMergeTime(params, [], { heartbeatMs: 1000 }), { ms: 0, bytesPerReplica: 0, bytesTotal: 0, partitions: 0, stateUploadMs: 0 });
});

test('simulated, the state save aside shortens merge rounds by the upload, and the saving replica sits out the rounds its upload overlaps', () => {
  // 2 stages × 2 replicas of gpt-tiny on 1 Mbit/s uplinks: a state upload takes minutes, a merge is due every 20 inner steps
  const hardware: HardwareTable = { classes: [{ name: 'box', share: 1, gflops: 1000, memoryGB: 8, upMbps: 1, downMbps: 100, latencyMs: 0, sessionHours: 1 }] };
  const base = { modelName: 'gpt-tiny', miners: 4, stages: 2, hours: 2, churn: 0, hardware, mergeEvery: 20, deadlineMs: 1e6, activationRatio: 100 };
  const inRound = simulate(simOptions(base));
  const aside = simulate(simOptions({ ...base, stateSave: 'aside' }));
  assert.equal(inRound.stateSave, 'in-round');
  assert.equal(aside.stateSave, 'aside');
  assert.deepEqual(aside.stages.map((s) => s.replicas), [2, 2]);
  const upload = Math.max(...aside.stages.map((s) => (s.params * STATE_BYTES_PER_PARAM * 8) / 1e6 * 1000));
  assert.ok(inRound.merges.rounds >= 2 && aside.merges.rounds >= 2, `${inRound.merges.rounds} and ${aside.merges.rounds} rounds`);
  assert.ok(inRound.merges.meanMs - aside.merges.meanMs > 0.9 * upload, `mean round ${inRound.merges.meanMs} → ${aside.merges.meanMs} ms, upload ${upload} ms`);
  assert.ok(aside.tokensPerS > 1.2 * inRound.tokensPerS, `tokens/s ${inRound.tokensPerS} → ${aside.tokensPerS}`);
  // a replica still uploading the state is not in the next round: most rounds merge one replica per stage, shorter than any round of two
  const box = { upMbps: 1, downMbps: 100, latencyMs: 0 };
  const pair = Math.min(...aside.stages.map((s) => stageMergeTime(s.params, [box, box], { heartbeatMs: simOptions(base).heartbeatMs, stateAside: true }).ms));
  assert.ok(aside.merges.meanMs < pair, `mean round ${aside.merges.meanMs} ms, a round of two ${pair} ms`);
  assert.throws(() => simOptions({ ...base, stateSave: 'later' as never }), /state save must be in-round or aside/);
});
