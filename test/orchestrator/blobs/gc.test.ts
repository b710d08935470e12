// Collection (src/orchestrator/blobs/gc.ts) on a real Coordinator driven by fake
// miners (../helpers.ts): what a long run leaves behind is deleted, rows and
// blobs, and what is still needed is not: the state an open spot check's
// forward started from (the check still passes after a collection), the
// stages' latest states (the checkpoint still assembles), the next round's
// starting point (the next round still completes), the counters the views show.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadCorpus } from '../../../src/data/corpus.ts';
import { batchForShard } from '../../../src/data/batches.ts';
import { GptStage } from '../../../src/model/gpt.ts';
import { assembleCheckpoint } from '../../../src/orchestrator/training/checkpoint.ts';
import type { GcOptions } from '../../../src/orchestrator/blobs/gc.ts';
import type { RunRecord } from '../../../src/orchestrator/state/runs.ts';
import { MergeChecks } from '../../../src/orchestrator/training/merge-checks.ts';
import { runView } from '../../../src/orchestrator/views.ts';
import { encodeCheckBundle } from '../../../src/protocol/check-bundle.ts';
import { encodeFrame, readFrameHeader } from '../../../src/protocol/frame.ts';
import { beatAll, blobIds, mergeRoundAll, trainMicrobatches, trainToCompletion, uploadAll } from '../flows.ts';
import { CONFIG, FRAME_BYTES, Harness, type FakeMiner } from '../helpers.ts';

/** No pass from the clock unless a test says so: the tests collect by hand. */
const BY_HAND: Partial<GcOptions> = { everyMs: 1e12 };

async function harness(t: { after: (fn: () => void) => void }, gc: Partial<GcOptions> = {}, options: Parameters<typeof Harness.open>[0] = {}): Promise<Harness> {
  const h = await Harness.open({ minerTimeoutMs: 1e12, microbatchDeadlineMs: 1e12, ...options, gc: { ...BY_HAND, ...gc } });
  t.after(() => h.close());
  return h;
}

/** Two passes a grace period apart: rows go in the first, the blobs they named in the second. */
async function collect(h: Harness): Promise<void> {
  await h.coordinator.gc.collect();
  h.advance(h.coordinator.gc.options.blobGraceMs + 1);
  await h.coordinator.gc.collect();
}

/** A run of 2 stages × 2 replicas with a merge every 2 inner steps per replica. */
function twoByTwo(h: Harness, steps = 40): RunRecord {
  h.joinMany('m', 4);
  const run = h.createRun({ steps, mergeEvery: 2 });
  beatAll(...h.miners.values());
  return run;
}

/** Rounds of a stage that have a row, in order. */
function roundsKept(h: Harness, runId: string, stage: number, upTo = 20): number[] {
  return Array.from({ length: upTo }, (_, i) => i + 1).filter((r) => h.state.mergeRounds.get({ runId, stage, round: r }));
}

/** Every blob the rows kept name: stage states, round states, uploads, results. */
function blobsNamed(h: Harness, runId: string): string[] {
  const out = new Set<string>();
  for (const s of h.state.runs.stages(runId)) {
    if (s.stateBlob) out.add(s.stateBlob);
    for (let r = 1; r <= s.round + 1; r++) {
      const k = { runId, stage: s.stage, round: r };
      const row = h.state.mergeRounds.get(k);
      if (row?.stateBlob) out.add(row.stateBlob);
      for (const u of h.state.mergeRounds.uploads(k)) out.add(u.blob);
      for (const x of h.state.mergeRounds.results(k)) out.add(x.blob);
    }
  }
  return [...out].sort();
}

