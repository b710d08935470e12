// The coordinator in-process: a real Coordinator on a real OrchestratorState
// and FsBlobStore, driven by fake miners' heartbeats and a hand-moved clock
// (test/orchestrator/helpers.ts). The fake miners behave like honest ones:
// they join with a session key, receipt the frames handed to them and claim
// their hops with frame shas and receipts; hand-made reports stand for the
// dishonest and stale ones. Planning, the microbatch flow credited on
// evidence, bad and stale claims, deadlines and who is charged for them,
// lost heartbeat replies, spot-check timeouts, vanished and evicted miners,
// whole merge rounds and what they check (pseudo-gradients within AdamW's
// reach, weights by credited steps, merged partitions recomputed on a dispute,
// stage states bit for bit, the robust rule with 3 replicas) and restarts,
// without a child process or a socket.
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { decodePartitionFrame } from '../../../src/merge/pseudo-gradient.ts';
import { l2Norm } from '../../../src/merge/merge-partition.ts';
import { partitionVector } from '../../../src/merge/partition.ts';
import { adamMoveBound, ADAMW_DEFAULTS, reach } from '../../../src/model/adamw.ts';
import { checkpointInfo } from '../../../src/model/checkpoint.ts';
import { rangeParams } from '../../../src/model/model-ref.ts';
import { DEFAULT_HTTP_TIMEOUTS } from '../../../src/http/server.ts';
import { decodeSafetensors } from '../../../src/model/safetensors.ts';
import { COORDINATOR_DEFAULTS } from '../../../src/orchestrator/training/coordinator.ts';
import { buildApi } from '../../../src/orchestrator/http.ts';
import { FEEDBACK_STEPS, RECOMPUTED } from '../../../src/orchestrator/training/merge-checks.ts';
import { BAN_MS, OffenceError } from '../../../src/orchestrator/rewards/offences.ts';
import { stateBytesBound } from '../../../src/orchestrator/training/merge-uploads.ts';
import { APPLY_TIMEOUT_MS, MERGE_TIMEOUT_MS, UPLOAD_TIMEOUT_MS } from '../../../src/orchestrator/training/merges.ts';
import type { RoundKey } from '../../../src/orchestrator/state/merge-rounds.ts';
import type { RunRecord } from '../../../src/orchestrator/state/runs.ts';
import { signReceipt, verifyTicket } from '../../../src/protocol/evidence.ts';
import type { MicrobatchTask, WorkReport } from '../../../src/protocol/messages.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { RequestSigner } from '../../../src/protocol/signing.ts';
import {
  appliedState,
  completeAlong,
  completeMicrobatch,
  expectNimbleError,
  fakePseudoGradient,
  FRAME_BYTES,
  Harness,
  HARDWARE,
  mergeAndUpload,
  mergedFrame,
  mergeRound,
  pseudoGradientFrames,
  report,
  sha,
  stageParamCount,
  stageState,
  uploadPseudoGradient,
  type FakeMiner,
  type FakeStageState,
  OWNER,
} from '../helpers.ts';
import { applyAll, beatAll, blobIds, mergeAll, runAtFirstMerge, taskOf, tickSettled, trainMicrobatches, trainOneRound, trainToCompletion, uploadAll } from '../flows.ts';


type TestContext = { after: (fn: () => void) => void };
type HarnessOptions = Parameters<typeof Harness.open>[0];

/** A harness closed when the test ends. */
async function harness(t: TestContext, options: HarnessOptions = {}): Promise<Harness> {
  const h = await Harness.open(options);
  t.after(() => h.close());
  return h;
}

/** Two miners holding a run of two stages, one replica each, both having beaten once (so each is routed to). */
async function twoStages(t: TestContext, over: Parameters<Harness['createRun']>[0], options: HarnessOptions = {}): Promise<{ h: Harness; run: RunRecord; s0: FakeMiner; s1: FakeMiner }> {
  const h = await harness(t, options);
  h.joinMany('m', 2);
  const run = h.createRun(over);
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  return { h, run, s0, s1 };
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

  // each miner's heartbeat carries its assignment and its neighbours, with the session keys they joined with:
  // stage 0 learns the stage-1 replica to send to, stage 1 the stage-0 replica to send gradients back to
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  assert.notEqual(s0.key.publicKey, s1.key.publicKey);
  assert.equal(h.coordinator.sessionKeyOf(s0.id), s0.key.publicKey);
  const r0 = s0.beat();
  assert.deepEqual(r0.assignment, {
    runId: run.id, stage: 0, stageCount: 2, from: 0, to: 3, model: 'gpt-micro', data: 'moby-dick', batchSize: 2,
    seed: 1337, round: 0, stateBlob: null, codec: 'f16', lr: 1e-3,
  });
  assert.deepEqual(r0.nextStage, [], 's1 has not said it holds stage 1 yet: nobody to send to');
  assert.deepEqual(r0.previousStage, [], 'stage 0 takes activations from nobody');
  assert.deepEqual(s0.take(2), [], 'so no microbatch either');
  const r1 = s1.beat();
  assert.equal(r1.assignment!.stage, 1);
  assert.deepEqual([r1.assignment!.from, r1.assignment!.to], [3, 4]);
  assert.deepEqual(r1.nextStage, [], 'the last stage sends to nobody');
  assert.deepEqual(r1.previousStage, [{ id: s0.id, url: s0.url, sessionKey: s0.key.publicKey, weight: HARDWARE.gflops }], 's0 named its stage in its last heartbeat');
  // once s1 has named its stage too, it is routed to
  s1.beat();
  assert.deepEqual(s0.beat().nextStage, [{ id: s1.id, url: s1.url, sessionKey: s1.key.publicKey, weight: HARDWARE.gflops }]);
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
  // a stage-0 replica sends to either stage-1 replica (once they hold it), weighted by speed over queue
  const [s0] = h.replicas(run.id, 0);
  beatAll(...h.miners.values());
  const next = s0.beat().nextStage;
  assert.deepEqual(next.map((p) => p.id).sort(), h.replicas(run.id, 1).map((m) => m.id).sort());
  assert.deepEqual(next.map((p) => p.sessionKey).sort(), h.replicas(run.id, 1).map((m) => m.key.publicKey).sort());
  assert.deepEqual(next.map((p) => p.weight), [10, 10]);
  const [busy] = h.replicas(run.id, 1);
  busy.beat({ queue: 4 });
  assert.equal(s0.beat().nextStage.find((p) => p.id === busy.id)!.weight, 2, '10 GFLOP/s over 1 + 4 queued');
  // a stage-1 replica hears of both stage-0 replicas
  assert.deepEqual(busy.beat().previousStage.map((p) => p.id).sort(), h.replicas(run.id, 0).map((m) => m.id).sort());
});

// ---- 2. the microbatch flow -----------------------------------------------------------

test('a microbatch is issued to stage 0 with a ticket, claimed hop by hop, and credited only once the claims chain up: tokens, loss and work units at completion', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);

  // a heartbeat that does not yet name the run, stage and round it holds gets its assignment, no work
  assert.deepEqual(s0.beat({ freeSlots: 2 }).microbatches, []);
  assert.equal(h.run(run.id).status, 'started');
  // naming them, but no stage-1 replica has said it holds its stage: nowhere to send an activation, no work
  assert.deepEqual(s0.beat({ freeSlots: 2 }).microbatches, []);
  beatAll(s1);
  // now, with 2 free slots: 2 new microbatches, shards 0 and 1, first attempts
  const tasks = s0.beat({ freeSlots: 2 }).microbatches;
  assert.deepEqual(tasks.map((x) => [x.shard, x.step, x.attempt]), [
    [0, 0, 1],
    [1, 1, 1],
  ]);
  // each with the orchestrator's ticket for exactly that microbatch, attempt, shard and step
  const orchestrator = h.coordinator.identity.key.publicKey;
  for (const x of tasks) {
    const fields = { runId: run.id, microbatch: x.id, attempt: x.attempt, shard: x.shard, step: x.step };
    assert.ok(verifyTicket(orchestrator, h.domain, fields, x.ticket), `the ticket of ${x.id} verifies`);
    assert.ok(!verifyTicket(orchestrator, h.domain, { ...fields, attempt: 2 }, x.ticket), 'not for another attempt');
    assert.ok(!verifyTicket(orchestrator, 'nimble:another-network', fields, x.ticket), 'not on another network');
  }
  assert.equal(h.run(run.id).status, 'executing');
  assert.equal(h.run(run.id).microbatchesCreated, 2);
  // stage 1 is never given microbatches: they come to it from stage 0
  s1.beat();
  assert.deepEqual(s1.beat({ freeSlots: 3 }).microbatches, []);
  // a heartbeat naming a stale merge round gets none either
  assert.deepEqual(s0.beat({ freeSlots: 3, round: 7 }).microbatches, []);

  const mb = tasks[0].id;
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, attempts: 1 });

  // stage 0's forward, with s1's receipt of the activation: the path grows by the receipted receiver
  s0.beat({ reports: [s0.forward(mb, { to: s1 })] });
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id, s1.id], progress: 0b0001, attempts: 1 });
  assert.deepEqual(h.work(run.id), {}, 'nothing is credited before the microbatch is done');

  const reply = s1.beat({ reports: [s1.last(mb, { loss: 4.25 }), s1.backward(mb)] });
  assert.deepEqual(reply.checks, [], 'spot checks are off');
  assert.deepEqual(pick(h, mb), { status: 'issued', minerId: s0.id, path: [s0.id, s1.id], progress: 0b1011, attempts: 1 });
  assert.equal(h.run(run.id).lastLoss, null, 'the loss is recorded at completion');
  assert.equal(h.run(run.id).microbatchesDone, 0, 'not done before stage 0 backward');
  assert.deepEqual(h.work(run.id), {});

  s0.beat({ reports: [s0.backward(mb)] });
  assert.deepEqual(pick(h, mb), { status: 'done', minerId: s0.id, path: [s0.id, s1.id], progress: 0b1111, attempts: 1 });

  const done = h.run(run.id);
  assert.equal(done.status, 'executing');
  assert.equal(done.microbatchesDone, 1);
  assert.equal(done.tokensDone, 2 * 16, 'batchSize × contextLength');
  assert.equal(done.bytesSent, 2 * FRAME_BYTES, 'the frames handed on: the activation and the gradient');
  assert.equal(done.lastLoss, 4.25);
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.innerSteps, s.lastLoss]), [
    [1, null],
    [1, 4.25],
  ]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/backward`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/backward`]: 1, [`${s1.name}/forward`]: 1 });
  assert.equal(h.state.microbatches.count(run.id, 'issued'), 1, 'the other one is still in flight');
  assert.deepEqual(s0.request().held, [{ microbatch: tasks[1].id, attempt: 1 }], 's0 still holds the other one');
});

test('the claims of a 3-stage pipeline chain through the middle stage: its forward names what it received and sent, its backward the gradient it received', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 3);
  const run = h.createRun({ steps: 10, stages: 3 });
  assert.equal(h.run(run.id).stageCount, 3);
  const path = [0, 1, 2].map((s) => h.replicas(run.id, s)[0]);
  beatAll(...path);
  const [x, y] = path[0].take(2);
  completeAlong(x, path, 4.5);
  assert.deepEqual(pick(h, x), { status: 'done', minerId: path[0].id, path: path.map((m) => m.id), progress: 0b111111, attempts: 1 });
  assert.equal(h.run(run.id).lastLoss, 4.5);
  const units = Object.fromEntries(path.flatMap((m) => [[`${m.name}/backward`, 1], [`${m.name}/forward`, 1]]));
  assert.deepEqual(h.work(run.id), units);

  // y: the middle stage's backward names a gradient other than the one the last stage sent: the chain breaks there
  const [m0, m1, m2] = path;
  m0.beat({ reports: [m0.forward(y, { to: m1 })] });
  m1.beat({ reports: [m1.forward(y, { to: m2 })] });
  m2.beat({ reports: [m2.last(y, { loss: 4 }), m2.backward(y)] });
  m1.beat({ reports: [{ ...m1.backward(y), inputSha: sha('another gradient') }] });
  m0.beat({ reports: [m0.backward(y)] });
  assert.equal(pick(h, y).status, 'issued');
  assert.equal(pick(h, y).progress, 0b100111, 'every forward and the last backward');
  assert.deepEqual(h.work(run.id), units, 'nothing more credited');
});

