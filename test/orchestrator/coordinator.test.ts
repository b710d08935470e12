// The coordinator in-process: a real Coordinator on a real OrchestratorState
// and FsBlobStore, driven by fake miners' heartbeats and a hand-moved clock
// (test/orchestrator/helpers.ts). Planning, the microbatch flow, bad reports,
// deadlines, vanished and evicted miners, whole merge rounds and restarts,
// without a child process or a socket.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decodePartitionFrame } from '../../src/merge/pseudo-gradient.ts';
import { partitionVector } from '../../src/merge/partition.ts';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { APPLY_TIMEOUT_MS, MERGE_TIMEOUT_MS, UPLOAD_TIMEOUT_MS } from '../../src/orchestrator/merges.ts';
import type { RunRecord } from '../../src/orchestrator/state/runs.ts';
import type { MergeTask } from '../../src/protocol/messages.ts';
import {
  completeMicrobatch,
  expectNimbleError,
  Harness,
  HARDWARE,
  mergeAndUpload,
  pseudoGradientFrames,
  report,
  roundKey,
  stageParamCount,
  stageState,
  uploadPseudoGradient,
  type FakeMiner,
} from './helpers.ts';


/** A harness closed when the test ends. */
async function harness(t: { after: (fn: () => void) => void }, options: Parameters<typeof Harness.open>[0] = {}): Promise<Harness> {
  const h = await Harness.open(options);
  t.after(() => h.close());
  return h;
}

/** Each miner heartbeats once, so that it knows its assignment (and names it in its next heartbeat). */
function beatAll(...miners: FakeMiner[]): void {
  for (const m of miners) m.beat();
}

/** The merge task of a miner's next heartbeat (asserted present). */
function taskOf(m: FakeMiner): MergeTask {
  const task = m.beat().merge;
  assert.ok(task, `${m.name} has a merge task`);
  return task;
}

/**
 * Runs `count` microbatches through a 2-stage run: the stage-0 replicas take
 * them in turns, each goes on to the stage-1 replicas in turns. Returns their ids.
 */
function trainMicrobatches(h: Harness, run: RunRecord, count: number): number[] {
  const [s0, s1] = [h.replicas(run.id, 0), h.replicas(run.id, 1)];
  const ids: number[] = [];
  for (let i = 0; i < count; i++) {
    const [mb] = s0[i % s0.length].take(1);
    assert.ok(mb, `microbatch ${i} was issued`);
    completeMicrobatch(run.id, mb, s0[i % s0.length], s1[i % s1.length], 5 - i / 10);
    ids.push(mb);
  }
  return ids;
}

/** A run of 2 stages × 2 replicas (4 miners) with a merge due every 2 inner steps per replica, trained up to its first merge and ticked once (round 1 uploading). */
function runAtFirstMerge(h: Harness): RunRecord {
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 8, mergeEvery: 2 });
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 4);
  h.tick();
  assert.equal(h.run(run.id).status, 'merging');
  return h.run(run.id);
}

/** Both replicas of `stage` upload their whole pseudo-gradient. */
async function uploadAll(h: Harness, run: RunRecord, stage: number): Promise<void> {
  for (const [i, m] of h.replicas(run.id, stage).entries()) await uploadPseudoGradient(h, m, taskOf(m), 100 * stage + i);
}

/** Every merger of `stage` merges what its task says. */
async function mergeAll(h: Harness, run: RunRecord, stage: number): Promise<void> {
  for (const m of h.replicas(run.id, stage)) await mergeAndUpload(h, m, taskOf(m));
}

/** The replica told to save the state uploads it; every replica reports the round applied. */
async function applyAll(h: Harness, run: RunRecord, stage: number, round: number): Promise<string> {
  let blob: string | null = null;
  for (const m of h.replicas(run.id, stage)) {
    const task = taskOf(m);
    if (task.saveState) blob = await h.coordinator.merges.putState(m.id, roundKey(m, task), stageState(h, run.id, stage, round));
    m.applied = round;
    m.beat();
  }
  assert.ok(blob, `a replica of stage ${stage} saved the state`);
  return blob;
}

// ---- 1. planning ----------------------------------------------------------------------

