// Whole flows of the coordinator tests, built from the fake miners of
// ./helpers.ts: training microbatches through a 2-stage run, and each phase
// of a merge round done by every replica of a stage as honest ones do it.
import assert from 'node:assert/strict';
import type { RunRecord } from '../../src/orchestrator/state/runs.ts';
import type { MergeTask } from '../../src/protocol/messages.ts';
import { completeMicrobatch, mergeAndUpload, roundKey, stageState, uploadPseudoGradient, type FakeMiner, type Harness } from './helpers.ts';

/** Each miner heartbeats twice: it knows its assignment, and has named it (is routed to). */
export function beatAll(...miners: FakeMiner[]): void {
  // twice: the first reply brings each its assignment, the second heartbeat says it holds it (only then is it routed to)
  for (let i = 0; i < 2; i++) for (const m of miners) m.beat();
}

/** The merge task of a miner's next heartbeat (asserted present). */
export function taskOf(m: FakeMiner): MergeTask {
  const task = m.beat().merge;
  assert.ok(task, `${m.name} has a merge task`);
  return task;
}

/**
 * Runs `count` microbatches through a 2-stage run: the stage-0 replicas take
 * them in turns, each goes on to the stage-1 replicas in turns. Returns their ids.
 */
export function trainMicrobatches(h: Harness, run: RunRecord, count: number): number[] {
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
export function runAtFirstMerge(h: Harness): RunRecord {
  h.joinMany('m', 4);
  const run = h.createRun({ steps: 8, mergeEvery: 2 });
  beatAll(...h.miners.values());
  trainMicrobatches(h, run, 4);
  h.tick();
  assert.equal(h.run(run.id).status, 'merging');
  return h.run(run.id);
}

/** Both replicas of `stage` upload their whole pseudo-gradient. */
export async function uploadAll(h: Harness, run: RunRecord, stage: number): Promise<void> {
  for (const [i, m] of h.replicas(run.id, stage).entries()) await uploadPseudoGradient(h, m, taskOf(m), 100 * stage + i);
}

/** Every merger of `stage` merges what its task says. */
export async function mergeAll(h: Harness, run: RunRecord, stage: number): Promise<void> {
  for (const m of h.replicas(run.id, stage)) await mergeAndUpload(h, m, taskOf(m));
}

/** A tick, then the orchestrator's recomputations of merged partitions it started (disputes, single mergers) end, then a tick to see them. */
export async function tickSettled(h: Harness): Promise<void> {
  h.tick();
  await h.coordinator.merges.settled();
  h.tick();
}

/**
 * Every replica reports the round applied; a stage's single replica, told to,
 * uploads its state first (a merged round's state is the orchestrator's,
 * written in the background). Returns the round's state blob.
 */
export async function applyAll(h: Harness, run: RunRecord, stage: number, round: number): Promise<string> {
  for (const m of h.replicas(run.id, stage)) {
    const task = taskOf(m);
    if (task.saveState) await h.coordinator.mergeUploads.putState(m.id, roundKey(m, task), await stageState(h, run.id, stage, round));
    m.applied = round;
    m.beat();
  }
  await h.coordinator.merges.settled();
  const blob = h.state.mergeRounds.get({ runId: run.id, stage, round })?.stateBlob;
  assert.ok(blob, `round ${round} of stage ${stage} has its state`);
  return blob;
}

/** The ids of every blob stored. */
export async function blobIds(h: Harness): Promise<string[]> {
  const out: string[] = [];
  for await (const id of h.blobs.list()) out.push(id);
  return out.sort();
}

/** One microbatch through a single-replica 2-stage run with a merge due after it, then its merge round (apply and save only). */
export async function trainOneRound(h: Harness, run: RunRecord, round: number): Promise<void> {
  beatAll(...h.replicas(run.id, 0), ...h.replicas(run.id, 1));
  trainMicrobatches(h, run, 1);
  h.tick();
  assert.equal(h.state.mergeRounds.get({ runId: run.id, stage: 0, round })?.status, 'applying');
  await applyAll(h, run, 0, round);
  await applyAll(h, run, 1, round);
  h.tick();
}

/** Trains a single-replica 2-stage run to its end: every step, then the final merge (apply and save only). Returns the microbatch ids. */
export async function trainToCompletion(h: Harness, run: RunRecord): Promise<number[]> {
  beatAll(...h.replicas(run.id, 0), ...h.replicas(run.id, 1));
  const ids = trainMicrobatches(h, run, run.steps);
  h.tick();
  await applyAll(h, run, 0, 1);
  await applyAll(h, run, 1, 1);
  h.tick();
  assert.equal(h.run(run.id).status, 'completed');
  return ids;
}

/** Merge round `round` of both stages, every phase done by every replica (the microbatches that make it due trained before). */
export async function mergeRoundAll(h: Harness, run: RunRecord, round: number): Promise<void> {
  h.tick();
  assert.equal(h.run(run.id).status, 'merging', `round ${round} opened`);
  for (const s of [0, 1]) await uploadAll(h, run, s);
  h.tick();
  for (const s of [0, 1]) await mergeAll(h, run, s);
  await tickSettled(h);
  for (const s of [0, 1]) await applyAll(h, run, s, round);
  h.tick();
  assert.deepEqual(h.state.runs.stages(run.id).map((s) => s.round), [round, round], `round ${round} done`);
}