test('a stage-0 replica is given at most two slots of microbatches in flight, and never more than the run has steps', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 5 }, { slots: 2 });
  assert.equal(s0.take(10).length, 4, '2 × slots');
  assert.equal(s0.take(10).length, 0, 'all 4 still in flight (and held: none is sent again)');
  for (const mb of h.state.microbatches.byStatus(run.id, 'issued').map((m) => m.id)) completeMicrobatch(run.id, mb, s0, s1);
  assert.equal(h.run(run.id).microbatchesDone, 4);
  assert.deepEqual(s0.beat({ freeSlots: 10 }).microbatches.map((x) => x.shard), [4], 'one step left');
  assert.equal(h.run(run.id).microbatchesCreated, 5);
});

test('the microbatches in flight are capped by the narrowest stage (two slots per replica of it), shared by the stage-0 replicas', async (t) => {
  const h = await harness(t, { slots: 3 });
  h.joinMany('m', 3);
  const run = h.createRun({ steps: 100 });
  beatAll(...h.miners.values());
  const stage0 = h.replicas(run.id, 0);
  assert.deepEqual([stage0.length, h.replicas(run.id, 1).length], [2, 1], 'the heavier stage 0 [0,3) gets two replicas');
  const issued = stage0.map((m) => m.take(10).length);
  assert.deepEqual(issued, [3, 3], 'one stage-1 replica takes 2 × 3 in flight, shared by the stage-0 replicas');
});

test('500 identical claims of a hop are credited once, at completion; a claim of a microbatch issued to another miner earns nothing, is an offence and evicts its claimant', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 10 });
  beatAll(...h.miners.values());
  const [a0, b0] = h.replicas(run.id, 0);
  const [a1, b1] = h.replicas(run.id, 1);
  const [x, y] = a0.take(2);

  const forward = a0.forward(x, { to: a1 });
  a0.beat({ reports: Array(500).fill(forward) });
  assert.deepEqual(h.work(run.id), {}, 'not done: nothing credited');
  assert.equal(h.run(run.id).bytesSent, 0, 'its bytes count once the microbatch is done');
  assert.deepEqual(pick(h, x).path, [a0.id, a1.id]);
  assert.equal(h.run(run.id).lastLoss, null);

  // a1 and a0 claim the rest 500 times each: one completion, one unit per hop
  a0.beat({ reports: Array(500).fill(forward) });
  const lastHops = [a1.last(x, { loss: 4 }), a1.backward(x)];
  a1.beat({ reports: Array.from({ length: 500 }, () => lastHops).flat() });
  const back = a0.backward(x);
  a0.beat({ reports: Array(500).fill(back) });
  assert.equal(pick(h, x).status, 'done');
  const credited = { [`${a0.name}/backward`]: 1, [`${a0.name}/forward`]: 1, [`${a1.name}/backward`]: 1, [`${a1.name}/forward`]: 1 };
  assert.deepEqual(h.work(run.id), credited);
  assert.deepEqual([h.run(run.id).microbatchesDone, h.run(run.id).tokensDone, h.run(run.id).lastLoss], [1, 32, 4]);
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => s.innerSteps), [1, 1]);
  assert.equal(h.run(run.id).bytesSent, forward.bytesSent + lastHops[1].bytesSent, 'the activation and the gradient, once each');
  assert.ok(forward.bytesSent === FRAME_BYTES && lastHops[1].bytesSent > 0);

  // and once more after it is done: nothing
  const bytes = h.run(run.id).bytesSent;
  a0.beat({ reports: [...Array(500).fill(forward), ...Array(500).fill(back)] });
  a1.beat({ reports: Array.from({ length: 500 }, () => lastHops).flat() });
  assert.deepEqual(h.work(run.id), credited);
  assert.deepEqual([h.run(run.id).microbatchesDone, h.run(run.id).bytesSent, h.state.runs.stages(run.id)[0].innerSteps], [1, bytes, 1]);

  // b0 claims y's stage-0 forward, issued to a0, even with a genuine receipt of b1: an offence; b0 is evicted and may not join again for a while
  await expectNimbleError(() => b0.beat({ reports: [b0.forward(y, { to: b1, attempt: 1 })] }), 403, /^evicted until .* for an offence: 1 false report, the first: microbatch \d+ attempt 1 was issued to another miner$/);
  assert.ok(!pick(h, y).path.includes(b0.id), 'b0 did not join its path');
  assert.deepEqual(h.work(run.id), { ...credited, [`${b0.name}/invalid`]: 1 }, 'b1, whose receipt b0 showed, is charged nothing');
  assert.equal(h.state.miners.get(b0.id)!.alive, false);
  await expectNimbleError(() => b0.join(), 403, /^evicted until .* for an offence/);
  h.advance(BAN_MS + 1);
  b0.join();
  assert.equal(h.state.miners.get(b0.id)!.alive, true, 'after the ban it may join again');
});

test('a stage-0 backward without the forwards does not complete a microbatch; claims arriving out of order complete it when the last one is in', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { microbatchDeadlineMs: 2_000 });
  const [x, y] = s0.take(2);

  // x: s0 claims its backward and nothing else
  s0.beat({ reports: [report(run.id, x, 0, 'backward', { attempt: 1, bytesSent: 0, inputSha: sha('a gradient') })] });
  assert.deepEqual(pick(h, x), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, attempts: 1 });
  // y: the frames really went through, but s0's forward claim comes last
  const forward = s0.forward(y, { to: s1 });
  s1.beat({ reports: [s1.last(y, { loss: 3 }), s1.backward(y)] });
  s0.beat({ reports: [s0.backward(y)] });
  assert.deepEqual(pick(h, y), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, attempts: 1 }, 'nothing chains without the first hop');
  assert.deepEqual([h.run(run.id).microbatchesDone, h.run(run.id).lastLoss], [0, null]);
  assert.deepEqual(h.work(run.id), {});
  s0.beat({ reports: [forward] });
  assert.deepEqual([pick(h, y).status, pick(h, y).progress], ['done', 0b1111]);
  assert.deepEqual([h.run(run.id).microbatchesDone, h.run(run.id).lastLoss], [1, 3]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/backward`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/backward`]: 1, [`${s1.name}/forward`]: 1 });

  // x at its deadline: its first hop has no claim, so s0 is the one charged
  h.advance(2_001);
  h.tick();
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(h.work(run.id)[`${s0.name}/dropped`], 1);
  assert.equal(h.work(run.id)[`${s1.name}/dropped`], undefined);
});

// ---- 3. bad and stale reports ---------------------------------------------------------

