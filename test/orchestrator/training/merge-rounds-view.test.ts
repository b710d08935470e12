// GET /runs/:id/merges (src/orchestrator/training/merge-rounds-view.ts) on a real
// coordinator and state (../helpers.ts): a merge round run by fake replicas as
// honest ones run it, one merger sending a partition that is not the merge,
// listed as the state recorded it; hand-recorded rounds of every outcome;
// newest first, at most 200; an unknown run 404; and the client's runMerges
// over a real socket.
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { MERGE_ROUNDS_SHOWN, RunMerges } from '../../../src/api/merges.ts';
import { OrchestratorClient } from '../../../src/api/client.ts';
import type { HttpServer } from '../../../src/http/server.ts';
import { buildApi } from '../../../src/orchestrator/http.ts';
import { RECOMPUTED } from '../../../src/orchestrator/training/merge-checks.ts';
import type { RoundPlan } from '../../../src/orchestrator/state/merge-rounds.ts';
import { parse } from '../../../src/protocol/messages.ts';
import { applyAll, beatAll, mergeAll, runAtFirstMerge, taskOf, trainMicrobatches, uploadAll } from '../flows.ts';
import { expectNimbleError, Harness, mergeAndUpload, mergedFrame, newMinerId, sha } from '../helpers.ts';

async function open(t: TestContext): Promise<{ h: Harness; app: HttpServer }> {
  const h = await Harness.open();
  const app = buildApi(h.coordinator);
  t.after(async () => {
    await app.close();
    await h.close();
  });
  return { h, app };
}

/** GET /runs/:id/merges, checked against the schema the route declares. */
async function merges(app: HttpServer, runId: string): Promise<RunMerges> {
  const res = await app.inject({ method: 'GET', url: `/runs/${encodeURIComponent(runId)}/merges` });
  assert.equal(res.statusCode, 200, res.body);
  return parse(RunMerges, JSON.parse(res.body), 'merge rounds');
}

/** Each field of a listed round equals what the state recorded of it. */
function assertRecorded(h: Harness, view: RunMerges['rounds'][number]): void {
  const key = { runId: h.state.runs.list()[0].id, stage: view.stage, round: view.round };
  const recorded = h.state.mergeRounds.get(key)!;
  assert.deepEqual(
    { status: view.status, replicas: view.replicas, startedAt: view.startedAt, phaseAt: view.phaseAt, partitions: view.partitions, stateSaved: view.stateSaved },
    { status: recorded.status, replicas: recorded.replicas, startedAt: recorded.startedAt, phaseAt: recorded.plan.phaseAt, partitions: recorded.partitions, stateSaved: recorded.stateBlob !== null },
  );
  assert.equal(view.uploads, h.state.mergeRounds.uploads(key).length);
  assert.equal(view.results, h.state.mergeRounds.results(key).filter((r) => r.minerId !== RECOMPUTED).length);
}