test('a run waits with a message naming how many miners are free, then is planned as 2 stages on 2 miners', async (t) => {
  const h = await harness(t);
  const run = h.createRun();
  assert.equal(run.status, 'waiting');
  assert.equal(run.message, 'waiting for miners: 0 of 2 available');
  assert.equal(run.stageCount, 0);
  assert.deepEqual(h.state.runs.stages(run.id), []);

  h.join('a');
  assert.equal(h.run(run.id).status, 'waiting');
  assert.equal(h.run(run.id).message, 'waiting for miners: 1 of 2 available');

  h.join('b');
  const started = h.run(run.id);
  assert.equal(started.status, 'started');
  assert.equal(started.message, null);
  assert.equal(started.stageCount, 2);
  assert.equal(started.startedAt, h.now);
  assert.deepEqual(
    h.state.runs.stages(run.id).map((s) => [s.fromPart, s.toPart, s.mode, s.round, s.stateBlob, s.innerSteps]),
    [
      [0, 3, 'training', 0, null, 0],
      [3, 4, 'training', 0, null, 0],
    ],
  );
  const byStage = h.replicasByStage(run.id);
  assert.deepEqual(byStage.map((names) => names.length), [1, 1]);
  assert.deepEqual(byStage.flat().sort(), ['a', 'b']);
  assert.deepEqual(started.plan!.stages.map((s) => s.miners.map((id) => h.nameOf(id))), byStage);

  // each miner's heartbeat carries its assignment; stage 0 learns the stage-1 replica to send to
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  const r0 = s0.beat();
  assert.deepEqual(r0.assignment, {
    runId: run.id, stage: 0, stageCount: 2, from: 0, to: 3, model: 'gpt-micro', data: 'moby-dick', batchSize: 2,
    seed: 1337, round: 0, stateBlob: null, codec: 'f16', lr: 1e-3,
  });
  assert.deepEqual(r0.nextStage, [{ id: s1.id, url: s1.url, weight: HARDWARE.gflops }]);
  const r1 = s1.beat();
  assert.equal(r1.assignment!.stage, 1);
  assert.deepEqual([r1.assignment!.from, r1.assignment!.to], [3, 4]);
  assert.deepEqual(r1.nextStage, [], 'the last stage sends to nobody');
});

test('a run for 4 miners is planned as 2 stages × 2 replicas when the fourth joins', async (t) => {
  const h = await harness(t);
  const run = h.createRun({ minMiners: 4 });
  h.joinMany('m', 3);
  assert.equal(h.run(run.id).status, 'waiting');
  assert.equal(h.run(run.id).message, 'waiting for miners: 3 of 4 available');
  h.join('m3');
  const started = h.run(run.id);
  assert.equal(started.status, 'started');
  assert.equal(started.stageCount, 2);
  const byStage = h.replicasByStage(run.id);
  assert.deepEqual(byStage.map((names) => names.length), [2, 2]);
  assert.deepEqual(byStage.flat().sort(), ['m0', 'm1', 'm2', 'm3']);
  // a stage-0 replica sends to either stage-1 replica, weighted by speed over queue
  const [s0] = h.replicas(run.id, 0);
  const next = s0.beat().nextStage;
  assert.deepEqual(next.map((p) => p.id).sort(), h.replicas(run.id, 1).map((m) => m.id).sort());
  assert.deepEqual(next.map((p) => p.weight), [10, 10]);
  const [busy] = h.replicas(run.id, 1);
  busy.beat({ queue: 4 });
  assert.equal(s0.beat().nextStage.find((p) => p.id === busy.id)!.weight, 2, '10 GFLOP/s over 1 + 4 queued');
});

// ---- 2. the microbatch flow -----------------------------------------------------------

test('a microbatch is issued to stage 0, advanced by forward and backward reports, and counted done with its tokens, loss and work units', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);

  // a heartbeat that does not yet name the run, stage and round it holds gets its assignment, no work
  assert.deepEqual(s0.beat({ freeSlots: 2 }).microbatches, []);
  assert.equal(h.run(run.id).status, 'started');
  // naming them, with 2 free slots: 2 new microbatches, shards 0 and 1
  const tasks = s0.beat({ freeSlots: 2 }).microbatches;
  assert.deepEqual(tasks.map((x) => [x.shard, x.step]), [
    [0, 0],
    [1, 1],
  ]);
  assert.equal(h.run(run.id).status, 'executing');
  assert.equal(h.run(run.id).microbatchesCreated, 2);
  // stage 1 is never given microbatches: they come to it from stage 0
  s1.beat();
  assert.deepEqual(s1.beat({ freeSlots: 3 }).microbatches, []);
  // a heartbeat naming a stale merge round gets none either
  assert.deepEqual(s0.beat({ freeSlots: 3, round: 7 }).microbatches, []);

  const mb = tasks[0].id;
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, loss: null, attempts: 1 });

  s0.beat({ reports: [report(run.id, mb, 0, 'forward', { next: s1.id })] });
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id, s1.id], progress: 0b0001, loss: null, attempts: 1 });

  const reply = s1.beat({ reports: [report(run.id, mb, 1, 'forward', { loss: 4.25 }), report(run.id, mb, 1, 'backward')] });
  assert.deepEqual(reply.checks, [], 'spot checks are off');
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id, s1.id], progress: 0b1011, loss: 4.25, attempts: 1 });
  assert.equal(h.run(run.id).lastLoss, 4.25);
  assert.equal(h.run(run.id).microbatchesDone, 0, 'not done before stage 0 backward');

  s0.beat({ reports: [report(run.id, mb, 0, 'backward')] });
  assert.deepEqual(pick(h, mb), { status: 'done', minerId: s0.id, path: [s0.id, s1.id], progress: 0b1111, loss: 4.25, attempts: 1 });

  const done = h.run(run.id);
  assert.equal(done.status, 'executing');
  assert.equal(done.microbatchesDone, 1);
  assert.equal(done.tokensDone, 2 * 16, 'batchSize × contextLength');
  assert.equal(done.bytesSent, 4 * 10, 'the bytes each report says it sent');
  assert.equal(done.lastLoss, 4.25);
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.innerSteps, s.lastLoss]), [
    [1, null],
    [1, 4.25],
  ]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/backward`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/backward`]: 1, [`${s1.name}/forward`]: 1 });
  assert.equal(h.state.microbatches.count(run.id, 'issued'), 1, 'the other one is still in flight');
});