test('claims of a stage the miner does not hold, of a run it does not hold, of a microbatch of another run or unknown, of an earlier attempt, and repeats earn nothing and cost nothing; a claim of an attempt never issued is an offence', async (t) => {
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
  const forward = s0.forward(mb, { to: s1 });
  s0.beat({ reports: [forward] });
  const before = { mb: pick(h, mb), run: h.run(second.id), firstRun: h.run(first.id), first: h.work(first.id) };
  assert.deepEqual(h.work(second.id), {});

  // stage 1's forward, claimed by the stage-0 replica
  s0.beat({ reports: [report(second.id, mb, 1, 'forward', { attempt: 1, loss: 3, inputSha: forward.outputSha })] });
  // the first run's microbatch, claimed under the first run (which it no longer holds) and under the second
  s1.beat({ reports: [report(first.id, oldMb, 1, 'backward', { attempt: 1 })] });
  s1.beat({ reports: [report(second.id, oldMb, 1, 'backward', { attempt: 1 })] });
  // a microbatch that does not exist
  s1.beat({ reports: [report(second.id, 999_999, 1, 'forward', { attempt: 1, loss: 3 })] });
  // the stage-0 forward again, twice
  s0.beat({ reports: [forward, forward] });

  assert.deepEqual(pick(h, mb), before.mb, 'the microbatch did not move');
  assert.deepEqual(h.run(second.id), before.run, 'no loss, no counters');
  assert.deepEqual(h.run(first.id), before.firstRun);
  assert.equal(pick(h, oldMb).status, 'done');
  assert.deepEqual(h.work(second.id), {}, 'not an invalid unit either');
  assert.deepEqual(h.work(first.id), before.first);

  // none of it got in the way of the honest claims
  s1.beat({ reports: [s1.last(mb, { loss: 2.5 }), s1.backward(mb)] });
  s0.beat({ reports: [s0.backward(mb)] });
  assert.equal(pick(h, mb).status, 'done');
  assert.equal(h.run(second.id).lastLoss, 2.5);
  const credited = { [`${s0.name}/backward`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/backward`]: 1, [`${s1.name}/forward`]: 1 };
  assert.deepEqual(h.work(second.id), credited);

  // a claim of an attempt never issued is an offence: s1 is evicted
  const [next] = s0.take(1);
  s0.beat({ reports: [s0.forward(next, { to: s1 })] });
  await expectNimbleError(() => s1.beat({ reports: [{ ...s1.last(next, { loss: 3 }), attempt: 2 }] }), 403, /for an offence: 1 false report, the first: microbatch \d+ attempt 2 was never issued/);
  assert.deepEqual(h.work(second.id), { ...credited, [`${s1.name}/invalid`]: 1, [`${s1.name}/dropped`]: 1 }, 'and the microbatch it held is its drop');
});

test('a miner naming an honest next-stage miner without its valid receipt commits an offence (an invalid unit per claim) and is evicted; the named miner is charged nothing, even at the deadline', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { microbatchDeadlineMs: 2_000 });
  const [x, y, z] = s0.take(3);
  const outputSha = s0.frameSha(x, 1, 'forward');
  const fields = { runId: run.id, microbatch: x, attempt: 1, stage: 1, phase: 'forward' as const, frameSha: outputSha };
  const claim = (receipt: string): WorkReport => report(run.id, x, 0, 'forward', { attempt: 1, next: s1.id, outputSha, receipt });
  // a real receipt of s1's, for another microbatch (y really went to s1)
  const forY = s0.forward(y, { to: s1 });
  const forged: [string, string][] = [
    ['signed with its own key', signReceipt(s0.key, h.domain, fields)],
    ["signed with an outsider's key", signReceipt(SessionKey.generate(), h.domain, fields)],
    ["s1's receipt of another microbatch", forY.receipt!],
    ["s1's receipt of another frame of x", signReceipt(s1.key, h.domain, { ...fields, frameSha: sha('another frame') })],
    ["s1's receipt of x's next attempt", signReceipt(s1.key, h.domain, { ...fields, attempt: 2 })],
    ["s1's receipt on another network", signReceipt(s1.key, 'nimble:another-network', fields)],
    ['not a signature at all', 'A'.repeat(86)],
  ];
  // z: the claim names s1 without a receipt at all: not proven, but not a forgery either
  s0.beat({ reports: [report(run.id, z, 0, 'forward', { attempt: 1, next: s1.id, outputSha: s0.frameSha(z, 1, 'forward') })] });
  assert.deepEqual(pick(h, z).path, [s0.id]);
  assert.deepEqual(h.work(run.id), {});

  // every forgery in one heartbeat: one offence of as many units; s0 is evicted, and x, y, z (which it held) go back in the queue at its charge
  const bytes = h.run(run.id).bytesSent;
  await expectNimbleError(() => s0.beat({ reports: forged.map(([, receipt]) => claim(receipt)) }), 403, new RegExp(`for an offence: ${forged.length} false reports, the first: microbatch ${x}: a receipt from ${s1.id} that does not verify`));
  assert.equal(h.state.miners.get(s0.id)!.alive, false);
  assert.deepEqual([pick(h, x).status, pick(h, y).status, pick(h, z).status], ['pending', 'pending', 'pending']);
  assert.deepEqual(pick(h, x).path, [s0.id], 'no forged receipt put s1 on the path');
  assert.equal(h.run(run.id).bytesSent, bytes, 'refused claims count no traffic');
  assert.deepEqual(h.work(run.id), { [`${s0.name}/invalid`]: forged.length, [`${s0.name}/dropped`]: 3 }, 's1, which held y, is charged nothing');
  h.advance(2_001);
  h.tick();
  assert.deepEqual(h.work(run.id), { [`${s0.name}/invalid`]: forged.length, [`${s0.name}/dropped`]: 3 }, 'nor at the deadline');
});

// ---- 4. deadlines, dropped microbatches, abandon ------------------------------------------

test('a microbatch past its deadline is pending again, the miner the evidence says held it is charged a dropped unit, and miners naming the dead attempt in `held` are told to abandon it', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { microbatchDeadlineMs: 2_000 });
  const first = s0.beat({ freeSlots: 2 }).microbatches;
  const [x, y] = first.map((m) => m.id);
  // x got to stage 1 (s1's receipt says so) and stalled there; y never left stage 0
  s0.beat({ reports: [s0.forward(x, { to: s1 })] });

  h.advance(2_000);
  h.tick();
  assert.equal(h.state.microbatches.count(run.id, 'issued'), 2, 'not past the deadline yet');
  h.advance(1);
  h.tick();
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(pick(h, y).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s0.name}/dropped`]: 1, [`${s1.name}/dropped`]: 1 }, 'y charged to s0, x to s1; nothing credited');

  // s1 still holds x's first attempt: told to let it go
  assert.deepEqual(s1.request().held, [{ microbatch: x, attempt: 1 }]);
  assert.deepEqual(s1.beat().abandon, [x]);
  // s0 is told to abandon both, and is given them again first (same ids and shards, attempt 2, a new ticket) before new shards
  const r0 = s0.beat({ freeSlots: 3 });
  assert.deepEqual(r0.abandon, [x, y]);
  assert.deepEqual(r0.microbatches.map((m) => [m.id, m.attempt]), [
    [x, 2],
    [y, 2],
    [r0.microbatches[2].id, 1],
  ]);
  assert.deepEqual(r0.microbatches.map((m) => m.shard), [0, 1, 2]);
  assert.notEqual(r0.microbatches[0].ticket, first[0].ticket, 'a ticket is for one attempt');
  assert.deepEqual(pick(h, x), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, attempts: 2 });
  // the list answers what each heartbeat names: a miner that let go hears nothing, one that still names the dead attempt hears it every time
  assert.deepEqual(s1.beat().abandon, []);
  assert.deepEqual(s0.beat().abandon, [], 's0 holds the live attempts');
  for (let i = 0; i < 2; i++) assert.deepEqual(s1.beat({ held: [{ microbatch: x, attempt: 1 }] }).abandon, [x]);

  // a late claim of the dead attempt earns nothing
  s1.beat({ reports: [report(run.id, x, 1, 'forward', { attempt: 1, loss: 2, bytesSent: 0, inputSha: s0.frameSha(x, 1, 'forward') })] });
  assert.equal(h.run(run.id).lastLoss, null);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/dropped`]: 1, [`${s1.name}/dropped`]: 1 });
  // attempt 2 goes through; once done, naming it (or a microbatch never issued) is answered with abandon too
  completeMicrobatch(run.id, x, s0, s1, 3);
  assert.equal(pick(h, x).status, 'done');
  assert.equal(h.run(run.id).lastLoss, 3);
  const z = r0.microbatches[2].id;
  assert.deepEqual(s0.beat({ held: [{ microbatch: x, attempt: 2 }, { microbatch: y, attempt: 2 }, { microbatch: 999_999, attempt: 1 }, { microbatch: z, attempt: 1 }] }).abandon, [x, 999_999]);
  assert.deepEqual(s0.beat({ held: [{ microbatch: y, attempt: 3 }] }).abandon, [y], 'an attempt not issued');
});

test('at the deadline the miner charged is the first hop, in pipeline order, without a valid claim', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { microbatchDeadlineMs: 2_000, minerTimeoutMs: 60_000 });
  const forward = (mb: number): void => void s0.beat({ reports: [s0.forward(mb, { to: s1 })] });
  const cases: [string, FakeMiner, (mb: number) => void][] = [
    ['nothing claimed: forward 0', s0, () => {}],
    ['the activation went to s1 (its receipt), which claimed nothing: forward 1', s1, forward],
    [
      's1 claims a forward of a frame other than the one s0 sent: forward 1',
      s1,
      (mb) => {
        forward(mb);
        s1.beat({ reports: [{ ...s1.last(mb, { loss: 3 }), inputSha: sha('another frame') }, s1.backward(mb)] });
      },
    ],
    [
      's1 claimed its forward, not its backward: backward 1',
      s1,
      (mb) => {
        forward(mb);
        s1.beat({ reports: [s1.last(mb, { loss: 3 })] });
      },
    ],
    [
      'the gradient went to s0 (its receipt), which claimed nothing: backward 0',
      s0,
      (mb) => {
        forward(mb);
        s1.beat({ reports: [s1.last(mb, { loss: 3 }), s1.backward(mb)] });
      },
    ],
    [
      "s0 claims a backward of a gradient other than the one s1 sent: backward 0",
      s0,
      (mb) => {
        forward(mb);
        s1.beat({ reports: [s1.last(mb, { loss: 3 }), s1.backward(mb)] });
        s0.beat({ reports: [{ ...s0.backward(mb), inputSha: sha('another gradient') }] });
      },
    ],
  ];
  for (const [what, culprit, stall] of cases) {
    const [mb] = s0.take(1);
    stall(mb);
    const before = h.work(run.id);
    h.advance(2_001);
    h.tick();
    assert.equal(pick(h, mb).status, 'pending', what);
    assert.deepEqual(workDelta(before, h.work(run.id)), { [`${culprit.name}/dropped`]: 1 }, what);
  }
  assert.deepEqual(h.work(run.id), { [`${s0.name}/dropped`]: 3, [`${s1.name}/dropped`]: 3 }, 'nothing credited');
});

test('a miner on the path that reports a microbatch dropped is charged and the microbatch requeued; the same report from a miner not on the path, or of an earlier attempt, changes nothing', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 });
  const [x] = s0.take(1);
  // before anyone handed x to s1, its word that it dropped x is not evidence of anything
  s1.beat({ reports: [report(run.id, x, 1, 'dropped', { attempt: 1, reason: 'queue full', bytesSent: 0 })] });
  assert.deepEqual(pick(h, x), { status: 'issued', minerId: s0.id, path: [s0.id], progress: 0, attempts: 1 });
  assert.deepEqual(h.work(run.id), {});

  s0.beat({ reports: [s0.forward(x, { to: s1 })] });
  // s1 is on the path now; it lets x go and says so
  const reply = s1.beat({ reports: [s1.dropped(x, 'queue full')] });
  assert.deepEqual(reply.abandon, [], 'it let go: nothing to tell it');
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 }, "s0's forward is not credited: x was not done");
  assert.deepEqual(s0.beat().abandon, [x]);
  // the same report again, from a miner that still names the dropped attempt in `held`: told to let go, not charged again
  assert.deepEqual(s1.beat({ reports: [report(run.id, x, 1, 'dropped', { attempt: 1, bytesSent: 0 })], held: [{ microbatch: x, attempt: 1 }] }).abandon, [x]);
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 }, 'charged once');
  // a late claim of the dropped attempt earns nothing and moves nothing
  s1.beat({ reports: [report(run.id, x, 1, 'forward', { attempt: 1, loss: 2, bytesSent: 0, inputSha: s0.frameSha(x, 1, 'forward') })] });
  assert.equal(pick(h, x).status, 'pending');
  assert.equal(h.run(run.id).lastLoss, null);

  // re-issued as attempt 2: a drop of attempt 1 does not touch it; s0's drop of attempt 2 (it is on the path) does
  assert.deepEqual(s0.take(1), [x]);
  assert.equal(pick(h, x).attempts, 2);
  s1.beat({ reports: [report(run.id, x, 1, 'dropped', { attempt: 1, bytesSent: 0 })] });
  s0.beat({ reports: [report(run.id, x, 0, 'dropped', { attempt: 1, bytesSent: 0 })] });
  assert.equal(pick(h, x).status, 'issued');
  s0.beat({ reports: [s0.dropped(x, 'shutting down')] });
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s0.name}/dropped`]: 1, [`${s1.name}/dropped`]: 1 });
});

// ---- 5. lost replies and spot checks ---------------------------------------------------

