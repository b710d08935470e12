// A job's upgrade on a real Coordinator and JobService with fake miners and a
// clock the test moves (no child process, no network): what is refused while
// an upgrade is under way, deterministically (the end-to-end test in
// test/network/job-upgrade.test.ts cannot hold the first run open).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { JobService } from '../../../src/orchestrator/jobs/jobs.ts';
import { expectNimbleError, Harness, MODEL } from '../helpers.ts';

/** the job's owner and a stranger (addresses; the service is called as the routes call it, with the signer) */
const OWNER = '0x00000000000000000000000000000000000000d1';
const STRANGER = '0x00000000000000000000000000000000000000e2';

test('an upgrade under way: the run finishes early, a second upgrade and one by a stranger are refused, an impossible group is refused', async () => {
  const h = await Harness.open();
  after(() => h.close());
  const jobs = new JobService(h.coordinator, { checkpointRetentionMs: 60_000, slots: h.coordinator.slots }, () => h.now);
  const miners = h.joinMany('m', 4);
  const job = jobs.submit({ name: 'grow', model: MODEL, data: 'moby-dick', training: { steps: 100, batchSize: 2, mergeEvery: 10 } }, OWNER);
  const runId = h.state.jobs.get(job.id)!.runId;
  assert.ok(runId, 'the job has its run on one miner');
  const holder = miners.find((m) => m.beat().assignment?.runId === runId);
  assert.ok(holder, 'one miner holds the run');
  assert.ok(holder.take(2).length > 0, 'its miner takes microbatches');
  const created = h.run(runId).microbatchesCreated;

  await expectNimbleError(() => jobs.upgrade(job.id, OWNER, { stages: 2, replicas: 3 }), 409, /needs 6 miners and 4 are alive/);
  await expectNimbleError(() => jobs.upgrade(job.id, STRANGER, { stages: 2, replicas: 2 }), 403, /is not/);
  const up = jobs.upgrade(job.id, OWNER, { stages: 2, replicas: 2 });
  assert.deepEqual(up.upgrade, { stages: 2, replicas: 2 });
  assert.equal(h.run(runId).steps, created, 'the run stops at what it has issued');
  await expectNimbleError(() => jobs.upgrade(job.id, OWNER), 409, /already being upgraded to 2 stages × 2 replicas/);
  await expectNimbleError(() => jobs.upgradeAsOperator(job.id), 409, /already being upgraded/);
  assert.deepEqual(h.state.jobs.get(job.id)!.upgrade, { stages: 2, replicas: 2 }, 'the refused upgrades changed nothing');
});