test('merge rounds: uploads and results go once a later round is done, round rows and states once nothing needs them; the next round still completes and the checkpoint still assembles', async (t) => {
  const h = await harness(t);
  const run = twoByTwo(h);
  for (let round = 1; round <= 3; round++) {
    trainMicrobatches(h, run, 4);
    await mergeRoundAll(h, run, round);
  }
  const before = await blobIds(h);
  const r1 = { runId: run.id, stage: 0, round: 1 };
  const oldBlobs = [...h.state.mergeRounds.uploads(r1).map((u) => u.blob), h.state.mergeRounds.get(r1)!.stateBlob!];
  assert.ok(oldBlobs.every((b) => before.includes(b)));

  await collect(h);
  for (const stage of [0, 1]) {
    assert.deepEqual(roundsKept(h, run.id, stage), [3], 'the latest round is kept: the next one starts from it');
    assert.deepEqual(h.state.mergeRounds.uploads({ runId: run.id, stage, round: 2 }), []);
    assert.ok(h.state.mergeRounds.uploads({ runId: run.id, stage, round: 3 }).length > 0, "the latest round's uploads wait for a later round");
  }
  const after = await blobIds(h);
  assert.deepEqual(after, blobsNamed(h, run.id), 'the store holds exactly the blobs the kept rows name');
  assert.ok(after.length < before.length);
  assert.ok(oldBlobs.every((b) => !after.includes(b)), "round 1's uploads and state are gone");
  assert.equal(h.state.garbage.count(), 0);

  // round 4 checks its uploads and state against round 3's, which is kept
  h.coordinator.stageStates.clear();
  trainMicrobatches(h, run, 4);
  await mergeRoundAll(h, run, 4);
  await collect(h);
  assert.deepEqual(roundsKept(h, run.id, 0), [4]);
  assert.deepEqual(await blobIds(h), blobsNamed(h, run.id));
  const checkpoint = await assembleCheckpoint(h.state, h.blobs, run.id);
  assert.ok(checkpoint.length > 0);
  assert.equal(runView(h.state, h.coordinator.microbatches, h.run(run.id)).mergesDone, 4);
});

/**
 * Microbatch `mb` of `s0` (stage 0) forwarded with a real activation: the
 * stage's state after round `round` run on the microbatch's shard, as an f16
 * frame, its sha claimed; `s1` takes it the rest of the way. Returns the
 * bundle `s0` answers a check of it with.
 */
async function realForward(h: Harness, run: RunRecord, s0: FakeMiner, s1: FakeMiner, mb: number, round: number): Promise<Uint8Array> {
  const state = await h.coordinator.stageStates.at(run, 0, round);
  assert.ok(state);
  const shard = s0.tasks.get(mb)!.shard;
  const stage = new GptStage(await h.engine(), CONFIG, { from: 0, to: 3 }, { batchSize: run.batchSize, seed: run.seed });
  let frame: Uint8Array;
  try {
    stage.params.flat.data.set(state.weights);
    const batch = batchForShard(loadCorpus(run.data).train, run.seed, shard, run.batchSize, CONFIG.contextLength);
    const out = stage.forward(batch.inputs, run.batchSize, CONFIG.contextLength) as Float32Array;
    frame = encodeFrame(out, [run.batchSize * CONFIG.contextLength, CONFIG.channels], 'f16', { microbatch: mb });
  } finally {
    stage.release();
  }
  const outputSha = readFrameHeader(frame).header.sha256;
  const attempt = s0.held.get(mb)!;
  const receipt = s1.receive(s0, { runId: run.id, microbatch: mb, attempt, stage: 1, phase: 'forward' }, outputSha);
  s0.beat({ reports: [{ runId: run.id, microbatch: mb, attempt, stage: 0, phase: 'forward', next: s1.id, receipt, bytesSent: FRAME_BYTES, outputSha }] });
  h.state.spotChecks.ask({ runId: run.id, microbatch: mb, attempt, stage: 0, minerId: s0.id, createdAt: h.now });
  assert.deepEqual(s0.beat().checks, [mb], 'the check reaches its miner');
  s1.beat({ reports: [s1.last(mb, { loss: 5 }), s1.backward(mb)] });
  s0.beat({ reports: [s0.backward(mb)] });
  return encodeCheckBundle({ meta: { runId: run.id, microbatch: mb, stage: 0, round, samples: 0, shard }, weights: state.weights, input: null, output: frame });
}