test('a heartbeat sent again after its reply was lost: no double credit, the microbatches the lost reply carried come back with the same attempt and ticket, the open checks are named again, nobody is charged', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { slots: 1, spotChecks: { rate: 1 }, minerTimeoutMs: 60_000 });
  const [x] = s0.take(1);
  assert.deepEqual(s0.beat({ reports: [s0.forward(x, { to: s1 })] }).checks, [x]);

  // s1's claims reach the orchestrator, its reply does not; it sends the same heartbeat again
  const req1 = s1.request({ reports: [s1.last(x, { loss: 3 }), s1.backward(x)] });
  const lost1 = h.coordinator.heartbeat(s1.id, req1);
  assert.deepEqual(lost1.checks, [x]);
  const mid = { run: h.run(run.id), mb: pick(h, x) };
  const again1 = s1.send(req1);
  assert.deepEqual(again1.checks, lost1.checks);
  assert.deepEqual([h.run(run.id), pick(h, x)], [mid.run, mid.mb]);
  assert.deepEqual(h.work(run.id), {}, 'no invalid unit for a receipt already taken');

  // s0's claim completes x and it asks for 2 more; the reply is lost, and it sends the same heartbeat again
  const req0 = s0.request({ freeSlots: 2, reports: [s0.backward(x)] });
  const lost0 = h.coordinator.heartbeat(s0.id, req0);
  assert.equal(pick(h, x).status, 'done');
  assert.equal(lost0.microbatches.length, 2);
  assert.deepEqual(lost0.checks, [x]);
  const credited = { work: h.work(run.id), run: h.run(run.id), stages: h.state.runs.stages(run.id) };
  assert.deepEqual(credited.work, { [`${s0.name}/backward`]: 1, [`${s0.name}/forward`]: 1, [`${s1.name}/backward`]: 1, [`${s1.name}/forward`]: 1 });
  h.advance(500);
  const again0 = s0.send(req0);
  assert.deepEqual(h.work(run.id), credited.work, 'credited once');
  assert.deepEqual([h.run(run.id), h.state.runs.stages(run.id)], [credited.run, credited.stages]);
  assert.deepEqual(again0.microbatches, lost0.microbatches, 'the same microbatches, attempts, shards, steps and tickets');
  assert.deepEqual(again0.checks, lost0.checks);
  assert.deepEqual(again0.abandon, []);
  const [y, z] = again0.microbatches.map((m: MicrobatchTask) => m.id);

  // held now, they are not sent a third time; one started (its forward claimed) is not sent again even when not named
  assert.deepEqual(s0.beat({ freeSlots: 2 }).microbatches, []);
  assert.deepEqual(s0.beat({ reports: [s0.forward(y, { to: s1 })], held: [] }).microbatches.map((m) => m.id), [z]);
  s1.beat({ reports: [s1.last(y, { loss: 2.5 }), s1.backward(y)] });
  s0.beat({ reports: [s0.backward(y)] });
  completeMicrobatch(run.id, z, s0, s1, 2);
  h.advance(COORDINATOR_DEFAULTS.microbatchDeadlineMs + 1);
  h.tick();
  assert.deepEqual([h.run(run.id).microbatchesDone, h.state.microbatches.count(run.id, 'issued')], [3, 0]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/backward`]: 3, [`${s0.name}/forward`]: 3, [`${s1.name}/backward`]: 3, [`${s1.name}/forward`]: 3 }, 'no dropped, no invalid');
});

test("with spot checks on, every reply names all of the miner's open checks, and a check fails unanswered a timeout after the first reply that named it", async (t) => {
  const timeoutMs = 10_000;
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { spotChecks: { rate: 1, timeoutMs }, minerTimeoutMs: 60_000, microbatchDeadlineMs: 60_000 });
  const [x, y] = s0.take(2);
  const t0 = h.now;
  assert.deepEqual(s0.beat({ reports: [s0.forward(x, { to: s1 })] }).checks, [x], 'named in the reply to the claim');
  h.advance(4_000);
  assert.deepEqual(s0.beat({ reports: [s0.forward(y, { to: s1 })] }).checks, [x, y], "every open check, not only this heartbeat's");
  h.advance(4_000);
  assert.deepEqual(s0.beat().checks, [x, y]);
  assert.deepEqual(s1.beat().checks, [], "a miner hears of its own checks only");
  assert.deepEqual(
    h.state.spotChecks.openOf(s0.id).map((c) => [c.microbatch, c.attempt, c.stage, c.deliveredAt]),
    [
      [x, 1, 0, t0],
      [y, 1, 0, t0 + 4_000],
    ],
    'each timeout counts from the first reply that named it',
  );

  h.now = t0 + timeoutMs;
  h.tick();
  assert.equal(h.state.spotChecks.openOf(s0.id).length, 2, 'not past the timeout yet');
  h.now = t0 + timeoutMs + 1_000;
  h.tick();
  assert.deepEqual(h.state.spotChecks.openOf(s0.id).map((c) => c.microbatch), [y], "x failed although named again since; y's time is not up");
  const failed = h.state.spotChecks.list().filter((c) => c.status === 'failed');
  assert.deepEqual(failed.map((c) => [c.microbatch, c.minerId, c.detail]), [[x, s0.id, 'not answered in time']]);
  assert.deepEqual(s0.beat().checks, [y]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/failed_check`]: 1 });
  h.now = t0 + 4_000 + timeoutMs + 1_000;
  h.tick();
  assert.deepEqual(s0.beat().checks, []);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/failed_check`]: 2 });
});

// ---- 6. vanished miners ---------------------------------------------------------------

test('a miner silent past minerTimeoutMs is marked gone on tick, its microbatches are requeued and charged as dropped, and the run is re-planned on the others', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 4_000 });
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 20 });
  beatAll(...h.miners.values());
  const [a0, b0] = h.replicas(run.id, 0);
  const [a1, b1] = h.replicas(run.id, 1);
  const [x] = a0.take(1);
  const [y] = b0.take(1);
  a0.beat({ reports: [a0.forward(x, { to: a1 })] });
  b0.beat({ reports: [b0.forward(y, { to: b1 })] });

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
  assert.deepEqual(h.work(run.id), { [`${a1.name}/dropped`]: 1 });
  assert.deepEqual(a0.beat().abandon, [x]);

  // re-planned: the same stages on the 3 miners left, stage 1 sends to b1 only
  const plan = h.run(run.id).plan!;
  assert.deepEqual(plan.stages.map((s) => s.miners.map((id) => h.nameOf(id)).sort()), [[a0.name, b0.name].sort(), [b1.name]]);
  assert.deepEqual(h.replicasByStage(run.id), [[a0.name, b0.name].sort(), [b1.name]]);
  assert.equal(h.run(run.id).message, null);
  assert.deepEqual(b0.beat().nextStage.map((p) => p.id), [b1.id]);
  // x goes out again
  assert.deepEqual(a0.take(1), [x]);
  assert.equal(pick(h, x).attempts, 2);
});

test('a run whose last replica of a stage vanished stalls with a message, and resumes when a miner joins', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 20 }, { minerTimeoutMs: 4_000 });
  const [x] = s0.take(1);
  s0.beat({ reports: [s0.forward(x, { to: s1 })] });

  h.advance(4_001);
  s0.beat();
  h.tick();
  const stalled = h.run(run.id);
  assert.equal(stalled.status, 'executing');
  assert.match(stalled.message ?? '', /^stalled: stage 1 \[3,4\) lost its last replica/);
  assert.deepEqual(stalled.plan!.stages.map((s) => s.miners.length), [1, 0]);
  assert.deepEqual(h.replicasByStage(run.id), [[s0.name]]);
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 });
  const idle = s0.beat({ freeSlots: 3 });
  assert.deepEqual(idle.abandon, [x]);
  assert.deepEqual(idle.microbatches, [], 'nothing is issued while a stage has no replica');
  assert.deepEqual(idle.nextStage, []);

  const fresh = h.join('fresh');
  assert.equal(h.run(run.id).message, null);
  assert.deepEqual(h.replicasByStage(run.id), [[s0.name], [fresh.name]]);
  beatAll(fresh); // it takes the stage and says so
  const resumed = s0.beat({ freeSlots: 1 });
  assert.deepEqual(resumed.microbatches.map((m) => [m.id, m.attempt]), [[x, 2]]);
  assert.deepEqual(resumed.nextStage.map((p) => [p.id, p.sessionKey]), [[fresh.id, fresh.key.publicKey]]);
  completeMicrobatch(run.id, x, s0, fresh, 3);
  assert.equal(pick(h, x).status, 'done');
});

// ---- 7. eviction ----------------------------------------------------------------------

test('an evicted miner gets 403 with the reason on every heartbeat until it joins again; its work is re-issued', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 20 });
  const [x] = s0.take(1);
  s0.beat({ reports: [s0.forward(x, { to: s1 })] });
  const seen = h.state.miners.get(s1.id)!.lastSeen;

  await expectNimbleError(() => h.coordinator.heartbeat('0x' + '1'.repeat(40), { freeSlots: 0, queue: 0, reports: [] }), 404, /has not joined/);

  const reason = 'stake too low: 0 NIM staked, 100 NIM required';
  h.coordinator.evict(s1.id, reason);
  assert.equal(h.state.miners.get(s1.id)!.alive, false);
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 });
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
  assert.deepEqual(back.abandon, [x], 'the attempt it held is dead');
  assert.equal(h.state.miners.get(s1.id)!.alive, true);
  assert.equal(h.run(run.id).message, null);
});

test('when the plan moves a miner to another stage, the microbatches it held are issued again and it is charged nothing; the evicted miner that caused the move is', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 120_000 });
  h.joinMany('m', 3);
  const run = h.createRun({ steps: 20 });
  beatAll(...h.miners.values());
  const stage0 = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  assert.equal(stage0.length, 2);
  const [a, b] = stage0;
  const [x] = a.take(1);
  const [y] = b.take(1);
  a.beat({ reports: [a.forward(x, { to: s1 })] });
  // s1 goes: stage 1 has nobody, so the plan moves a stage-0 replica there
  h.coordinator.evict(s1.id, 'stake too low');
  const moved = [a, b].find((m) => h.state.runs.assignmentOf(m.id)?.stage === 1)!;
  assert.ok(moved, 'a stage-0 replica moved to stage 1');
  const owned = moved === a ? x : y;
  assert.equal(pick(h, x).status, 'pending', 'x (on the evicted miner\'s path) is issued again');
  assert.equal(pick(h, owned).status, 'pending', "the moved miner's microbatch is issued again");
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 }, 'only the evicted miner is charged (for x, which it held)');
  assert.ok(moved.beat().abandon.includes(owned), 'the moved miner is told to let it go');
  h.advance(60_000);
  h.tick();
  assert.equal(h.work(run.id)[`${moved.name}/dropped`], undefined, 'no deadline charges the moved miner later');
});

// The race of CI run 8 of stop 29 (test/network/byzantine.test.ts): the plan moves a replica off its stage
// after a sender last heard its routing and before the sender's claim names it as the next hop.
test('a microbatch handed to a replica the plan has just moved off that stage is issued again at once; nobody is charged, even at the deadline', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 120_000, microbatchDeadlineMs: 2_000 });
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 20 });
  beatAll(...h.miners.values());
  assert.deepEqual(h.replicasByStage(run.id).map((s) => s.length), [2, 2]);
  const [a, b] = h.replicas(run.id, 0);
  const [x] = b.take(1);
  // a goes: stage 0 keeps b only, so the plan moves a stage-1 replica to stage 0
  h.coordinator.evict(a.id, 'stake too low');
  const moved = h.replicas(run.id, 0).find((m) => m !== b)!;
  assert.ok(moved, 'a stage-1 replica moved to stage 0');
  assert.equal(moved.assignment?.stage, 1, 'it has not heard yet');
  // b's routing still lists it at stage 1; it takes x's activation (an honest miner does, until its next heartbeat)
  b.beat({ reports: [b.forward(x, { to: moved })] });
  assert.equal(pick(h, x).status, 'pending', 'x is issued again at once');
  assert.deepEqual(h.work(run.id), {}, 'no invalid unit for its honest receipt, no charge');
  assert.equal(moved.beat().assignment?.stage, 0, 'it learns its move and lets x go');
  assert.equal(moved.held.has(x), false);
  h.advance(2_001);
  h.tick();
  assert.deepEqual(h.work(run.id), {}, 'nobody is charged for x, even after its deadline');
  // x carries on along the new plan
  const [again] = b.take(1);
  assert.equal(again, x);
  const [s1] = h.replicas(run.id, 1);
  completeAlong(x, [b, s1]);
  assert.equal(pick(h, x).status, 'done');
});

// ---- 8. a whole merge round -----------------------------------------------------------

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
  assert.equal(a0.reply!.merge, null);

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
    { round: 1, partitions: undefined, upload: true, merge: [], apply: null, saveState: false, aggregator: 'mean', trim: 0, outerLr: 0.7, outerMomentum: 0.9 },
  );
  assert.deepEqual(t0.partitions, partitionVector(n0, 4));
  assert.equal(t0.partitions[3].end, n0);
  assert.equal(taskOf(b0).upload, true);
  assert.deepEqual(a0.take(3), [], 'no microbatches during a round');

  // bad uploads: a non-replica (403), a partition out of range (400), the wrong partition's frame (400), a merged partition now (409)
  const frames = pseudoGradientFrames(h, a0, t0, 1);
  await expectNimbleError(() => h.coordinator.mergeUploads.putPseudoGradient(a1.id, key0, 0, 2, frames[0]), 403, /is not a replica/);
  await expectNimbleError(() => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key0, 4, 2, frames[0]), 400, /partition 4 outside 0\.\.3/);
  await expectNimbleError(() => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key0, 1, 2, frames[0]), 400);
  await expectNimbleError(() => h.coordinator.mergeUploads.putMerged(a0.id, key0, 0, frames[0]), 409, /is uploading, not merging/);
  await expectNimbleError(() => h.coordinator.mergeUploads.putPseudoGradient(a0.id, { ...key0, round: 2 }, 0, 2, frames[0]), 409, /not open/);
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
        uploads.filter((u) => u.partition === job.partition).map((u) => ({ minerId: u.minerId, blob: u.blob, samples: u.minerId === a0.id ? 3 : 1 })),
        'weighted by the inner steps each trained: a0 3, b0 1',
      );
    }
  }
  await expectNimbleError(() => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key0, 0, 2, frames[0]), 409, /is merging, not uploading/);
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  assert.deepEqual(taskOf(a0).merge, [], 'nothing left to merge');
  assert.equal(h.work(run.id)[`${a0.name}/merge`], undefined, 'merges are credited when the round settles on them');

  // applying: both mergers delivered the same frames; everyone applies them; the orchestrator writes the state
  h.tick();
  assert.equal(h.state.mergeRounds.get(key0)!.status, 'applying');
  const results = h.state.mergeRounds.results(key0);
  assert.equal(results.length, 8, "both mergers' results, no recomputation");
  const chosen = [0, 1, 2, 3].map((p) => results.find((r) => r.partition === p)!.blob);
  for (const r of results) assert.equal(r.blob, chosen[r.partition], 'the two mergers agree bit for bit');
  assert.deepEqual([h.work(run.id)[`${a0.name}/merge`], h.work(run.id)[`${b0.name}/merge`], h.work(run.id)[`${a0.name}/invalid`]], [4, 4, undefined]);
  const tasks = [a0, b0].map(taskOf);
  for (const task of tasks) assert.deepEqual(task.apply, chosen.map((blob, partition) => ({ partition, blob })));
  assert.deepEqual(tasks.map((x) => x.saveState), [false, false], 'no replica uploads a merged round\'s state');
  // a merged partition decodes to the mean of the two replicas' slices weighted by their inner steps (3 : 1), up to int8 rounding
  const merged = decodePartitionFrame(await h.blobs.get(chosen[0]), t0.partitions[0], { codecs: ['int8-block'] });
  const ins = await Promise.all(uploads.filter((u) => u.partition === 0).map(async (u) => ({ w: u.samples, x: decodePartitionFrame(await h.blobs.get(u.blob), t0.partitions[0]) })));
  const scale = Math.max(...merged.map(Math.abs));
  assert.ok(scale > 0);
  for (let i = 0; i < merged.length; i++) assert.ok(Math.abs(merged[i] - (ins[0].x[i] * ins[0].w + ins[1].x[i] * ins[1].w) / 4) <= scale / 127, `merged value ${i}`);

  // the state is the outer step every replica takes, written as the checkpoint an honest replica saves, byte for byte
  await h.coordinator.merges.settled();
  const blob0 = h.state.mergeRounds.get(key0)!.stateBlob!;
  assert.ok(blob0, 'written while the replicas apply');
  assert.deepEqual(await h.blobs.get(blob0), await stageState(h, run.id, 0, 1));
  await expectNimbleError(async () => h.coordinator.mergeUploads.putState(a0.id, key0, await stageState(h, run.id, 0, 1)), 409, /merged: the orchestrator writes its state/);
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
    round: 1, partitions: [], upload: false, merge: [], apply: [], saveState: true, aggregator: 'mean', trim: 0, outerLr: 0.7, outerMomentum: 0.9,
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

// ---- 9. a replica vanishing mid-round -------------------------------------------------

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
  // one merger per partition: the orchestrator recomputes each before the round applies it
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'merging', 'a single merger is not taken at its word');
  await tickSettled(h);
  assert.equal(h.state.mergeRounds.get(key)!.status, 'applying');
  const results = h.state.mergeRounds.results(key);
  assert.deepEqual(results.map((r) => h.nameOf(r.minerId)).sort(), [...Array(4).fill('orchestrator'), ...Array(4).fill(stays.name)].sort());
  assert.deepEqual(mergeRound(h, run.id, 0, 1).plan.chosen, [0, 1, 2, 3].map((p) => results.find((r) => r.partition === p && r.minerId === stays.id)!.blob), "the recomputation is stays' merge");
  assert.equal(h.work(run.id)[`${stays.name}/merge`], 4);
  // the dropped replica is not asked for anything: it waits for the new state
  const idle = taskOf(vanishes);
  assert.deepEqual([idle.upload, idle.merge, idle.apply, idle.saveState], [false, [], null, false]);
  assert.equal(taskOf(stays).saveState, false);
  await h.coordinator.merges.settled();
  const state = mergeRound(h, run.id, 0, 1).stateBlob!;
  assert.ok(state, 'the orchestrator wrote the state');
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


test('a merger that dies after its co-merger delivered does not hold the round up to the merge timeout: the orchestrator recomputes the partitions it shared', async (t) => {
  const minerTimeoutMs = 5_000;
  const h = await harness(t, { minerTimeoutMs });
  const run = runAtFirstMerge(h);
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  const key = { runId: run.id, stage: 0, round: 1 };
  const merging = h.state.mergeRounds.get(key)!;
  assert.equal(merging.status, 'merging');
  const [stays, dies] = h.replicas(run.id, 0);
  assert.ok(merging.plan.mergers.every((ms) => ms.includes(stays.id) && ms.includes(dies.id)), 'two replicas: both merge every partition');
  await mergeAndUpload(h, stays, taskOf(stays));
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'merging', 'one merger is not taken at its word');

  // dies goes silent; the others keep beating
  h.advance(minerTimeoutMs + 1);
  for (const m of [stays, ...h.replicas(run.id, 1)]) m.beat();
  await tickSettled(h);
  const round = h.state.mergeRounds.get(key)!;
  assert.equal(round.status, 'applying', `settled ${h.now - merging.plan.phaseAt} ms into the phase, not at the merge timeout (${MERGE_TIMEOUT_MS} ms)`);
  const results = h.state.mergeRounds.results(key);
  assert.deepEqual(round.plan.chosen, merging.plan.mergers.map((_, p) => results.find((r) => r.partition === p && r.minerId === stays.id)!.blob), "the recomputation is stays' merge");
  assert.equal(results.filter((r) => h.nameOf(r.minerId) === 'orchestrator').length, merging.partitions);
  assert.equal(h.work(run.id)[`${stays.name}/merge`], merging.partitions);
});

// ---- 10. restart ----------------------------------------------------------------------

test('after a restart mid-run the runs, stages, assignments, the miners\' keys and an in-flight microbatch continue where they were', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { minerTimeoutMs: 4_000 });
  const [done, inFlight] = s0.take(2);
  completeMicrobatch(run.id, done, s0, s1, 4);
  s0.beat({ reports: [s0.forward(inFlight, { to: s1 })] });
  const before = { run: h.run(run.id), stages: h.state.runs.stages(run.id), mb: pick(h, inFlight), assignments: h.state.runs.assignments(run.id) };

  h.advance(3_000);
  await h.restart();
  assert.deepEqual(h.run(run.id), before.run);
  assert.deepEqual(h.state.runs.stages(run.id), before.stages);
  assert.deepEqual(h.state.runs.assignments(run.id), before.assignments);
  assert.deepEqual(pick(h, inFlight), before.mb);
  assert.deepEqual([h.coordinator.sessionKeyOf(s0.id), h.coordinator.sessionKeyOf(s1.id)], [s0.key.publicKey, s1.key.publicKey]);

  // the miners alive before get a full timeout from the restart to re-attach
  h.advance(3_999);
  h.tick();
  assert.equal(h.state.miners.list(true).length, 2);
  // until its first heartbeat says otherwise, a miner alive before the restart is taken to hold its stage at the stage's round:
  // s0 hears of s1 as its next stage before s1 has beaten again (else s0 would drop the activations it holds for want of a peer)
  assert.deepEqual(s0.beat().nextStage.map((p) => p.id), [s1.id]);
  // s1's gradient hand-off is checked against s0's key as it joined before the restart: no invalid unit, and the microbatch completes
  s1.beat({ reports: [s1.last(inFlight, { loss: 3.5 }), s1.backward(inFlight)] });
  s0.beat({ reports: [s0.backward(inFlight)] });
  const after = h.run(run.id);
  assert.equal(pick(h, inFlight).status, 'done');
  assert.deepEqual([after.status, after.microbatchesDone, after.lastLoss, after.microbatchesCreated], ['executing', 2, 3.5, 2]);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/backward`]: 2, [`${s0.name}/forward`]: 2, [`${s1.name}/backward`]: 2, [`${s1.name}/forward`]: 2 });
  const [task] = s0.beat({ freeSlots: 1 }).microbatches;
  assert.ok(task, 'a new microbatch');
  assert.ok(verifyTicket(h.coordinator.identity.key.publicKey, h.domain, { runId: run.id, microbatch: task.id, attempt: task.attempt, shard: task.shard, step: task.step }, task.ticket), 'signed by the same network key');
  assert.equal(h.run(run.id).microbatchesCreated, 3, 'new shards continue after the ones created before the restart');
});

