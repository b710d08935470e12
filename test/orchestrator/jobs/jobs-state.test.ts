// The jobs store: the history is appended in order; an ended job's
// checkpoints expire after its retention (an injected clock), are deleted by
// the collector with their blobs condemned, and `keep` extends them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { stateTarget } from '../helpers.ts';

const DAY = 86_400_000;
const spec = { name: 'j', model: 'gpt-micro' as const, data: 'moby-dick', training: { steps: 10 } };

async function setup(): Promise<OrchestratorState> {
  const state = OrchestratorState.open(await stateTarget());
  state.jobs.insert({ id: 'job-0000000000000001', owner: '0x' + '1'.repeat(40), spec, steps: 10, timeoutMs: 1000, idleTimeoutMs: 1000, checkpointEvery: 5, retentionMs: 3 * DAY }, 100);
  return state;
}

test('status changes and messages are appended in order with their times', async () => {
  const state = await setup();
  state.jobs.move('job-0000000000000001', 'started', 'placed', 200);
  state.jobs.note('job-0000000000000001', 'halfway', 300);
  state.jobs.move('job-0000000000000001', 'completed', 'done', 400);
  const events = state.jobs.events('job-0000000000000001');
  assert.deepEqual(events.map((e) => [e.seq, e.at, e.kind, e.status]), [[1, 100, 'status', 'waiting'], [2, 200, 'status', 'started'], [3, 300, 'message', 'started'], [4, 400, 'status', 'completed']]);
  assert.deepEqual(state.jobs.events('job-0000000000000001', 2).map((e) => e.seq), [3, 4]);
  const job = state.jobs.get('job-0000000000000001')!;
  assert.equal(job.startedAt, 200);
  assert.equal(job.endedAt, 400);
});

test('an ended job keeps why it ended as its message: a later note (its final checkpoint, kept in the background) is an event only', async () => {
  const state = await setup();
  const id = 'job-0000000000000001';
  state.jobs.move(id, 'started', 'placed', 200);
  state.jobs.note(id, 'checkpoint at step 5 kept', 300, 'checkpoint');
  assert.equal(state.jobs.get(id)!.message, 'checkpoint at step 5 kept', 'a running job shows its latest note');
  state.jobs.move(id, 'timed_out', 'past its wall-clock limit', 400);
  state.jobs.note(id, 'checkpoint at step 8 kept', 500, 'checkpoint');
  assert.equal(state.jobs.get(id)!.message, 'past its wall-clock limit');
  assert.deepEqual(state.jobs.events(id).slice(-2).map((e) => [e.kind, e.status, e.message]), [['status', 'timed_out', 'past its wall-clock limit'], ['checkpoint', 'timed_out', 'checkpoint at step 8 kept']]);
});

test("an ended job's checkpoints are kept for the retention, then collected with their blobs condemned; keep extends them", async () => {
  const state = await setup();
  const id = 'job-0000000000000001';
  const blob = (n: number): string => String(n).repeat(64).slice(0, 64);
  assert.ok(state.jobs.addCheckpoint({ jobId: id, step: 5, tokens: 80, loss: 3, blob: blob(1), bytes: 10 }, 150));
  assert.ok(!state.jobs.addCheckpoint({ jobId: id, step: 5, tokens: 80, loss: 3, blob: blob(2), bytes: 10 }, 151), 'one checkpoint per step');
  assert.equal(state.jobs.checkpoints(id)[0].expiresAt, null, 'kept while the job runs');
  assert.deepEqual(state.jobs.deleteExpiredCheckpoints(10 * DAY, 10), []);
  state.jobs.move(id, 'completed', 'done', 1000);
  assert.ok(state.jobs.addCheckpoint({ jobId: id, step: 10, tokens: 160, loss: 2, heldoutLoss: 0.0412, heldoutAccuracy: 0.9873, blob: blob(3), bytes: 10 }, 1001));
  // the held-out figures measured when it was kept (none for the first)
  assert.deepEqual(state.jobs.checkpoints(id).map((c) => [c.loss, c.heldoutLoss, c.heldoutAccuracy]), [[3, null, null], [2, 0.0412, 0.9873]]);
  assert.deepEqual(state.jobs.checkpoints(id).map((c) => c.expiresAt), [1000 + 3 * DAY, 1000 + 3 * DAY], 'one kept after the end expires with the others');
  assert.deepEqual(state.jobs.deleteExpiredCheckpoints(1000 + 3 * DAY - 1, 10), [], 'kept until its expiry');
  state.jobs.extendRetention(id, 1000 + 5 * DAY);
  assert.deepEqual(state.jobs.deleteExpiredCheckpoints(1000 + 3 * DAY, 10), [], 'kept longer');
  assert.deepEqual(state.jobs.deleteExpiredCheckpoints(1000 + 5 * DAY, 10), [blob(1), blob(3)]);
  assert.ok(!state.jobs.referencesBlob(blob(1)));
  assert.equal(state.jobs.checkpoints(id).length, 0);
});
