// The order in which a simulated miner takes its queued jobs (src/sim/flow.ts
// tryStart), as the real miner's pipeline does (src/miner/pipeline.ts
// nextJob): one forward, one backward (1F1B).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { localOptions, type LocalNetwork } from '../../src/sim/calibrate.ts';
import { tryStart } from '../../src/sim/flow.ts';
import type { Job, SimMiner } from '../../src/sim/types.ts';
import { World } from '../../src/sim/world.ts';

const miner = (name: string): LocalNetwork['miners'][number] => ({ name, gflops: 40, memoryBytes: 8e9, bandwidthMbps: 1e5, threads: 1 });
const net: LocalNetwork = { miners: [miner('a'), miner('b')], model: 'gpt-tiny', stages: 2, batchSize: 12, mergeEvery: 1e9 };
const jobTimes = { referenceGflops: 40, stages: [{ forwardMs: 30, backwardMs: 50 }, { forwardMs: 70, backwardMs: 0 }] };

/** Ends m's job as `computed` would (a backward frees its slot), then lets it take the next: what it took. */
function next(m: SimMiner, w: World): Job | null {
  if (m.job?.kind === 'backward') m.held.delete(m.job.mb);
  m.job = null;
  m.busyUntil = -1;
  tryStart(w, m);
  return m.job;
}

test('a stage-0 replica with its slots full takes a returning backward, then the forward waiting for that slot, then the next backward (1F1B)', () => {
  const w = new World(localOptions(net, { jobTimes }));
  const slots = w.options.slots;
  const [a, b] = [w.addMiner(), w.addMiner()];
  a.stage = 0;
  b.stage = 1;
  w.members = [new Set([a.index]), new Set([b.index])];
  for (let id = 0; id <= slots + 1; id++) {
    w.microbatches.push({ id, attempt: 1, status: 'issued', path: [a.index, b.index], holder: a.index, backwardFrom: 2, hopDoneAt: [], reportedHops: 0 });
    w.issued.add(id);
  }
  // its slots hold microbatches 0 … slots − 1; microbatch `slots` waits to start; two gradients come back
  for (let id = 0; id < slots; id++) a.held.add(id);
  a.queue.push({ kind: 'start', mb: slots, attempt: 1 }, { kind: 'backward', mb: 0, attempt: 1 }, { kind: 'backward', mb: 1, attempt: 1 });
  a.job = { kind: 'forward', mb: slots - 1, attempt: 1 };
  const taken = [next(a, w), next(a, w), next(a, w), next(a, w)].map((j) => (j ? `${j.kind} ${j.mb}` : 'idle'));
  assert.deepEqual(taken, ['backward 0', `start ${slots}`, 'backward 1', 'idle']);
  // backwards alone first when no slot is free: the start waits
  const c = w.addMiner();
  c.stage = 0;
  for (let id = 0; id < slots; id++) c.held.add(id);
  c.lastWasBackward = true;
  c.queue.push({ kind: 'start', mb: slots, attempt: 1 }, { kind: 'backward', mb: 2, attempt: 1 });
  assert.equal(next(c, w)?.kind, 'backward');
});