test('an orchestrator restart gives the open spot checks their whole timeout again: the downtime does not fail them', async (t) => {
  const timeoutMs = 10_000;
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { spotChecks: { rate: 1, timeoutMs }, minerTimeoutMs: 60_000, microbatchDeadlineMs: 120_000 });
  const [x] = s0.take(1);
  assert.deepEqual(s0.beat({ reports: [s0.forward(x, { to: s1 })] }).checks, [x]);
  h.advance(8_000);
  h.tick();
  // the orchestrator goes down for 30 s, well past the check's timeout, and starts again
  h.advance(30_000);
  await h.restart();
  const restartedAt = h.now;
  assert.deepEqual(h.state.spotChecks.openOf(s0.id).map((c) => [c.microbatch, c.deliveredAt]), [[x, restartedAt]]);
  h.tick();
  assert.equal(h.state.spotChecks.openOf(s0.id).length, 1, 'the downtime does not count');
  assert.deepEqual(s0.beat().checks, [x], 'named again after the restart');
  h.advance(timeoutMs);
  h.tick();
  assert.equal(h.state.spotChecks.openOf(s0.id).length, 1, 'a whole timeout from the restart: not past it yet');
  assert.equal(h.work(run.id)[`${s0.name}/failed_check`], undefined);
  h.advance(1_000);
  h.tick();
  assert.deepEqual(h.state.spotChecks.openOf(s0.id), []);
  assert.deepEqual(h.work(run.id), { [`${s0.name}/failed_check`]: 1 });
});

test('an orchestrator restart gives issued microbatches and an open merge phase their whole timeout again: nobody is charged for the downtime', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 60_000, microbatchDeadlineMs: 15_000 });
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 100 });
  beatAll(...h.miners.values());
  const [a0] = h.replicas(run.id, 0);
  const [x] = a0.take(1);
  h.advance(10_000);
  // down for 30 s, past x's deadline
  h.advance(30_000);
  await h.restart();
  h.advance(14_000);
  h.tick();
  assert.equal(pick(h, x).status, 'issued', 'a whole deadline from the restart: not past it yet');
  h.advance(1_001);
  h.tick();
  assert.equal(pick(h, x).status, 'pending');
  assert.deepEqual(h.work(run.id), { [`${a0.name}/dropped`]: 1 }, 'charged only once its deadline passed with the orchestrator up');

  // a merge round in 'uploading': the orchestrator is down past the upload timeout; after the restart the replicas get their whole timeout
  const h2 = await harness(t, { minerTimeoutMs: 10 * UPLOAD_TIMEOUT_MS });
  const run2 = runAtFirstMerge(h2);
  assert.equal(mergeRound(h2, run2.id, 0, 1).status, 'uploading');
  h2.advance(UPLOAD_TIMEOUT_MS - 1_000);
  h2.tick();
  h2.advance(2 * UPLOAD_TIMEOUT_MS); // down
  await h2.restart();
  h2.advance(UPLOAD_TIMEOUT_MS - 1_000);
  h2.tick();
  const round = mergeRound(h2, run2.id, 0, 1);
  assert.deepEqual([round.status, round.replicas.length], ['uploading', 2], 'nobody left the round for the downtime');
  assert.equal(Object.keys(h2.work(run2.id)).filter((k) => k.endsWith('/dropped')).length, 0);
  h2.advance(2_000);
  h2.tick();
  assert.notEqual(mergeRound(h2, run2.id, 0, 1).status, 'uploading', 'a whole timeout after the restart, the replicas that did not upload are out');
  assert.ok(Object.keys(h2.work(run2.id)).some((k) => k.endsWith('/dropped')));
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

test('a round does not wait forever in applying: a replica that never applies is dropped after the apply timeout and the round closes with the state the orchestrator wrote', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 10 * APPLY_TIMEOUT_MS });
  const run = runAtFirstMerge(h);
  for (const stage of [0, 1]) await uploadAll(h, run, stage);
  h.tick();
  for (const stage of [0, 1]) await mergeAll(h, run, stage);
  h.tick();
  await h.coordinator.merges.settled();
  // one replica of each stage applies; the other stays alive and never does
  const keys = [0, 1].map((stage) => ({ runId: run.id, stage, round: 1 }));
  const [[a0, silent0], [a1, silent1]] = [0, 1].map((stage) => h.replicas(run.id, stage));
  for (const m of [a0, a1]) {
    m.applied = 1;
    m.beat();
  }
  silent0.beat();
  silent1.beat();
  h.tick();
  for (const k of keys) assert.ok(h.state.mergeRounds.get(k)!.stateBlob, 'the state is written; the round waits for its replicas');
  h.advance(APPLY_TIMEOUT_MS);
  h.tick();
  assert.deepEqual(keys.map((k) => h.state.mergeRounds.get(k)!.status), ['applying', 'applying'], 'still waiting at the timeout');
  h.advance(1);
  h.tick();
  assert.deepEqual(keys.map((k) => h.state.mergeRounds.get(k)!.status), ['done', 'done']);
  assert.deepEqual([silent0, silent1, a0, a1].map((m) => h.work(run.id)[`${m.name}/dropped`]), [1, 1, undefined, undefined]);
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round, s.stateBlob]), keys.map((k) => ['training', 1, h.state.mergeRounds.get(k)!.stateBlob]));
});