test('a stage-0 replica is given at most two slots of microbatches in flight, and never more than the run has steps', async (t) => {
  const h = await harness(t, { slots: 2 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 5 });
  const [s0] = h.replicas(run.id, 0);
  s0.beat();
  assert.equal(s0.take(10).length, 4, '2 × slots');
  assert.equal(s0.take(10).length, 0, 'all 4 still in flight');
  const [s1] = h.replicas(run.id, 1);
  s1.beat();
  for (const mb of h.state.microbatches.byStatus(run.id, 'issued').map((m) => m.id)) completeMicrobatch(run.id, mb, s0, s1);
  assert.equal(h.run(run.id).microbatchesDone, 4);
  assert.deepEqual(s0.beat({ freeSlots: 10 }).microbatches.map((x) => x.shard), [4], 'one step left');
  assert.equal(h.run(run.id).microbatchesCreated, 5);
});

// ---- 3. bad reports -------------------------------------------------------------------

test('a report for a stage the miner does not hold, a run it does not hold, or a microbatch of another run earns an invalid unit and moves nothing', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const first = h.createRun({ steps: 1 });
  h.advance(1);
  const second = h.createRun({ steps: 10 });
  assert.equal(h.run(second.id).status, 'waiting');
  // the first run trains its one microbatch and ends with its final merge; the second starts on the freed miners
  const [oldMb] = await trainToCompletion(h, first);
  assert.equal(h.run(second.id).status, 'started');
  const [s0] = h.replicas(second.id, 0);
  const [s1] = h.replicas(second.id, 1);
  beatAll(s0, s1);
  const [mb] = s0.take(1);
  s0.beat({ reports: [report(second.id, mb, 0, 'forward', { next: s1.id })] });
  const before = pick(h, mb);
  const workBefore = h.work(second.id);

  // stage 1's forward, reported by the stage-0 replica
  s0.beat({ reports: [report(second.id, mb, 1, 'forward', { loss: 3 })] });
  // the first run's microbatch, reported under the first run (which it no longer holds) and under the second
  s1.beat({ reports: [report(first.id, oldMb, 1, 'backward')] });
  s1.beat({ reports: [report(second.id, oldMb, 1, 'backward')] });
  // a microbatch that does not exist
  s1.beat({ reports: [report(second.id, 999_999, 1, 'forward')] });

  assert.deepEqual(pick(h, mb), before, 'the microbatch did not move');
  assert.equal(pick(h, oldMb).status, 'done');
  assert.equal(h.run(second.id).lastLoss, null);
  assert.equal(h.run(second.id).microbatchesDone, 0);
  assert.equal(h.run(first.id).microbatchesDone, 1);
  assert.deepEqual(h.work(second.id), { ...workBefore, [`${s0.name}/invalid`]: 1, [`${s1.name}/invalid`]: 2 });
  assert.deepEqual(
    h.state.ledger.workTotals(first.id).filter((w) => w.kind === 'invalid').map((w) => [h.nameOf(w.minerId), w.units]),
    [[s1.name, 1]],
  );
});

// ---- 4. deadlines ---------------------------------------------------------------------

test('a microbatch past its deadline is pending again, the miner whose hop it stalled at is charged a dropped unit, and the miners on its path are told once to abandon it', async (t) => {
  const h = await harness(t, { microbatchDeadlineMs: 2_000 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const [x, y] = s0.take(2);
  // x got to stage 1 and stalled there; y never left stage 0
  s0.beat({ reports: [report(run.id, x, 0, 'forward', { next: s1.id })] });

  h.advance(2_000);
  h.tick();
  assert.equal(h.state.microbatches.count(run.id, 'issued'), 2, 'not past the deadline yet');
  h.advance(1);
  h.tick();
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(pick(h, y).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s0.name}/dropped`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/dropped`]: 1 });

  const r1 = s1.beat();
  assert.deepEqual(r1.abandon, [x]);
  // stage 0 is told to abandon both, and is given them again first (same ids and shards) before new shards
  const r0 = s0.beat({ freeSlots: 3 });
  assert.deepEqual(r0.abandon, [x, y]);
  assert.deepEqual(r0.microbatches.map((m) => m.id).slice(0, 2), [x, y]);
  assert.deepEqual(r0.microbatches.map((m) => m.shard), [0, 1, 2]);
  assert.equal(pick(h, x).attempts, 2);
  assert.deepEqual(pick(h, x).path, [s0.id]);
  // once
  assert.deepEqual(s1.beat().abandon, []);
  assert.deepEqual(s0.beat().abandon, []);
});