test('an open spot check keeps the state its forward started from, through later rounds and collections: answered after them it passes; once decided, that state goes', async (t) => {
  const h = await harness(t, { claimRetentionMs: 0, microbatchRetentionMs: 0 });
  const run = twoByTwo(h);
  trainMicrobatches(h, run, 4);
  await mergeRoundAll(h, run, 1);
  const [a0] = h.replicas(run.id, 0);
  const [a1] = h.replicas(run.id, 1);
  const [x] = a0.take(1);
  const bundle = await realForward(h, run, a0, a1, x, 1);
  const r1 = { runId: run.id, stage: 0, round: 1 };
  const stateAfter1 = h.state.mergeRounds.get(r1)!.stateBlob!;
  trainMicrobatches(h, run, 3);
  await mergeRoundAll(h, run, 2);
  trainMicrobatches(h, run, 4);
  await mergeRoundAll(h, run, 3);

  await collect(h);
  assert.deepEqual(roundsKept(h, run.id, 0), [1, 2, 3], "stage 0 keeps round 1 (the check's) and the rounds after it");
  assert.deepEqual(roundsKept(h, run.id, 1), [3], 'stage 1 has no open check');
  assert.deepEqual(h.state.mergeRounds.uploads(r1), [], "but round 1's uploads are gone");
  assert.ok((await blobIds(h)).includes(stateAfter1), 'the state after round 1 is kept');
  assert.ok(h.state.microbatches.get(x), 'the checked microbatch is kept (its shard)');
  assert.equal(h.state.claims.ofHop(x, 1, 0, 'forward').length, 1, 'its claim is kept (the commitment)');

  h.coordinator.stageStates.clear(); // nothing cached: the state is read from its blob
  const outcome = await h.coordinator.checks.submit(a0.id, run.id, x, bundle);
  assert.equal(outcome.status, 'passed', outcome.detail);

  await collect(h);
  assert.deepEqual(roundsKept(h, run.id, 0), [3]);
  assert.ok(!(await blobIds(h)).includes(stateAfter1), 'decided: the state after round 1 is collected');
  assert.equal(h.state.microbatches.get(x), undefined);
  assert.deepEqual(h.state.claims.ofAttempt(x, 1), []);
});

test('microbatches, hop claims and decided checks: collected after their retention, the views keep their counts; nothing a microbatch in flight or an open check needs goes', async (t) => {
  const retention = 10 * 60_000;
  const h = await harness(t, { claimRetentionMs: retention, microbatchRetentionMs: retention, checkRetentionMs: retention });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 20, mergeEvery: 1000 });
  const [s0] = h.replicas(run.id, 0);
  const [s1] = h.replicas(run.id, 1);
  beatAll(s0, s1);
  const done = trainMicrobatches(h, run, 4);
  const [inFlight] = s0.take(1);
  s0.beat({ reports: [s0.forward(inFlight, { to: s1 })] });
  const checkOf = (mb: number): number => h.state.spotChecks.ask({ runId: run.id, microbatch: mb, attempt: 1, stage: 0, minerId: s0.id, createdAt: h.now });
  const open = checkOf(done[0]);
  h.state.spotChecks.decide(checkOf(done[1]), { status: 'passed', cosine: 1, normRatio: 1, detail: 'ok' }, h.now);
  h.state.spotChecks.decide(checkOf(done[2]), { status: 'failed', cosine: 0, normRatio: 1, detail: 'wrong' }, h.now);
  const checksBefore = runView(h.state, h.coordinator.microbatches, h.run(run.id)).checks;
  assert.deepEqual(checksBefore, [{ miner: s0.id, name: s0.name, passed: 1, failed: 1, open: 1 }]);

  await h.coordinator.gc.collect();
  assert.equal(h.state.microbatches.count(run.id, 'done'), 4, 'nothing is old enough yet');
  assert.equal(h.state.spotChecks.list().length, 3);

  h.advance(retention + 1);
  const report = await h.coordinator.gc.collect();
  assert.deepEqual([report.microbatches, report.checksDeleted], [3, 2]);
  assert.deepEqual(
    h.state.microbatches.byStatus(run.id, 'done').map((mb) => mb.id),
    [done[0]],
    'the microbatch with an open check stays',
  );
  assert.equal(h.state.microbatches.get(inFlight)?.status, 'issued');
  assert.equal(h.state.claims.ofAttempt(done[1], 1).length, 0, 'old claims go');
  assert.ok(h.state.claims.ofAttempt(done[0], 1).length > 0, "the open check's claims stay");
  assert.ok(h.state.claims.ofAttempt(inFlight, 1).length > 0, "the claims of a microbatch in flight stay (its attempt is still being chained)");
  assert.deepEqual(h.state.spotChecks.list().map((c) => c.id), [open]);
  const view = runView(h.state, h.coordinator.microbatches, h.run(run.id));
  assert.deepEqual(view.checks, checksBefore, 'the counts of deleted checks are kept');
  assert.deepEqual([view.microbatchesDone, view.tokensDone], [4, 4 * run.batchSize * CONFIG.contextLength], 'the counters stay');
  // the microbatch in flight still completes with its kept claims
  s1.beat({ reports: [s1.last(inFlight, { loss: 4 }), s1.backward(inFlight)] });
  s0.beat({ reports: [s0.backward(inFlight)] });
  assert.equal(h.state.microbatches.get(inFlight)?.status, 'done');
});