/** How long a single replica's round waits for its state: the apply timeout, and twice the state's transfer at the replica's uplink, at most the server's request timeout. */
function stateTimeoutMs(h: Harness, runId: string, stage: number, mbps: number): number {
  const s = h.state.runs.stage(runId, stage)!;
  const params = rangeParams(h.state.runs.get(runId)!.model, { from: s.fromPart, to: s.toPart });
  return APPLY_TIMEOUT_MS + Math.ceil(Math.min(DEFAULT_HTTP_TIMEOUTS.requestMs, (2 * stateBytesBound(params) * 8) / (mbps * 1e3)));
}

/** Two stages of one replica each, at their first round: stage 1 applied and saved, s0 (whose uplink is `mbps`) applied and never saves. */
async function s0NeverSaves(t: Parameters<typeof twoStages>[0], mbps: number): Promise<Awaited<ReturnType<typeof twoStages>> & { key: RoundKey }> {
  const two = await twoStages(t, { steps: 4, mergeEvery: 1 }, { minerTimeoutMs: 10 * APPLY_TIMEOUT_MS });
  const { h, run, s0 } = two;
  s0.bandwidthMbps = mbps;
  s0.join();
  trainMicrobatches(h, run, 1);
  h.tick();
  assert.deepEqual([mergeRound(h, run.id, 0, 1).partitions, taskOf(s0).saveState], [0, true]);
  s0.applied = 1;
  s0.beat();
  await applyAll(h, run, 1, 1);
  return { ...two, key: { runId: run.id, stage: 0, round: 1 } };
}

test('a stage of one replica that applies the round and never saves its state is dropped after the apply timeout and its state\'s transfer; the stage keeps the state it had', async (t) => {
  const { h, run, s0, s1, key } = await s0NeverSaves(t, 100);
  const timeout = stateTimeoutMs(h, run.id, 0, 100);
  assert.ok(timeout > APPLY_TIMEOUT_MS && timeout < APPLY_TIMEOUT_MS + 5_000, `${timeout} ms: a small state at 100 Mbit/s adds little`);
  h.advance(timeout);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'applying', 'still waiting at the timeout');
  h.advance(1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'done');
  assert.deepEqual([h.work(run.id)[`${s0.name}/dropped`], h.work(run.id)[`${s1.name}/dropped`]], [1, undefined]);
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.round, s.stateBlob === null]), [[1, true], [1, false]], 'stage 0 keeps its initial state');
});

test('a stage of one replica on a slow uplink gets time to upload its state, at most the server\'s request timeout more', async (t) => {
  // s0 measured 0.05 Mbit/s up: its state would take minutes, the round waits at most the request timeout more
  const { h, run, key } = await s0NeverSaves(t, 0.05);
  assert.equal(stateTimeoutMs(h, run.id, 0, 0.05), APPLY_TIMEOUT_MS + DEFAULT_HTTP_TIMEOUTS.requestMs);
  h.advance(APPLY_TIMEOUT_MS + DEFAULT_HTTP_TIMEOUTS.requestMs);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'applying');
  h.advance(1);
  h.tick();
  assert.equal(h.state.mergeRounds.get(key)!.status, 'done');
});

test('a stage state upload is held to its own stage\'s size: declared larger, or not declared, it is refused before its body is read; within it, it is taken', async (t) => {
  const { h, run, s0 } = await twoStages(t, { steps: 4, mergeEvery: 1 }, { minerTimeoutMs: 10 * APPLY_TIMEOUT_MS });
  trainMicrobatches(h, run, 1);
  h.tick();
  assert.deepEqual([mergeRound(h, run.id, 0, 1).partitions, taskOf(s0).saveState], [0, true]);
  const app = buildApi(h.coordinator);
  t.after(() => app.close());
  const signer = new RequestSigner({ session: s0.key, address: s0.id as `0x${string}` }, { domain: h.coordinator.identity.domain });
  const url = `/runs/${run.id}/stages/0/rounds/1/state`;
  const s = h.state.runs.stage(run.id, 0)!;
  const limit = stateBytesBound(rangeParams(run.model, { from: s.fromPart, to: s.toPart }));
  const post = async (headers: Record<string, string>, body: Buffer): Promise<{ status: number; error: string }> => {
    const res = await app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream', ...(await signer.sign('POST', url, body)), ...headers }, payload: body });
    return { status: res.statusCode, error: String((JSON.parse(res.body) as { error?: string }).error) };
  };
  // announced one byte over the stage's size (16 bytes sent): refused from its headers
  const over = await post({ 'content-length': String(limit + 1) }, Buffer.alloc(16));
  assert.equal(over.status, 413, over.error);
  assert.match(over.error, new RegExp(`at most ${limit}`));
  // no length announced (chunked, over a real socket): refused too
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const body = Buffer.alloc(16);
  const chunked = await new Promise<{ status: number; error: string }>((resolve, reject) => {
    void signer.sign('POST', url, body).then((signed) => {
      const req = httpRequest({ host: '127.0.0.1', port, path: url, method: 'POST', headers: { 'content-type': 'application/octet-stream', ...signed } }, (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, error: String((JSON.parse(text) as { error?: string }).error) }));
      });
      req.on('error', reject);
      req.write(body); // no Content-Length: node sends it chunked
      req.end();
    }, reject);
  });
  assert.equal(chunked.status, 411, chunked.error);
  // the real state, which the stage's single replica saves: taken
  s0.applied = 1;
  s0.beat();
  const state = Buffer.from(h.coordinator.stageStates.encode(run, 0, 1, (await h.coordinator.stageStates.at(run, 0, 0))!));
  assert.ok(state.length <= limit);
  const taken = await post({}, state);
  assert.equal(taken.status, 200, taken.error);
  assert.ok(h.state.mergeRounds.get({ runId: run.id, stage: 0, round: 1 })!.stateBlob);
});

// ---- 11. what a merge round checks ----------------------------------------------------

test('a pseudo-gradient with a value further from zero than its inner AdamW steps can move that weight is refused with 400 as an offence, nothing of it is stored, and its sender leaves the round', async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const task = taskOf(a0);
  assert.deepEqual([a0.innerSteps, b0.innerSteps], [2, 2], 'each credited 2 backwards');
  // the reach of 2 AdamW steps (with the 1% the check allows for int8 rounding, and FEEDBACK_STEPS for the error feedback) for one weight of partition 1, from the initial weights
  const start = (await h.coordinator.stageStates.at(run, 0, 0))!;
  const i = task.partitions[1].start + 7;
  const limit = adamMoveBound(start.weights[i], 2 + FEEDBACK_STEPS, run.options.lr, i < start.decaySize ? ADAMW_DEFAULTS.weightDecay : 0) * 1.01;
  assert.ok(limit > 2 * run.options.lr, 'larger than what the honest fake moves a weight');
  const withValue = (m: FakeMiner, seed: number, value: number): Uint8Array => {
    const pg = fakePseudoGradient(h, m, seed, 2);
    pg[i] = value;
    return pseudoGradientFrames(h, m, task, seed, 2, pg)[1];
  };
  const blobsBefore = await blobIds(h);
  const bytesBefore = h.run(run.id).bytesSent;
  for (const value of [-1.05 * limit, 1.05 * limit, 1]) {
    await expectOffence(h, key, a0, () => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key, 1, 2, withValue(a0, 1, value)), new RegExp(`at parameter ${i} is more than 2 AdamW steps`));
  }
  assert.deepEqual(h.state.mergeRounds.uploads(key), [], 'no upload recorded');
  assert.deepEqual(await blobIds(h), blobsBefore, 'no blob stored');
  assert.equal(h.run(run.id).bytesSent, bytesBefore, 'no traffic counted');
  assert.equal(taskOf(a0).upload, true, 'a0 (put back in the round) is asked for its pseudo-gradient again');
  // just within the reach: taken
  await h.coordinator.mergeUploads.putPseudoGradient(b0.id, key, 1, 2, withValue(b0, 2, -0.95 * limit));
  assert.deepEqual(h.state.mergeRounds.uploads(key).map((u) => [h.nameOf(u.minerId), u.partition, u.samples]), [[b0.name, 1, 2]]);
  // and a0's honest one after its refused ones
  await uploadPseudoGradient(h, a0, task, 1);
  assert.equal(h.state.mergeRounds.uploads(key).length, 5);
});

test("an upload claiming no inner step is still taken when its values are the error feedback of a round of 1,000 credited steps before: an honest replica is never charged for its own residual", async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const task = taskOf(a0);
  const start = (await h.coordinator.stageStates.at(run, 0, 0))!;
  const pg = new Float32Array(fakePseudoGradient(h, a0, 1, 0).length);
  // the largest residual int8 rounding can leave after a round of 2 × 1,000 + 16 steps: 1/253 of its reach, at every weight
  for (let j = 0; j < pg.length; j++) pg[j] = ((j % 2 ? 1 : -1) * adamMoveBound(start.weights[j], 2016, run.options.lr, j < start.decaySize ? ADAMW_DEFAULTS.weightDecay : 0)) / 253;
  for (const [p, frame] of pseudoGradientFrames(h, a0, task, 1, 0, pg).entries()) await h.coordinator.mergeUploads.putPseudoGradient(a0.id, key, p, 0, frame);
  assert.deepEqual(h.state.mergeRounds.uploads(key).map((u) => u.samples), [0, 0, 0, 0]);
});

test('a replica whose upload proves an offence leaves the round at once: the round goes on with the others without waiting for the upload timeout, and the offender takes the new state', async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const task = taskOf(a0);
  const pg = fakePseudoGradient(h, a0, 1, 2);
  pg.fill(1);
  await assert.rejects(() => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key, 0, 2, pseudoGradientFrames(h, a0, task, 1, 2, pg)[0]), OffenceError);
  assert.deepEqual(mergeRound(h, run.id, 0, 1).replicas, [b0.id]);
  assert.equal(taskOf(a0).upload, false, 'a0 is asked for nothing more in this round');
  await expectNimbleError(() => uploadPseudoGradient(h, a0, task, 1), 403, /not a replica in round 1/);
  await uploadPseudoGradient(h, b0, taskOf(b0), 2);
  for (const stage of [1]) await uploadAll(h, run, stage);
  h.tick();
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'merging', 'no upload timeout waited for');
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  await tickSettled(h); // b0 merged alone: the orchestrator recomputes its partitions
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [['training', 1], ['training', 1]]);
  const assignment = a0.beat().assignment!;
  assert.deepEqual([assignment.stage, assignment.round, assignment.stateBlob], [0, 1, h.state.runs.stage(run.id, 0)!.stateBlob], 'a0 loads the state the round ended with');
});