test('an honest round of 2 stages × 2 replicas, listed per stage phase by phase as recorded; the next round is listed first and the last one stays', async (t) => {
  const { h, app } = await open(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const phases = async (): Promise<unknown[]> => (await merges(app, run.id)).rounds.map((r) => [r.round, r.stage, r.status, r.outcome, r.uploads, r.results]);

  let answer = await merges(app, run.id);
  assert.equal(answer.runId, run.id);
  assert.equal(answer.truncated, false);
  assert.deepEqual(await phases(), [
    [1, 0, 'uploading', 'pending', 0, 0],
    [1, 1, 'uploading', 'pending', 0, 0],
  ]);
  assert.deepEqual(answer.rounds[0].replicas, [a0.id, b0.id]);
  for (const r of answer.rounds) assertRecorded(h, r);
  // every replica uploads each partition, two mergers merge each
  const [p0, p1] = answer.rounds.map((r) => 2 * r.partitions);
  assert.deepEqual([answer.rounds[0].partitions, p1 > 0], [4, true]);

  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  assert.deepEqual(await phases(), [
    [1, 0, 'merging', 'pending', p0, 0],
    [1, 1, 'merging', 'pending', p1, 0],
  ]);
  await mergeAll(h, run, 0);
  await mergeAll(h, run, 1);
  h.tick();
  answer = await merges(app, run.id);
  assert.deepEqual(await phases(), [
    [1, 0, 'applying', 'agreed', p0, p0],
    [1, 1, 'applying', 'agreed', p1, p1],
  ]);
  for (const r of answer.rounds) assertRecorded(h, r);
  // every merger's results were applied: its merge units in the work log
  const work = h.work(run.id);
  for (const r of answer.rounds) {
    assert.equal(r.recomputed, 0);
    assert.deepEqual(r.mismatches, []);
    assert.equal(r.accepted.reduce((n, a) => n + a.partitions, 0), 2 * r.partitions, 'two mergers per partition');
    for (const a of r.accepted) assert.equal(work[`${h.nameOf(a.miner)}/merge`], a.partitions);
  }

  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
  answer = await merges(app, run.id);
  for (const r of answer.rounds) {
    assertRecorded(h, r);
    assert.deepEqual([r.status, r.outcome, r.stateSaved, r.workCollected], ['done', 'agreed', true, false]);
    assert.ok(r.phaseAt >= r.startedAt);
  }

  // the next round opens: listed first; round 1 stays (each stage's latest done round is kept)
  beatAll(...h.miners.values());
  trainMicrobatches(h, h.run(run.id), 4);
  h.tick();
  assert.deepEqual(await phases(), [
    [2, 0, 'uploading', 'pending', 0, 0],
    [2, 1, 'uploading', 'pending', 0, 0],
    [1, 0, 'done', 'agreed', p0, p0],
    [1, 1, 'done', 'agreed', p1, p1],
  ]);

  // round 2 is the run's final merge: once it is done round 1's work is collectable, and a collector pass after the run ended collects every round
  for (const stage of [0, 1]) await uploadAll(h, run, stage);
  h.tick();
  for (const stage of [0, 1]) await mergeAll(h, run, stage);
  h.tick();
  for (const stage of [0, 1]) await applyAll(h, run, stage, 2);
  h.tick();
  assert.equal(h.run(run.id).status, 'completed');
  answer = await merges(app, run.id);
  assert.deepEqual(
    answer.rounds.map((r) => [r.round, r.stage, r.status, r.workCollected]),
    [
      [2, 0, 'done', false],
      [2, 1, 'done', false],
      [1, 0, 'done', true],
      [1, 1, 'done', true],
    ],
  );
  h.advance(h.coordinator.gc.options.everyMs);
  h.tick();
  await h.coordinator.gc.settled();
  assert.deepEqual((await merges(app, run.id)).rounds, []);
});

test('a merger whose partition is not the merge of its inputs: the mismatch, the recomputation and whose partitions were applied, as the work log credits them', async (t) => {
  const { h, app } = await open(t);
  const run = runAtFirstMerge(h);
  const [a0, b0] = h.replicas(run.id, 0);
  const key = { runId: run.id, stage: 0, round: 1 };
  await uploadAll(h, run, 0);
  await uploadAll(h, run, 1);
  h.tick();
  // b0 merges partition 0 from its own slice alone, the rest honestly; a0 and stage 1 honestly
  await mergeAndUpload(h, a0, taskOf(a0));
  const task = taskOf(b0);
  const [job0, ...rest] = task.merge;
  await h.coordinator.mergeUploads.putMerged(b0.id, key, 0, await mergedFrame(h, b0, task, { ...job0, inputs: job0.inputs.filter((x) => x.minerId === b0.id) }));
  for (const job of rest) await h.coordinator.mergeUploads.putMerged(b0.id, key, job.partition, await mergedFrame(h, b0, task, job));
  await mergeAll(h, run, 1);

  // disputed: pending until the orchestrator's recomputation is in
  h.tick();
  let [s0, s1] = (await merges(app, run.id)).rounds;
  assert.deepEqual([s0.status, s0.outcome, s0.results, s0.recomputed], ['merging', 'pending', 8, 0]);
  assert.deepEqual([s1.status, s1.outcome], ['applying', 'agreed']);
  await h.coordinator.merges.settled();
  h.tick();

  [s0, s1] = (await merges(app, run.id)).rounds;
  assertRecorded(h, s0);
  assert.deepEqual([s0.round, s0.stage, s0.status, s0.outcome], [1, 0, 'applying', 'mismatch']);
  assert.deepEqual(s0.mismatches, [{ partition: 0, miner: b0.id }]);
  assert.equal(s0.recomputed, 1, 'only the disputed partition was merged by the orchestrator');
  assert.equal(s0.results, 8, "the orchestrator's own result is not counted");
  assert.deepEqual(
    s0.accepted,
    [
      { miner: a0.id, partitions: 4 },
      { miner: b0.id, partitions: 3 },
    ].sort((x, y) => (x.miner < y.miner ? -1 : 1)),
  );
  const work = h.work(run.id);
  assert.deepEqual([work[`${a0.name}/merge`], work[`${b0.name}/merge`], work[`${b0.name}/invalid`]], [4, 3, 1]);
  assert.deepEqual([s1.round, s1.stage, s1.outcome, s1.mismatches], [1, 1, 'agreed', []]);
});

/** A run of 2 stages × 1 replica whose merge rows the test writes by hand. */
function handRun(h: Harness): string {
  h.joinMany('m', 2);
  return h.createRun({ steps: 1000 }).id;
}

const plan = (over: Partial<RoundPlan>): RoundPlan => ({ mergers: [], chosen: null, phaseAt: 0, ...over });

test('hand-recorded rounds: each outcome, the counts and the times as recorded; a round before its stage\'s latest done one says its work is collected', async (t) => {
  const { h, app } = await open(t);
  const runId = handRun(h);
  const [a, b, c] = [newMinerId(), newMinerId(), newMinerId()].sort();
  const [x, y, z] = [sha('x'), sha('y'), sha('z')];
  const rounds = h.state.mergeRounds;
  // round 1 of stage 0: merged, its results collected (stage 0 has since finished round 2)
  rounds.open({ runId, stage: 0, round: 1 }, { status: 'done', partitions: 2, replicas: [a, b], plan: plan({ mergers: [[a, b], [a, b]], chosen: [x, y], phaseAt: 1_500 }), startedAt: 1_000 });
  rounds.update({ runId, stage: 0, round: 1 }, { stateBlob: z });
  // round 2 of stage 0: c's partition 1 is not the merge; partition 1 recomputed; a's and b's accepted
  const k2 = { runId, stage: 0, round: 2 };
  rounds.open(k2, { status: 'applying', partitions: 2, replicas: [a, b, c], plan: plan({ mergers: [[a, b], [b, c]], chosen: [x, y], phaseAt: 2_700 }), startedAt: 2_000 });
  for (const m of [a, b, c]) for (const p of [0, 1]) rounds.putUpload(k2, { minerId: m, partition: p, blob: sha(`${m}/${p}`), samples: 3, norm: 1 });
  rounds.putResult(k2, { partition: 0, minerId: a, blob: x });
  rounds.putResult(k2, { partition: 0, minerId: b, blob: x });
  rounds.putResult(k2, { partition: 1, minerId: b, blob: y });
  rounds.putResult(k2, { partition: 1, minerId: c, blob: z });
  rounds.putResult(k2, { partition: 1, minerId: RECOMPUTED, blob: y });
  h.state.runs.finishRound(runId, 0, 2, z);
  // stage 1: round 1 one replica (no merge, no state saved), round 2 closed with nothing merged, round 3 merging
  rounds.open({ runId, stage: 1, round: 1 }, { status: 'done', partitions: 0, replicas: [a], plan: plan({ chosen: [], phaseAt: 1_100 }), startedAt: 1_050 });
  rounds.open({ runId, stage: 1, round: 2 }, { status: 'done', partitions: 2, replicas: [b, c], plan: plan({ mergers: [[b, c], [b, c]], phaseAt: 2_100 }), startedAt: 2_050 });
  rounds.putUpload({ runId, stage: 1, round: 2 }, { minerId: b, partition: 0, blob: x, samples: 1, norm: 1 });
  rounds.open({ runId, stage: 1, round: 3 }, { status: 'merging', partitions: 2, replicas: [b, c], plan: plan({ mergers: [[b, c], [b, c]], phaseAt: 3_100 }), startedAt: 3_050 });
  rounds.putResult({ runId, stage: 1, round: 3 }, { partition: 0, minerId: b, blob: x });

  const answer = await merges(app, runId);
  const pick = (r: RunMerges['rounds'][number]): unknown[] => [r.round, r.stage, r.status, r.outcome, r.replicas.length, r.startedAt, r.phaseAt, r.partitions, r.uploads, r.results, r.recomputed, r.stateSaved, r.workCollected];
  assert.deepEqual(answer.rounds.map(pick), [
    [3, 1, 'merging', 'pending', 2, 3_050, 3_100, 2, 0, 1, 0, false, false],
    [2, 0, 'applying', 'mismatch', 3, 2_000, 2_700, 2, 6, 4, 1, false, false],
    [2, 1, 'done', 'abandoned', 2, 2_050, 2_100, 2, 1, 0, 0, false, false],
    [1, 0, 'done', 'collected', 2, 1_000, 1_500, 2, 0, 0, 0, true, true],
    [1, 1, 'done', 'single', 1, 1_050, 1_100, 0, 0, 0, 0, false, false],
  ]);
  const round2 = answer.rounds[1];
  assert.deepEqual(round2.replicas, [a, b, c]);
  assert.deepEqual(round2.mismatches, [{ partition: 1, miner: c }]);
  assert.deepEqual(round2.accepted, [
    { miner: a, partitions: 1 },
    { miner: b, partitions: 2 },
  ]);
  assert.deepEqual(answer.rounds[0].accepted, [], 'nothing is accepted before the partitions are chosen');
  assert.deepEqual(answer.rounds[0].mismatches, []);
});

test(`at most the ${MERGE_ROUNDS_SHOWN} newest rounds, by round then stage, and truncated says more are kept`, async (t) => {
  const { h, app } = await open(t);
  const runId = handRun(h);
  const m = newMinerId();
  for (let round = 1; round <= 110; round++) {
    for (const stage of [1, 0]) h.state.mergeRounds.open({ runId, stage, round }, { status: 'done', partitions: 0, replicas: [m], plan: plan({ chosen: [], phaseAt: round * 10 + 5 }), startedAt: round * 10 });
  }
  const answer = await merges(app, runId);
  assert.equal(answer.rounds.length, MERGE_ROUNDS_SHOWN);
  assert.equal(answer.truncated, true);
  const expected: [number, number][] = [];
  for (let round = 110; expected.length < MERGE_ROUNDS_SHOWN; round--) expected.push([round, 0], [round, 1]);
  assert.deepEqual(
    answer.rounds.map((r) => [r.round, r.stage]),
    expected,
  );
  assert.deepEqual([answer.rounds[0].startedAt, answer.rounds[0].phaseAt], [1_100, 1_105]);

  // another run lists none of them
  const other = handRun(h);
  assert.deepEqual(await merges(app, other), { runId: other, rounds: [], truncated: false });
});

test('an unknown run is 404 and a malformed id 400; the client reads the rounds over a socket and refuses an unknown run', async (t) => {
  const { h, app } = await open(t);
  const unknown = await app.inject({ method: 'GET', url: '/runs/r-nope/merges' });
  assert.equal(unknown.statusCode, 404);
  assert.deepEqual(JSON.parse(unknown.body), { error: 'unknown run r-nope', code: 'not_found' });
  assert.equal((await app.inject({ method: 'GET', url: '/runs/bad%20id/merges' })).statusCode, 400);

  const run = runAtFirstMerge(h);
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  assert.ok(address && typeof address === 'object');
  const client = new OrchestratorClient(`http://127.0.0.1:${address.port}`);
  const answer = await client.runMerges(run.id);
  assert.deepEqual(
    answer.rounds.map((r) => [r.round, r.stage, r.status]),
    [
      [1, 0, 'uploading'],
      [1, 1, 'uploading'],
    ],
  );
  await expectNimbleError(() => client.runMerges('r-nope'), 404, /unknown run r-nope/);
});