test('an ended run: undelivered checks are skipped (not failed), delivered ones stay open; its rows and blobs go but its stages\' latest states, and the checkpoint still assembles', async (t) => {
  const h = await harness(t, { claimRetentionMs: 0, microbatchRetentionMs: 0 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 6, mergeEvery: 1000 });
  const ids = await trainToCompletion(h, run);
  assert.deepEqual([h.coordinator.microbatches.runsTracked, h.coordinator.merges.stagesTracked], [1, 2], 'memory holds tokens/s and applied rounds of the run');
  const [s0] = h.replicas(run.id, 0);
  const ask = (mb: number): number => h.state.spotChecks.ask({ runId: run.id, microbatch: mb, attempt: 1, stage: 0, minerId: s0.id, createdAt: h.now });
  const delivered = ask(ids[0]);
  s0.beat();
  const undelivered = ask(ids[1]);
  const latest = h.state.runs.stages(run.id).map((s) => s.stateBlob!);

  const report = await h.coordinator.gc.collect();
  assert.equal(report.checksSkipped, 1);
  const byId = new Map(h.state.spotChecks.list().map((c) => [c.id, c]));
  assert.equal(byId.get(undelivered)?.status, 'skipped');
  assert.equal(byId.get(delivered)?.status, 'asked', 'its miner was told: it may still answer');
  assert.deepEqual(h.work(run.id)[`${s0.name}/failed_check`], undefined, 'nobody is charged for a check never asked');
  assert.deepEqual(
    h.state.microbatches.byStatus(run.id, 'done').map((mb) => mb.id),
    [ids[0]],
    "an ended run's microbatches go, but the one an open check names",
  );
  assert.equal(h.coordinator.microbatches.runsTracked, 0, 'what memory held of the run is let go');
  assert.equal(h.coordinator.merges.stagesTracked, 0);

  h.advance(h.coordinator.gc.options.blobGraceMs + 1);
  await h.coordinator.gc.collect();
  assert.deepEqual(await blobIds(h), [...latest].sort(), "only the stages' latest states are left");
  assert.ok((await assembleCheckpoint(h.state, h.blobs, run.id)).length > 0);
});

test('a cancelled run mid-round: the open round, its uploads and their blobs go', async (t) => {
  const h = await harness(t);
  const run = twoByTwo(h);
  trainMicrobatches(h, run, 4);
  await mergeRoundAll(h, run, 1);
  trainMicrobatches(h, run, 4);
  h.tick();
  for (const s of [0, 1]) await uploadAll(h, run, s);
  const open = { runId: run.id, stage: 0, round: 2 };
  assert.ok(h.state.mergeRounds.uploads(open).length > 0);
  const latest = h.state.runs.stages(run.id).map((s) => s.stateBlob!);
  h.coordinator.cancelRun(run.id, run.owner!);
  await collect(h);
  assert.deepEqual([roundsKept(h, run.id, 0), roundsKept(h, run.id, 1)], [[], []]);
  assert.deepEqual(h.state.mergeRounds.uploads(open), []);
  assert.deepEqual(await blobIds(h), [...latest].sort(), "the states after round 1 stay: the run's checkpoint");
});