test('inner steps claimed beyond those credited count only as credited: the upload is stored and merged with the credited weight, and its reach grows only to 2 × credited + 16 steps', async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const task = taskOf(a0);
  const start = (await h.coordinator.stageStates.at(run, 0, 0))!;
  const i = task.partitions[0].start + 3;
  const limit = (steps: number): number => adamMoveBound(start.weights[i], steps + FEEDBACK_STEPS, run.options.lr, i < start.decaySize ? ADAMW_DEFAULTS.weightDecay : 0) * 1.01;
  // a0 was credited 2 inner steps: claiming 100 buys the reach of 2 × 2 + 16 = 20, no more
  const pg = fakePseudoGradient(h, a0, 1, 2);
  pg[i] = 1.2 * limit(20);
  await expectOffence(h, key, a0, () => h.coordinator.mergeUploads.putPseudoGradient(a0.id, key, 0, 100, pseudoGradientFrames(h, a0, task, 1, 100, pg)[0]), /more than 20 AdamW steps/);
  pg[i] = 0.9 * limit(20);
  assert.ok(pg[i] > limit(2), 'beyond the reach of the 2 steps credited');
  await h.coordinator.mergeUploads.putPseudoGradient(a0.id, key, 0, 100, pseudoGradientFrames(h, a0, task, 1, 100, pg)[0]);
  assert.deepEqual(h.state.mergeRounds.uploads(key).map((u) => [u.partition, u.samples]), [[0, 2]], 'stored with the 2 steps credited');

  // a0 says it took 5 inner steps (its pseudo-gradient as large as 5 steps make it), b0 the 2 it took
  await uploadPseudoGradient(h, a0, task, 1, 5);
  await uploadPseudoGradient(h, b0, taskOf(b0), 2);
  await uploadAll(h, run, 1);
  assert.deepEqual(h.state.mergeRounds.uploads(key).map((u) => [h.nameOf(u.minerId), u.partition, u.samples]).sort(), [a0, b0].flatMap((m) => [0, 1, 2, 3].map((p) => [m.name, p, 2])).sort());
  h.tick();
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'merging');
  for (const m of [a0, b0]) {
    for (const job of taskOf(m).merge) assert.deepEqual(job.inputs.map((x) => [h.nameOf(x.minerId), x.samples]).sort(), [[a0.name, 2], [b0.name, 2]].sort(), 'the mergers weigh both by the steps credited');
  }
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  h.tick();
  const round = mergeRound(h, run.id, 0, 1);
  assert.equal(round.status, 'applying');
  // the merged partition is the plain mean of the two, not the 5 : 2 mean the claims asked for
  const p = task.partitions[2];
  const merged = decodePartitionFrame(await h.blobs.get(round.plan.chosen![2]), p);
  const [xa, xb] = await Promise.all([a0, b0].map(async (m) => decodePartitionFrame(await h.blobs.get(h.state.mergeRounds.uploads(key).find((u) => u.minerId === m.id && u.partition === 2)!.blob), p)));
  const tol = Math.max(...merged.map(Math.abs)) / 127;
  let offClaimed = 0;
  for (let j = 0; j < merged.length; j++) {
    assert.ok(Math.abs(merged[j] - (xa[j] + xb[j]) / 2) <= tol, `merged value ${j} is the credited mean`);
    offClaimed = Math.max(offClaimed, Math.abs(merged[j] - (5 * xa[j] + 2 * xb[j]) / 7));
  }
  assert.ok(offClaimed > 10 * tol, 'and far from the claimed one');
});

test('two mergers that disagree on a partition: the round settles on the orchestrator recomputing it; the merger whose frame differs gets an invalid unit, the one that matches a merge unit', async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  // a0 merges honestly; b0 merges partition 0 from its own slice alone, the others honestly
  await mergeAndUpload(h, a0, taskOf(a0));
  const task = taskOf(b0);
  const [job0, ...rest] = task.merge;
  assert.equal(job0.partition, 0);
  const own = { ...job0, inputs: job0.inputs.filter((x) => x.minerId === b0.id) };
  const wrong = await h.coordinator.mergeUploads.putMerged(b0.id, key, 0, await mergedFrame(h, b0, task, own));
  for (const job of rest) await h.coordinator.mergeUploads.putMerged(b0.id, key, job.partition, await mergedFrame(h, b0, task, job));
  await mergeAll(h, run, 1);
  const right = h.state.mergeRounds.results(key).find((r) => r.partition === 0 && r.minerId === a0.id)!.blob;
  assert.notEqual(wrong, right);

  h.tick();
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'merging', 'the dispute is not settled by either merger');
  assert.equal(mergeRound(h, run.id, 1, 1).status, 'applying', 'stage 1 goes on');
  assert.equal(h.work(run.id)[`${a0.name}/merge`], undefined);
  await h.coordinator.merges.settled();
  const recomputed = h.state.mergeRounds.results(key).filter((r) => r.minerId === RECOMPUTED);
  assert.deepEqual(recomputed.map((r) => [r.partition, r.blob]), [[0, right]], 'only the disputed partition is recomputed, to the honest frame');
  h.tick();
  const round = mergeRound(h, run.id, 0, 1);
  assert.equal(round.status, 'applying');
  assert.equal(round.plan.chosen![0], right);
  assert.deepEqual(taskOf(a0).apply![0], { partition: 0, blob: right });
  const work = h.work(run.id);
  assert.deepEqual([work[`${a0.name}/merge`], work[`${a0.name}/invalid`], work[`${b0.name}/merge`], work[`${b0.name}/invalid`]], [4, undefined, 3, 1]);
  // the round completes on the honest merge
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [['training', 1], ['training', 1]]);
});

test('on a paid network each offence is one pending slash and an eviction: a heartbeat of false claims, a merged partition that is not the merge of its inputs', async (t) => {
  const h = await harness(t, { slashing: { enabled: true, fraction: 0.1 } });
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const done = h.state.microbatches.byStatus(run.id, 'done')[0].id;

  // b0 merges partition 0 wrongly: when the round settles on the recomputation, a slash, and b0 is evicted
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  await mergeAndUpload(h, a0, taskOf(a0));
  const mine = taskOf(b0);
  const [job0, ...rest] = mine.merge;
  await h.coordinator.mergeUploads.putMerged(b0.id, key, 0, await mergedFrame(h, b0, mine, { ...job0, inputs: job0.inputs.filter((x) => x.minerId === b0.id) }));
  for (const job of rest) await h.coordinator.mergeUploads.putMerged(b0.id, key, job.partition, await mergedFrame(h, b0, mine, job));
  await tickSettled(h);
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'applying');
  let slashes = h.state.ledger.slashes();
  assert.deepEqual(slashes.map((x) => [x.miner, x.fraction, x.checkId, x.status, x.reason]), [[b0.id, 0.1, null, 'pending', `nimble merged partition ${run.id}/0/1/0 by ${b0.id}`]]);
  assert.equal(h.state.miners.get(b0.id)!.alive, false);
  await expectNimbleError(() => b0.beat(), 403, /for an offence: merged partition 0 of round 1 is not the merge of its inputs/);

  // after its ban, b0 joins again; two claims of attempts never issued in one heartbeat: one offence of 2 units, one slash
  h.advance(BAN_MS + 1);
  b0.join();
  const held = h.state.runs.assignmentOf(b0.id);
  assert.ok(held, 'placed again');
  await expectNimbleError(() => b0.beat({ reports: [report(run.id, done, held.stage, 'forward', { attempt: 7 }), report(run.id, done, held.stage, 'backward', { attempt: 8 })] }), 403, /2 false reports/);
  assert.equal(h.work(run.id)[`${b0.name}/invalid`], 3);
  slashes = h.state.ledger.slashes();
  assert.equal(slashes.length, 2);
  assert.match(slashes[1].reason, new RegExp(`^nimble false reports by ${b0.id} at \\d+$`));
  assert.ok(slashes.every((x) => x.miner === b0.id), 'a0 did nothing wrong');
});

test("a merged round's stage state is the orchestrator's: a replica's upload of it is refused with 409 before its body is read, whatever it holds, and the round closes with the honest state, bit for bit", async (t) => {
  const h = await harness(t);
  const run = runAtFirstMerge(h);
  for (const stage of [0, 1]) await uploadAll(h, run, stage);
  h.tick();
  for (const stage of [0, 1]) await mergeAll(h, run, stage);
  h.tick();
  const replicas = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  const honest = await appliedState(h, run.id, 0, 1);
  assert.equal(honest.outerStep, 1);
  await h.coordinator.merges.settled();
  const written = mergeRound(h, run.id, 0, 1).stateBlob!;
  assert.ok(written, 'the orchestrator wrote it while the replicas apply');
  const blobsBefore = await blobIds(h);
  for (const m of replicas) {
    assert.equal(taskOf(m).saveState, false);
    await expectNimbleError(() => h.coordinator.mergeUploads.expectStateSaver(m.id, key), 409, /merged: the orchestrator writes its state/);
    for (const edit of [(s: FakeStageState) => void (s.weights[1234] = nextFloat(s.weights[1234])), () => {}]) {
      await expectNimbleError(async () => h.coordinator.mergeUploads.putState(m.id, key, await stageState(h, run.id, 0, 1, { edit })), 409, /merged: the orchestrator writes its state/);
    }
  }
  assert.deepEqual(Object.keys(h.work(run.id)).filter((k) => k.endsWith('/invalid')), [], 'no offence: refused, not judged');
  assert.deepEqual(await blobIds(h), blobsBefore, 'none of them stored');
  assert.equal(mergeRound(h, run.id, 0, 1).stateBlob, written);
  for (const m of replicas) {
    m.applied = 1;
    m.beat();
  }
  h.tick();
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'done');
  assert.equal(h.state.runs.stage(run.id, 0)!.stateBlob, written);
  const kept = (await h.coordinator.stageStates.at(run, 0, 1))!;
  assert.deepEqual([kept.weights, kept.momentum, kept.outerStep], [honest.weights, honest.momentum, 1]);
});

test('a stage of one replica saves its own weights: refused with 400 when a weight is beyond the reach of its credited AdamW steps or the outer momentum changed', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 2, mergeEvery: 100 });
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 2);
  h.tick();
  const [s0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  assert.equal(mergeRound(h, run.id, 0, 1).partitions, 0);
  const start = (await h.coordinator.stageStates.at(run, 0, 0))!;
  const i = start.decaySize - 5;
  // 2 steps credited: the reach is that of 2 × 2 + 16 = 20 steps (src/model/adamw.ts reach())
  const far = reach(start.weights[i], true, 20, run.options.lr);
  const moved = (by: number) => (s: FakeStageState): void => void (s.weights[i] = start.weights[i] + by);
  await expectOffence(h, key, s0, async () => h.coordinator.mergeUploads.putState(s0.id, key, await stageState(h, run.id, 0, 1, { edit: moved(1.05 * far) })), new RegExp(`weight ${i} is further from the round's start than 20 AdamW steps reach`));
  await expectOffence(h, key, s0, async () => h.coordinator.mergeUploads.putState(s0.id, key, await stageState(h, run.id, 0, 1, { edit: (s) => void (s.momentum[3] = 1e-3) })), /outer momentum changed without a merge/);
  await expectOffence(h, key, s0, async () => h.coordinator.mergeUploads.putState(s0.id, key, await stageState(h, run.id, 0, 1, { edit: (s) => void (s.outerStep = 1) })), /outer momentum changed without a merge/);
  assert.equal(mergeRound(h, run.id, 0, 1).stateBlob, null);
  // just within the reach: taken
  await h.coordinator.mergeUploads.putState(s0.id, key, await stageState(h, run.id, 0, 1, { edit: moved(-0.95 * far) }));
  s0.applied = 1;
  s0.beat();
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.equal(h.run(run.id).status, 'completed');
});