test('a miner that reports a microbatch dropped is charged for it, and the microbatch is requeued and abandoned along its path', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const [x] = s0.take(1);
  s0.beat({ reports: [report(run.id, x, 0, 'forward', { next: s1.id })] });
  const reply = s1.beat({ reports: [report(run.id, x, 1, 'dropped', { reason: 'queue full', bytesSent: 0 })] });
  assert.deepEqual(reply.abandon, [x], 'told at once, in the reply to its own report');
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s0.name}/forward`]: 1, [`${s1.name}/dropped`]: 1 });
  assert.deepEqual(s0.beat().abandon, [x]);
  // a late report of the dropped attempt is credited, and moves nothing
  s1.beat({ reports: [report(run.id, x, 1, 'forward', { loss: 2 })] });
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(h.run(run.id).lastLoss, null);
  assert.equal(h.work(run.id)[`${s1.name}/forward`], 1);
});

// ---- 5. vanished miners ---------------------------------------------------------------

test('a miner silent past minerTimeoutMs is marked gone on tick, its microbatches are requeued and charged as dropped, and the run is re-planned on the others', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 4_000 });
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 20 });
  beatAll(...h.miners.values());
  const [a0, b0] = h.replicas(run.id, 0);
  const [a1, b1] = h.replicas(run.id, 1);
  const [x] = a0.take(1);
  const [y] = b0.take(1);
  a0.beat({ reports: [report(run.id, x, 0, 'forward', { next: a1.id })] });
  b0.beat({ reports: [report(run.id, y, 0, 'forward', { next: b1.id })] });

  // a1 stops heartbeating; the others go on
  h.advance(3_000);
  beatAll(a0, b0, b1);
  h.advance(1_000);
  h.tick();
  assert.equal(h.state.miners.get(a1.id)!.alive, true, 'silent for exactly the timeout: still alive');
  h.advance(1);
  h.tick();
  assert.equal(h.state.miners.get(a1.id)!.alive, false);
  assert.deepEqual(h.state.miners.list(true).map((m) => m.name).sort(), [a0.name, b0.name, b1.name].sort());
  assert.equal(pick(h, x).status, 'pending', 'x was on its path');
  assert.equal(pick(h, y).status, 'issued', 'y was not');
  assert.equal(h.work(run.id)[`${a1.name}/dropped`], 1);
  assert.deepEqual(a0.beat().abandon, [x]);

  // re-planned: the same stages on the 3 miners left, stage 1 sends to b1 only
  const plan = h.run(run.id).plan!;
  assert.deepEqual(plan.stages.map((s) => s.miners.map((id) => h.nameOf(id)).sort()), [[a0.name, b0.name].sort(), [b1.name]]);
  assert.deepEqual(h.replicasByStage(run.id), [[a0.name, b0.name].sort(), [b1.name]]);
  assert.equal(h.run(run.id).message, null);
  assert.deepEqual(b0.beat().nextStage.map((p) => p.id), [b1.id]);
  // x goes out again
  assert.deepEqual(a0.take(1), [x]);
});

test('a run whose last replica of a stage vanished stalls with a message, and resumes when a miner joins', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 4_000 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 20 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const [x] = s0.take(1);
  s0.beat({ reports: [report(run.id, x, 0, 'forward', { next: s1.id })] });

  h.advance(4_001);
  s0.beat();
  h.tick();
  const stalled = h.run(run.id);
  assert.equal(stalled.status, 'executing');
  assert.match(stalled.message ?? '', /^stalled: stage 1 \[3,4\) lost its last replica/);
  assert.deepEqual(stalled.plan!.stages.map((s) => s.miners.length), [1, 0]);
  assert.deepEqual(h.replicasByStage(run.id), [[s0.name]]);
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(h.work(run.id)[`${s1.name}/dropped`], 1);
  assert.deepEqual(s0.beat({ freeSlots: 3 }).microbatches, [], 'nothing is issued while a stage has no replica');

  const fresh = h.join('fresh');
  assert.equal(h.run(run.id).message, null);
  assert.deepEqual(h.replicasByStage(run.id), [[s0.name], [fresh.name]]);
  const resumed = s0.beat({ freeSlots: 1 });
  assert.deepEqual(resumed.microbatches.map((m) => m.id), [x]);
  assert.deepEqual(resumed.nextStage.map((p) => p.id), [fresh.id]);
});

// ---- 6. eviction ----------------------------------------------------------------------

test('an evicted miner gets 403 with the reason on every heartbeat until it joins again; its work is re-issued', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 20 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const [x] = s0.take(1);
  s0.beat({ reports: [report(run.id, x, 0, 'forward', { next: s1.id })] });
  const seen = h.state.miners.get(s1.id)!.lastSeen;

  await expectNimbleError(() => h.coordinator.heartbeat('0x' + '1'.repeat(40), { freeSlots: 0, queue: 0, reports: [] }), 404, /has not joined/);

  const reason = 'stake too low: 0 NIM staked, 100 NIM required';
  h.coordinator.evict(s1.id, reason);
  assert.equal(h.state.miners.get(s1.id)!.alive, false);
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(h.work(run.id)[`${s1.name}/dropped`], 1);
  assert.match(h.run(run.id).message ?? '', /^stalled: stage 1/);
  h.advance(500);
  for (let i = 0; i < 2; i++) {
    const err = await expectNimbleError(() => s1.beat(), 403);
    assert.equal(err.message, reason);
    assert.equal(err.code, 'forbidden');
  }
  assert.equal(h.state.miners.get(s1.id)!.lastSeen, seen, 'a refused heartbeat does not count as seen');
  assert.equal(h.state.miners.get(s1.id)!.alive, false);

  s1.join();
  const back = s1.beat();
  assert.equal(back.assignment?.stage, 1);
  assert.equal(h.state.miners.get(s1.id)!.alive, true);
  assert.equal(h.run(run.id).message, null);
});

// ---- 7. a whole merge round -----------------------------------------------------------

test('a merge round of 2 replicas per stage: drain, upload, merge, apply, save: the stages move to round 1 with a saved state', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 8, mergeEvery: 2 });
  beatAll(...h.miners.values());
  const [a0, b0] = h.replicas(run.id, 0);
  const [a1] = h.replicas(run.id, 1);

  // 2 inner steps per replica × 2 replicas: the merge is due, issuing stops so the pipeline drains
  trainMicrobatches(h, run, 3);
  assert.equal(a0.take(1).length, 1, 'the merge is not due after 3');
  completeMicrobatch(run.id, h.state.microbatches.byStatus(run.id, 'issued')[0].id, a0, a1);
  assert.equal(h.run(run.id).microbatchesDone, 4);
  assert.deepEqual(a0.take(3), []);
  assert.deepEqual(b0.take(3), []);
  assert.equal(h.run(run.id).status, 'executing', 'no round before the tick');
  assert.equal(a0.last!.merge, null);

  h.tick();
  assert.equal(h.run(run.id).status, 'merging');
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [
    ['merging', 0],
    ['merging', 0],
  ]);
  const key0 = { runId: run.id, stage: 0, round: 1 };
  const round0 = h.state.mergeRounds.get(key0)!;
  assert.equal(round0.status, 'uploading');
  assert.equal(round0.partitions, 4, '2 per replica');
  assert.deepEqual(round0.replicas, [a0.id, b0.id]);
  assert.equal(h.state.mergeRounds.get({ ...key0, stage: 1 })!.status, 'uploading');

  // uploading: every replica is asked for its pseudo-gradient, partitions tiling the stage's parameters
  const n0 = stageParamCount(h, run.id, 0);
  const t0 = taskOf(a0);
  assert.deepEqual(
    { ...t0, partitions: undefined },
    { round: 1, partitions: undefined, upload: true, merge: [], apply: null, saveState: false, aggregator: 'mean', outerLr: 0.7, outerMomentum: 0.9 },
  );
  assert.deepEqual(t0.partitions, partitionVector(n0, 4));
  assert.equal(t0.partitions[3].end, n0);
  assert.equal(taskOf(b0).upload, true);
  assert.deepEqual(a0.take(3), [], 'no microbatches during a round');

  // bad uploads: a non-replica (403), a partition out of range (400), the wrong partition's frame (400), a merged partition now (409)
  const frames = pseudoGradientFrames(h, a0, t0, 1);
  await expectNimbleError(() => h.coordinator.merges.putPseudoGradient(a1.id, key0, 0, 2, frames[0]), 403, /is not a replica/);
  await expectNimbleError(() => h.coordinator.merges.putPseudoGradient(a0.id, key0, 4, 2, frames[0]), 400, /partition 4 outside 0\.\.3/);
  await expectNimbleError(() => h.coordinator.merges.putPseudoGradient(a0.id, key0, 1, 2, frames[0]), 400);
  await expectNimbleError(() => h.coordinator.merges.putMerged(a0.id, key0, 0, frames[0]), 409, /is uploading, not merging/);
  await expectNimbleError(() => h.coordinator.merges.putPseudoGradient(a0.id, { ...key0, round: 2 }, 0, 2, frames[0]), 409, /not open/);
  assert.deepEqual(h.state.mergeRounds.uploads(key0), []);

  await uploadPseudoGradient(h, a0, t0, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'uploading', 'b0 has not uploaded');
  assert.equal(taskOf(a0).upload, false, 'a0 uploaded all its partitions');
  await uploadPseudoGradient(h, b0, taskOf(b0), 2);
  await uploadAll(h, run, 1);
  assert.equal(h.state.mergeRounds.uploads(key0).length, 8);

  // merging: each partition is merged by both replicas, from both replicas' uploads
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'merging');
  const uploads = h.state.mergeRounds.uploads(key0);
  for (const m of [a0, b0]) {
    const task = taskOf(m);
    assert.equal(task.upload, false);
    assert.deepEqual(task.merge.map((j) => j.partition), [0, 1, 2, 3]);
    for (const job of task.merge) {
      assert.deepEqual(
        job.inputs,
        uploads.filter((u) => u.partition === job.partition).map((u) => ({ minerId: u.minerId, blob: u.blob, samples: 2 })),
      );
    }
  }
  await expectNimbleError(() => h.coordinator.merges.putPseudoGradient(a0.id, key0, 0, 2, frames[0]), 409, /is merging, not uploading/);
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  assert.deepEqual(taskOf(a0).merge, [], 'nothing left to merge');
  assert.equal(h.work(run.id)[`${a0.name}/merge`], 4);

  // applying: everyone applies the chosen merged partitions; exactly one replica saves the state
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'applying');
  const results = h.state.mergeRounds.results(key0);
  const chosen = [0, 1, 2, 3].map((p) => results.find((r) => r.partition === p)!.blob);
  const tasks = [a0, b0].map(taskOf);
  for (const task of tasks) assert.deepEqual(task.apply, chosen.map((blob, partition) => ({ partition, blob })));
  assert.deepEqual(tasks.map((x) => x.saveState), [true, false], 'the first replica by id saves');
  // a merged partition decodes to (about) the mean of the two replicas' slices
  const merged = decodePartitionFrame(await h.blobs.get(chosen[0]), t0.partitions[0], { codecs: ['int8-block'] });
  const ins = await Promise.all(uploads.filter((u) => u.partition === 0).map(async (u) => decodePartitionFrame(await h.blobs.get(u.blob), t0.partitions[0])));
  assert.ok(Math.abs(merged[5] - (ins[0][5] + ins[1][5]) / 2) < 1e-3);

  await expectNimbleError(() => h.coordinator.merges.putState(a0.id, key0, stageState(h, run.id, 0, 2)), 400, /round 2; expected \[0, 3\) round 1/);
  await expectNimbleError(() => h.coordinator.merges.putState(a0.id, key0, stageState(h, run.id, 1, 1)), 400, /parts \[3, 4\)/);
  const blob0 = await h.coordinator.merges.putState(a0.id, key0, stageState(h, run.id, 0, 1));
  assert.equal(h.state.mergeRounds.get(key0)!.stateBlob, blob0);
  assert.equal(taskOf(a0).saveState, false, 'saved once');
  const info = checkpointInfo(decodeSafetensors(await h.blobs.get(blob0)));
  assert.deepEqual([info.from, info.to, info.step], [0, 3, 1]);
  // the round waits until every replica reports (with its heartbeats) the round applied
  a0.applied = 1;
  a0.beat();
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'applying', 'b0 has not applied it');
  b0.applied = 1;
  b0.beat();
  const blob1 = await applyAll(h, run, 1, 1);

  // done: round 1 with its state, one merge counted, training again
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'done');
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round, s.stateBlob, s.innerSteps]), [
    ['training', 1, blob0, 0],
    ['training', 1, blob1, 0],
  ]);
  const after = h.run(run.id);
  assert.equal(after.status, 'executing');
  assert.equal(after.mergesDone, 1);
  const reply = a0.beat({ freeSlots: 1 });
  assert.equal(reply.merge, null);
  assert.deepEqual([reply.assignment!.round, reply.assignment!.stateBlob], [1, blob0]);
  assert.deepEqual(reply.microbatches.map((m) => m.shard), [4], 'issuing resumes');
});

test('a stage of one replica skips straight to applying; the final merge after the last microbatch completes the run', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 2, mergeEvery: 100 });
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 2);
  h.tick();
  const k = { runId: run.id, stage: 0, round: 1 };
  assert.deepEqual([h.state.mergeRounds.get(k)!.status, h.state.mergeRounds.get(k)!.partitions], ['applying', 0]);
  const [s0] = h.replicas(run.id, 0);
  assert.deepEqual({ ...taskOf(s0), partitions: [] }, {
    round: 1, partitions: [], upload: false, merge: [], apply: [], saveState: true, aggregator: 'mean', outerLr: 0.7, outerMomentum: 0.9,
  });
  await applyAll(h, run, 0, 1);
  h.tick();
  assert.equal(h.run(run.id).status, 'merging', 'stage 1 has not saved');
  await applyAll(h, run, 1, 1);
  h.tick();
  const done = h.run(run.id);
  assert.equal(done.status, 'completed');
  assert.equal(done.finishedAt, h.now);
  assert.equal(done.mergesDone, 1);
  assert.equal(h.state.runs.assignmentOf(s0.id), undefined, 'the miners are free');
});

// ---- 8. a replica vanishing mid-round -------------------------------------------------

test('a replica that goes silent while uploading is dropped from the round after the upload timeout and charged a dropped unit; the round completes with the other', async (t) => {
  // the miners count as alive longer than the upload timeout, so it is the round that lets go of the silent one
  const h = await harness(t, { minerTimeoutMs: 10 * UPLOAD_TIMEOUT_MS });
  const run = runAtFirstMerge(h);
  const [stays, vanishes] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  await uploadPseudoGradient(h, stays, taskOf(stays), 1);
  await uploadAll(h, run, 1);

  h.advance(UPLOAD_TIMEOUT_MS);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'uploading', 'still waiting at the timeout');
  assert.equal(h.work(run.id)[`${vanishes.name}/dropped`], undefined);
  h.advance(1);
  h.tick();
  const round = h.state.mergeRounds.get(key)!;
  assert.equal(round.status, 'merging');
  assert.deepEqual(round.replicas, [stays.id]);
  assert.deepEqual(round.plan.mergers, [[stays.id], [stays.id], [stays.id], [stays.id]]);
  assert.equal(h.work(run.id)[`${vanishes.name}/dropped`], 1);
  assert.equal(h.work(run.id)[`${stays.name}/dropped`], undefined);

  // the one left merges every partition from its own upload alone
  const task = taskOf(stays);
  assert.deepEqual(task.merge.map((j) => j.inputs.map((i) => i.minerId)), [[stays.id], [stays.id], [stays.id], [stays.id]]);
  await mergeAndUpload(h, stays, task);
  await mergeAll(h, run, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'applying');
  // the dropped replica is not asked for anything: it waits for the new state
  const idle = taskOf(vanishes);
  assert.deepEqual([idle.upload, idle.merge, idle.apply, idle.saveState], [false, [], null, false]);
  assert.equal(taskOf(stays).saveState, true);
  const state = await h.coordinator.merges.putState(stays.id, roundKey(stays, taskOf(stays)), stageState(h, run.id, 0, 1));
  stays.applied = 1;
  stays.beat();
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'done');
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => s.round), [1, 1]);
  assert.equal(h.state.runs.stage(run.id, 0)!.stateBlob, state);
  assert.equal(h.run(run.id).status, 'executing');
  assert.equal(h.work(run.id)[`${vanishes.name}/dropped`], 1, 'charged once');
});

// ---- 9. restart -----------------------------------------------------------------------

test('after a restart mid-run the runs, stages, assignments and an in-flight microbatch continue where they were', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 4_000 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const [done, inFlight] = s0.take(2);
  completeMicrobatch(run.id, done, s0, s1, 4);
  s0.beat({ reports: [report(run.id, inFlight, 0, 'forward', { next: s1.id })] });
  const before = { run: h.run(run.id), stages: h.state.runs.stages(run.id), mb: pick(h, inFlight), assignments: h.state.runs.assignments(run.id) };

  h.advance(3_000);
  await h.restart();
  assert.deepEqual(h.run(run.id), before.run);
  assert.deepEqual(h.state.runs.stages(run.id), before.stages);
  assert.deepEqual(h.state.runs.assignments(run.id), before.assignments);
  assert.deepEqual(pick(h, inFlight), before.mb);

  // the miners alive before get a full timeout from the restart to re-attach
  h.advance(3_999);
  h.tick();
  assert.equal(h.state.miners.list(true).length, 2);
  s1.beat({ reports: [report(run.id, inFlight, 1, 'forward', { loss: 3.5 }), report(run.id, inFlight, 1, 'backward')] });
  s0.beat({ reports: [report(run.id, inFlight, 0, 'backward')] });
  const after = h.run(run.id);
  assert.equal(pick(h, inFlight).status, 'done');
  assert.deepEqual([after.status, after.microbatchesDone, after.lastLoss, after.microbatchesCreated], ['executing', 2, 3.5, 2]);
  assert.equal(s0.take(1).length, 1);
  assert.equal(h.run(run.id).microbatchesCreated, 3, 'new shards continue after the ones created before the restart');
});

test('after a restart during a merge round the round continues from its phase with the uploads already made', async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  await uploadPseudoGradient(h, a0, taskOf(a0), 1);
  await uploadAll(h, run, 1);
  h.tick();
  const before = { s0: h.state.mergeRounds.get(key), s1: h.state.mergeRounds.get({ ...key, stage: 1 }) };
  assert.equal(before.s1!.status, 'merging');

  await h.restart();
  assert.equal(h.run(run.id).status, 'merging');
  assert.deepEqual(h.state.mergeRounds.get(key), before.s0);
  assert.deepEqual(h.state.mergeRounds.get({ ...key, stage: 1 }), before.s1);
  assert.equal(h.state.mergeRounds.uploads(key).length, 4);
  assert.equal(taskOf(a0).upload, false, 'a0 is not asked again');
  assert.equal(taskOf(b0).upload, true);
  assert.deepEqual(a0.take(3), [], 'still draining');

  await uploadPseudoGradient(h, b0, taskOf(b0), 2);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'merging');
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  h.tick();
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  // the replicas' applied rounds come with their heartbeats: another restart before the tick loses nothing that matters
  await h.restart();
  beatAll(...h.miners.values());
  h.tick();
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [
    ['training', 1],
    ['training', 1],
  ]);
  assert.deepEqual([h.run(run.id).status, h.run(run.id).mergesDone], ['executing', 1]);
});

test('a round does not wait forever in applying: a replica that never applies, or never saves the state it was asked to, is dropped after the apply timeout', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 10 * APPLY_TIMEOUT_MS });
  const run = runAtFirstMerge(h);
  for (const stage of [0, 1]) await uploadAll(h, run, stage);
  h.tick();
  for (const stage of [0, 1]) await mergeAll(h, run, stage);
  h.tick();
  // stage 0: the replica asked to save goes silent; stage 1: both save and apply except one that never applies
  const key0 = { runId: run.id, stage: 0, round: 1 };
  const key1 = { runId: run.id, stage: 1, round: 1 };
  const [saver, other] = h.replicas(run.id, 0).sort((a, b) => (a.id < b.id ? -1 : 1));
  assert.equal(taskOf(saver).saveState, true);
  assert.equal(taskOf(other).saveState, false);
  other.applied = 1;
  other.beat();
  const [b0, b1] = h.replicas(run.id, 1).sort((a, b) => (a.id < b.id ? -1 : 1));
  await h.coordinator.merges.putState(b0.id, roundKey(b0, taskOf(b0)), stageState(h, run.id, 1, 1));
  b0.applied = 1;
  b0.beat();
  b1.beat(); // alive, never applies

  h.advance(APPLY_TIMEOUT_MS);
  h.tick();
  assert.deepEqual([h.state.mergeRounds.get(key0)!.status, h.state.mergeRounds.get(key1)!.status], ['applying', 'applying'], 'still waiting at the timeout');
  h.advance(1);
  h.tick();
  assert.deepEqual(h.state.mergeRounds.get(key0)!.replicas, [other.id], 'the silent saver left the round');
  assert.equal(h.state.mergeRounds.get(key1)!.status, 'done', 'stage 1 finished without the replica that never applied');
  assert.deepEqual([h.work(run.id)[`${saver.name}/dropped`], h.work(run.id)[`${b1.name}/dropped`], h.work(run.id)[`${other.name}/dropped`]], [1, 1, undefined]);
  // the one left in stage 0 is asked to save now, and the round finishes
  const task = taskOf(other);
  assert.equal(task.saveState, true);
  await h.coordinator.merges.putState(other.id, roundKey(other, task), stageState(h, run.id, 0, 1));
  other.beat();
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'done');
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [['training', 1], ['training', 1]]);
});

// ---- regressions: bugs these tests found, now fixed ---------------------------------------

// With 2 replicas both merge every partition; when the merge timeout passed with a partition
// unmerged, every live merger was "replaced" by nobody and reassign() threw out of tick() on
// every tick. Now the live mergers keep their partitions with a fresh timeout.
test('a partition nobody merged within the merge timeout stays with its live mergers when no other replica can take it, and the tick does not throw', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 10 * MERGE_TIMEOUT_MS });
  const run = runAtFirstMerge(h);
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  const key = { runId: run.id, stage: 0, round: 1 };
  assert.equal(h.state.mergeRounds.get(key)!.status, 'merging');
  const mergers = h.state.mergeRounds.get(key)!.plan.mergers.map((ms) => [...ms].sort());

  h.advance(MERGE_TIMEOUT_MS + 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'merging');
  assert.deepEqual(h.state.mergeRounds.get(key)!.plan.mergers.map((ms) => [...ms].sort()), mergers);
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'applying');
});

// A miner moved to a new run sends its old run's runId and round once; that round used to be
// recorded for the new run's stage and blocked its first round in 'applying'. Only a report of
// the stage's open round, from a heartbeat naming that run and stage, counts now.
test("a miner moved to a new run does not carry its old run's merge round into the new run's rounds", async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const first = h.createRun({ steps: 2, mergeEvery: 1 });
  h.advance(1);
  const second = h.createRun({ steps: 10, mergeEvery: 1 });
  await trainOneRound(h, first, 1);
  await trainOneRound(h, first, 2);
  assert.equal(h.run(first.id).status, 'completed');
  assert.equal(h.run(second.id).status, 'started');
  // the miners' next heartbeats still name the first run and its round 2
  await trainOneRound(h, second, 1);
  assert.deepEqual(h.state.runs.stages(second.id).map((s) => [s.mode, s.round]), [
    ['training', 1],
    ['training', 1],
  ]);
  assert.equal(h.run(second.id).status, 'executing');
});

// Evictions were kept only in memory: after a restart an evicted miner's heartbeat revived it
// without the stake check of a join. They are stored with the miner now.
test('an eviction survives a restart: the heartbeats of the evicted miner still get 403 until it joins again', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  beatAll(...h.miners.values());
  const [s1] = h.replicas(run.id, 1);
  h.coordinator.evict(s1.id, 'stake too low');
  await h.restart();
  await expectNimbleError(() => s1.beat(), 403, /stake too low/);
  assert.equal(h.state.miners.get(s1.id)!.alive, false);
});

// ---- helpers of this file ---------------------------------------------------------------

/** The fields of a microbatch the flow moves. */
function pick(h: Harness, id: number): { status: string; minerId: string | null; path: (string | null)[]; progress: number; loss: number | null; attempts: number } {
  const mb = h.state.microbatches.get(id);
  assert.ok(mb, `microbatch ${id} exists`);
  return { status: mb.status, minerId: mb.minerId, path: mb.path, progress: mb.progress, loss: mb.loss, attempts: mb.attempts };
}

/** One microbatch through a single-replica 2-stage run with a merge due after it, then its merge round (apply and save only). */
async function trainOneRound(h: Harness, run: RunRecord, round: number): Promise<void> {
  beatAll(...h.replicas(run.id, 0), ...h.replicas(run.id, 1));
  trainMicrobatches(h, run, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get({ runId: run.id, stage: 0, round })?.status, 'applying');
  await applyAll(h, run, 0, round);
  await applyAll(h, run, 1, round);
  h.tick();
}

/** Trains a single-replica 2-stage run to its end: every step, then the final merge (apply and save only). Returns the microbatch ids. */
async function trainToCompletion(h: Harness, run: RunRecord): Promise<number[]> {
  beatAll(...h.replicas(run.id, 0), ...h.replicas(run.id, 1));
  const ids = trainMicrobatches(h, run, run.steps);
  h.tick();
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.equal(h.run(run.id).status, 'completed');
  return ids;
}