test('collected blobs are remembered in the database: a restart between deleting the rows and deleting the blobs leaks nothing; a blob named again is kept', async (t) => {
  const h = await harness(t, { blobGraceMs: 60_000 });
  const run = twoByTwo(h);
  for (let round = 1; round <= 2; round++) {
    trainMicrobatches(h, run, 4);
    await mergeRoundAll(h, run, round);
  }
  const report = await h.coordinator.gc.collect();
  assert.ok(report.roundBlobs > 0 && report.blobs === 0, 'the blobs wait for their grace period');
  const condemned = h.state.garbage.due(h.now + 1, 1000);
  assert.equal(condemned.length, report.roundBlobs);
  // one of them is named again (the same bytes uploaded anew, say, as a stage state)
  const again = condemned[0];
  h.state.runs.finishRound(run.id, 1, 2, again);
  await h.restart();
  h.advance(60_001);
  const after = await h.coordinator.gc.collect();
  assert.equal(after.blobs, condemned.length - 1);
  const left = await blobIds(h);
  assert.ok(left.includes(again));
  assert.ok(condemned.slice(1).every((b) => !left.includes(b)));
  assert.equal(h.state.garbage.count(), 0);
});

test('the clock collects every everyMs, not more often', async (t) => {
  const h = await harness(t, { everyMs: 30_000, claimRetentionMs: 0 });
  h.joinMany('m', 2);
  const run = h.createRun({ steps: 20, mergeEvery: 1000 });
  beatAll(...h.miners.values());
  const claimsOf = (ids: number[]): number => ids.reduce((n, id) => n + h.state.claims.ofAttempt(id, 1).length, 0);
  h.tick();
  await h.coordinator.gc.settled();
  const first = trainMicrobatches(h, run, 2);
  h.advance(1_000);
  h.tick();
  await h.coordinator.gc.settled();
  assert.ok(claimsOf(first) > 0, 'no pass 1 s after the last');
  h.advance(30_000);
  h.tick();
  await h.coordinator.gc.settled();
  assert.equal(claimsOf(first), 0, 'a pass 31 s after the last');
});

test('miners gone for long, or beyond the most recent maxGoneMiners, are forgotten with their session keys; one holding a stage of an active run is kept', async (t) => {
  const day = 24 * 60 * 60_000;
  const h = await harness(t, { minerRetentionMs: day, maxGoneMiners: 2 });
  const gone = h.joinMany('g', 4);
  for (const m of gone) {
    h.advance(1_000);
    h.state.miners.touch(m.id, h.now);
    h.state.miners.markGone(m.id);
  }
  const [holder, other] = h.joinMany('m', 2);
  const run = h.createRun({ steps: 20, mergeEvery: 1000 });
  assert.deepEqual(h.replicasByStage(run.id).flat().sort(), ['m0', 'm1']);
  h.state.miners.markGone(holder.id); // gone, not re-planned yet: it still holds its stage
  assert.equal(h.coordinator.sessionKeysKept, 6);

  let report = await h.coordinator.gc.collect();
  const names = (): string[] => h.state.miners.list().map((m) => m.name).sort();
  assert.deepEqual(names(), ['g3', 'm0', 'm1'], 'of the gone miners only the 2 seen last are kept (m0 and g3); m0 holds a stage anyway');
  assert.equal(report.miners, 3);
  assert.equal(h.coordinator.sessionKeysKept, 3);
  h.advance(day + 1);
  report = await h.coordinator.gc.collect();
  assert.equal(report.miners, 1);
  assert.deepEqual(names(), ['m0', 'm1'], 'a day later g3 is forgotten too');
  assert.equal(h.coordinator.sessionKeysKept, 2);
  assert.equal(h.coordinator.sessionKeyOf(other.id), other.key.publicKey);
  // a forgotten miner that comes back joins like a new one
  gone[0].join();
  assert.equal(h.state.miners.get(gone[0].id)?.alive, true);
});