test('with 3 replicas a round merges by a trimmed mean dropping one at each end, and a slice whose norm is far above the others is clipped to 2 × the median norm', async (t) => {
  const h = await harness(t);
  h.joinMany('m', 5);
  const run = h.createRun({ steps: 12, mergeEvery: 2, minMiners: 5 });
  assert.deepEqual(h.replicasByStage(run.id).map((names) => names.length), [3, 2], 'stage 0 holds 3 of the 4 parts: 3 replicas');
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 6);
  h.tick();
  assert.equal(h.run(run.id).status, 'merging', '2 inner steps × 3 replicas');
  const key = { runId: run.id, stage: 0, round: 1 };
  const [r0, r1, big] = h.replicas(run.id, 0);
  // r0 and r1 upload the 2 steps they took; `big` claims 20 (2 × 2 + 16, the most its 2 credited steps allow) and sends a pseudo-gradient 10 times theirs
  await uploadPseudoGradient(h, r0, taskOf(r0), 1);
  await uploadPseudoGradient(h, r1, taskOf(r1), 2);
  await uploadPseudoGradient(h, big, taskOf(big), 3, 20);
  await uploadAll(h, run, 1);
  h.tick();
  const round = mergeRound(h, run.id, 0, 1);
  assert.equal(round.status, 'merging');
  assert.equal(round.partitions, 6, '2 per replica');
  const parts = taskOf(r0).partitions;
  const slices = async (p: number): Promise<Map<string, Float32Array>> => {
    const out = new Map<string, Float32Array>();
    for (const u of h.state.mergeRounds.uploads(key).filter((x) => x.partition === p)) out.set(u.minerId, decodePartitionFrame(await h.blobs.get(u.blob), parts[p]));
    return out;
  };
  const rule = round.plan.rule!;
  assert.deepEqual([rule.aggregator, rule.trim], ['trimmed-mean', 1 / 3]);
  for (let p = 0; p < 6; p++) {
    const x = await slices(p);
    const [n0, n1, nb] = [r0, r1, big].map((m) => l2Norm(x.get(m.id)!));
    const mid = [n0, n1, nb].sort((a, b) => a - b)[1];
    assert.ok(nb > 5 * Math.max(n0, n1), `partition ${p}: big's slice is far larger`);
    // the orchestrator sums the squares from the int8 codes and scales, here from the float32 values: they differ by float32 rounding
    assert.ok(Math.abs(rule.medians[p] - mid) <= 1e-6 * mid, `partition ${p}: the median norm`);
    assert.ok(Math.abs(rule.maxNorms[p] - 2 * mid) <= 1e-6 * mid, `partition ${p}: the bound is 2 × the median norm`);
  }
  // every merger is told the rule: trimmed mean, trim 1/3, each partition's bound
  for (const m of [r0, r1, big]) {
    const task = taskOf(m);
    assert.deepEqual([task.aggregator, task.trim], ['trimmed-mean', 1 / 3]);
    for (const job of task.merge) {
      assert.equal(job.maxNorm, rule.maxNorms[job.partition]);
      assert.deepEqual(job.inputs.map((x) => [h.nameOf(x.minerId), x.samples]).sort(), [r0, r1, big].map((r) => [r.name, 2]).sort(), 'big weighs its 2 credited steps');
    }
  }
  assert.deepEqual(round.plan.mergers.map((ms) => ms.length), [2, 2, 2, 2, 2, 2]);
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  h.tick();
  const merged = mergeRound(h, run.id, 0, 1);
  assert.equal(merged.status, 'applying', 'the two mergers of each partition agreed');
  assert.equal(h.state.mergeRounds.results(key).filter((r) => r.minerId === RECOMPUTED).length, 0);
  // each merged partition is, value by value, the middle one of r0's, r1's and big's slice scaled down to the bound
  for (let p = 0; p < 6; p++) {
    const x = await slices(p);
    const [a, b, c] = [x.get(r0.id)!, x.get(r1.id)!, x.get(big.id)!];
    const clip = rule.maxNorms[p] / l2Norm(c);
    const got = decodePartitionFrame(await h.blobs.get(merged.plan.chosen![p]), parts[p]);
    const tol = Math.max(...got.map(Math.abs)) / 127;
    let offUnclipped = 0;
    for (let j = 0; j < got.length; j++) {
      assert.ok(Math.abs(got[j] - middle(a[j], b[j], c[j] * clip)) <= tol, `partition ${p} value ${j}`);
      offUnclipped = Math.max(offUnclipped, Math.abs(got[j] - middle(a[j], b[j], c[j])));
    }
    assert.ok(offUnclipped > 10 * tol, `partition ${p}: not the median of the unclipped slices`);
  }
  const work = h.work(run.id);
  assert.equal([r0, r1, big].reduce((n, m) => n + (work[`${m.name}/merge`] ?? 0), 0), 12, 'a merge unit per merger and partition');
  assert.deepEqual([r0, r1, big].map((m) => work[`${m.name}/invalid`]), [undefined, undefined, undefined]);
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
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

// ---- regressions: bugs these tests found, fixed --------------------------------------------


// A miner process that restarts joins with a new session key; a receipt it signed just before
// still proves the hand-off (its recent keys are kept for receipts).
test('a receipt signed just before its signer restarted (and joined with a new session key) still proves the hand-off: the sender is not charged, the restarted miner is', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 }, { microbatchDeadlineMs: 2_000 });
  const [x] = s0.take(1);
  const forward = s0.forward(x, { to: s1 });
  // s1 took x's activation, then its process restarted before s0's next heartbeat: it lost x and joined with a new key
  s1.restart();
  s1.beat();
  s0.beat({ reports: [forward] });
  assert.deepEqual(h.work(run.id), {}, 'no invalid unit for an honest receipt');
  assert.deepEqual(pick(h, x).path, [s0.id, s1.id]);
  h.advance(2_001);
  h.tick();
  assert.deepEqual(h.work(run.id), { [`${s1.name}/dropped`]: 1 }, 'the miner that lost x is charged, not the one that handed it on');
});

// A vanished miner is charged only for microbatches it still owed a hop of; one whose hops it
// had all done carries on without it.
test('a miner that vanishes after claiming all its hops of a microbatch is not charged for it, and the microbatch still completes', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 4_000 });
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 20 });
  beatAll(...h.miners.values());
  const [a0, b0] = h.replicas(run.id, 0);
  const [a1, b1] = h.replicas(run.id, 1);
  const [x] = a0.take(1);
  a0.beat({ reports: [a0.forward(x, { to: a1 })] });
  a1.beat({ reports: [a1.last(x, { loss: 3 }), a1.backward(x)] });
  // a1 is done with x (a0 receipted its gradient) and goes away
  h.advance(3_000);
  beatAll(a0, b0, b1);
  h.advance(1_001);
  h.tick();
  assert.equal(h.state.miners.get(a1.id)!.alive, false);
  assert.equal(h.work(run.id)[`${a1.name}/dropped`], undefined, 'a1 held nothing of x any more');
  a0.beat({ reports: [a0.backward(x)] });
  assert.equal(pick(h, x).status, 'done');
});

// A resent heartbeat naming the dead attempt of a microbatch re-issued to the miner in the lost
// reply gets the new attempt again (held work is matched by microbatch and attempt).
test('a resent heartbeat still naming the dead attempt of a microbatch re-issued to it in the lost reply gets the new attempt again', async (t) => {
  const h = await harness(t, { microbatchDeadlineMs: 2_000 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 10 });
  const [s0] = h.replicas(run.id, 0);
  beatAll(s0, ...h.replicas(run.id, 1));
  const [x] = s0.take(1);
  h.advance(2_001);
  h.tick();
  const req = s0.request({ freeSlots: 1 });
  assert.deepEqual(req.held, [{ microbatch: x, attempt: 1 }]);
  const lost = h.coordinator.heartbeat(s0.id, req);
  assert.deepEqual(lost.abandon, [x]);
  assert.deepEqual(lost.microbatches.map((m) => [m.id, m.attempt]), [[x, 2]]);
  const again = s0.send(req);
  assert.deepEqual(again.abandon, [x]);
  assert.deepEqual(again.microbatches, lost.microbatches);
});

// A done microbatch keeps the whole path its claims proved and the loss of its last stage.
test('a done microbatch keeps its whole path and the loss its last stage reported, whatever order its claims came in', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 10 });
  const [x, y] = s0.take(2);
  completeMicrobatch(run.id, x, s0, s1, 4.25);
  const forward = s0.forward(y, { to: s1 });
  s1.beat({ reports: [s1.last(y, { loss: 3 }), s1.backward(y)] });
  s0.beat({ reports: [s0.backward(y), forward] });
  assert.deepEqual([pick(h, x).status, pick(h, y).status], ['done', 'done']);
  assert.deepEqual([h.state.microbatches.get(x)!.loss, h.state.microbatches.get(y)!.loss], [4.25, 3]);
  assert.deepEqual(pick(h, y).path, [s0.id, s1.id]);
});

// A round that ends without a saved state (every replica left it) leaves the stage at its last
// kept state, and the next round starts from it.
test('a round that ends with all of a stage\'s replicas dropped keeps the stage at its last state: the next round checks uploads and the state against it and completes', async (t) => {
  const h = await harness(t, { minerTimeoutMs: 10 * UPLOAD_TIMEOUT_MS });
  const run = runAtFirstMerge(h);
  // stage 0's replicas upload nothing in time; stage 1's round goes through
  await uploadAll(h, run, 1);
  h.tick();
  await mergeAll(h, run, 1);
  h.tick();
  await applyAll(h, run, 1, 1);
  h.advance(UPLOAD_TIMEOUT_MS + 1);
  beatAll(...h.miners.values());
  h.tick();
  assert.equal(mergeRound(h, run.id, 0, 1).status, 'done');
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round, s.stateBlob === null]), [['training', 1, true], ['training', 1, false]], 'stage 0 keeps its initial weights');
  // round 2: stage 0's replicas upload the 4 steps they took since the initial weights (2 of them credited this round)
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 4);
  h.tick();
  const key = { runId: run.id, stage: 0, round: 2 };
  assert.equal(mergeRound(h, run.id, 0, 2).status, 'uploading');
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  assert.deepEqual(h.state.mergeRounds.uploads(key).map((u) => u.samples), Array(8).fill(2));
  h.tick();
  for (const stage of [0, 1]) await mergeAll(h, run, stage);
  h.tick();
  await applyAll(h, run, 0, 2);
  await applyAll(h, run, 1, 2);
  h.tick();
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => [s.mode, s.round]), [['training', 2], ['training', 2]]);
});

// ---- helpers of this file ---------------------------------------------------------------

/** The fields of a microbatch the flow moves. */
/**
 * Expects `fn` to be refused with 400 as an offence of `m` (src/orchestrator/rewards/offences.ts), after which `m`
 * has left the round; puts it back where it was (white-box) so that a test can probe the same check again.
 */
async function expectOffence(h: Harness, key: RoundKey, m: FakeMiner, fn: () => Promise<unknown>, message: RegExp, offenceKey?: string): Promise<void> {
  const before = h.state.mergeRounds.get(key)!.replicas;
  assert.ok(before.includes(m.id));
  await assert.rejects(fn, (err: unknown) => err instanceof OffenceError && err.status === 400 && message.test(err.message) && (offenceKey === undefined || err.offence.key === offenceKey));
  assert.deepEqual(h.state.mergeRounds.get(key)!.replicas, before.filter((x) => x !== m.id), 'the offender left the round');
  h.state.mergeRounds.update(key, { replicas: before });
}

function pick(h: Harness, id: number): { status: string; minerId: string | null; path: (string | null)[]; progress: number; attempts: number } {
  const mb = h.state.microbatches.get(id);
  assert.ok(mb, `microbatch ${id} exists`);
  return { status: mb.status, minerId: mb.minerId, path: mb.path, progress: mb.progress, attempts: mb.attempts };
}


/** The float32 next to `x`, away from zero. */
function nextFloat(x: number): number {
  const f = new Float32Array([x]);
  new Uint32Array(f.buffer)[0]++;
  return f[0];
}

/** The middle one of three values. */
function middle(a: number, b: number, c: number): number {
  return [a, b, c].sort((x, y) => x - y)[1];
}

/** What was logged between two snapshots of `h.work`. */
function workDelta(before: Record<string, number>, after: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after)) if (v !== (before[k] ?? 0)) out[k] = v - (before[k] ?? 0);
  return out;
}




// A stage-0 miner's backward can be reported a heartbeat before its forward (the gradient came
// back before the answer to the activation's send): the microbatch is not held there any more,
// but it was started, so it is not sent to it again, and the forward's claim still completes it.
test('a backward reported before its forward: the microbatch is not sent again, and the late forward completes it', async (t) => {
  const { h, s0, s1 } = await twoStages(t, { steps: 10 });
  const [x] = s0.take(1);
  const forward = s0.forward(x, { to: s1 });
  s1.beat({ reports: [s1.last(x, { loss: 3 }), s1.backward(x)] });
  const reply = s0.beat({ reports: [s0.backward(x)], held: [], freeSlots: 0 });
  assert.deepEqual(reply.microbatches.map((m) => m.id), [], 'nothing sent again');
  assert.equal(pick(h, x).status, 'issued');
  s0.beat({ reports: [forward], held: [] });
  assert.equal(pick(h, x).status, 'done');
});

// A run cancelled while its microbatches are in flight leaves them issued (its rows are collected
// later): they are not the miners' work any more, and do not keep the next run's microbatches away.
test('microbatches of a cancelled run do not count against what its miners are given in the next run', async (t) => {
  const { h, run, s0, s1 } = await twoStages(t, { steps: 100 });
  assert.ok(s0.take(6).length > 0);
  h.coordinator.cancelRun(run.id, OWNER);
  beatAll(s0, s1);
  const next = h.createRun({ steps: 100 });
  const [n0] = h.replicas(next.id, 0);
  beatAll(...h.miners.values());
  assert.ok(n0.take(6).length > 0, 'the next run gets microbatches at once');
});