/** Units credited to each replica for round 2 of both stages (what round 2's upload checks allow). */
function round2Credits(h: Harness, run: RunRecord): number[] {
  const checks = new MergeChecks(h.state, h.blobs, h.coordinator.stageStates);
  return [0, 1].flatMap((stage) => h.replicas(run.id, stage).map((m) => checks.creditedSteps({ runId: run.id, stage, round: 2 }, m.id)));
}

/** Round 1 trained and merged, then round 2's microbatches trained, a second apart each. */
async function intoRound2(h: Harness): Promise<RunRecord> {
  const run = twoByTwo(h);
  trainMicrobatches(h, run, 4);
  h.advance(1000);
  await mergeRoundAll(h, run, 1);
  h.advance(1000);
  trainMicrobatches(h, run, 4);
  return run;
}

test("the work log: paid entries past the retention, logged before their stages' latest round opened, are folded into sums; totals, credited steps and the last id stay", async (t) => {
  const h = await harness(t, { workRetentionMs: 60_000, foldUnpaidWork: true });
  const run = await intoRound2(h);
  const [totals, all, credited, entries, last] = [h.state.ledger.workTotals(run.id), h.state.ledger.workTotals(), round2Credits(h, run), h.state.ledger.workEntries(), h.state.ledger.lastWorkId()];
  assert.ok(credited.every((c) => c > 0), 'round 2 has credited steps to check');

  assert.equal((await h.coordinator.gc.collect()).workFolded, 0, 'nothing is past the retention yet');
  h.advance(120_000);
  const report = await h.coordinator.gc.collect();
  // round 1's 4 microbatches, forward and backward at both stages; round 2's and the merge work after round 1 opened stay
  assert.equal(report.workFolded, 4 * 2 * 2);
  assert.equal(h.state.ledger.workEntries(), entries - report.workFolded);
  assert.deepEqual(h.state.ledger.workTotals(run.id), totals, "the run's totals count the folded entries");
  assert.deepEqual(h.state.ledger.workTotals(), all);
  assert.deepEqual(round2Credits(h, run), credited, "round 2's checks see the same steps");
  assert.equal(h.state.ledger.lastWorkId(), last);

  // an ended run's entries all go but the newest (lastWorkId never goes back), and a second pass folds into the same sums
  h.coordinator.stopRun(run.id, 'test');
  h.advance(120_000);
  assert.equal((await h.coordinator.gc.collect()).workFolded, entries - report.workFolded - 1);
  assert.equal(h.state.ledger.workEntries(), 1);
  assert.deepEqual(h.state.ledger.workTotals(run.id), totals);
  assert.equal(h.state.ledger.lastWorkId(), last);
});

test('the work log is folded only up to the first epoch not settled; a paying orchestrator with no epoch yet folds nothing', async (t) => {
  const h = await harness(t, { workRetentionMs: 60_000 });
  const run = await intoRound2(h);
  const { ledger } = h.state;
  h.advance(120_000);
  assert.equal((await h.coordinator.gc.collect()).workFolded, 0, 'no epoch: the work may still be paid');
  const epoch = ledger.openEpoch(h.now);
  assert.equal((await h.coordinator.gc.collect()).workFolded, 0, 'the open epoch covers every entry');
  ledger.closeEpoch(epoch.id, { runId: run.id, mergesMark: 1, toLog: ledger.lastWorkId(), closedAt: h.now, emission: 10n, remainder: 0n, settled: false });
  ledger.openEpoch(h.now);
  assert.equal((await h.coordinator.gc.collect()).workFolded, 0, 'the closed epoch is not settled yet');
  ledger.markSettled(epoch.id, null, h.now);
  const totals = ledger.workTotals(run.id);
  assert.equal((await h.coordinator.gc.collect()).workFolded, 4 * 2 * 2, "settled: round 1's entries go");
  assert.deepEqual(ledger.workTotals(run.id), totals);
});
