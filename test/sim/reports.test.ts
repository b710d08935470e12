// When the orchestrator hears of a done hop (src/sim/flow.ts, ./host-miner.ts):
// reports ride heartbeats, a report lost with its miner gets its microbatch
// re-issued, and on a shared host a miner's thread handles what reached it in
// the order of Node's event loop.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { localOptions, type LocalNetwork } from '../../src/sim/calibrate.ts';
import { noticed } from '../../src/sim/control.ts';
import { receiptReaches, reported } from '../../src/sim/flow.ts';
import { afterWork, beat, reply } from '../../src/sim/host-miner.ts';
import type { SimMicrobatch } from '../../src/sim/types.ts';
import { World } from '../../src/sim/world.ts';

const miner = (name: string): LocalNetwork['miners'][number] => ({ name, gflops: 40, memoryBytes: 8e9, bandwidthMbps: 1e5, threads: 1 });
const net: LocalNetwork = { miners: [miner('a'), miner('b')], model: 'gpt-tiny', stages: 2, batchSize: 12, mergeEvery: 1e9 };
const jobTimes = { referenceGflops: 40, stages: [{ forwardMs: 30, backwardMs: 50 }, { forwardMs: 70, backwardMs: 0 }] };
const host = { cores: 2, hopOverheadMs: [0, 0], orchestratorMsPerMicrobatch: 4 };

/** A world of two miners, a 2-stage pipeline, and one microbatch issued along a → b with every hop done. */
function worldWithDoneMicrobatch(shared: boolean): { w: World; mb: SimMicrobatch } {
  const w = new World(localOptions(net, { jobTimes, ...(shared ? { host } : {}) }));
  const [a, b] = [w.addMiner(), w.addMiner()];
  a.stage = 0;
  b.stage = 1;
  w.members = [new Set([a.index]), new Set([b.index])];
  const mb: SimMicrobatch = { id: 0, attempt: 1, status: 'issued', path: [a.index, b.index], holder: a.index, backwardFrom: 0, hopDoneAt: [100, 80], reportedHops: 0 };
  w.microbatches.push(mb);
  w.issued.add(mb.id);
  w.issuedTo.set(a.index, 1);
  return { w, mb };
}

test('a hop done by a miner that leaves before the heartbeat that would carry its report is never counted; the microbatch is re-issued when the orchestrator notices, charged to it', () => {
  const { w, mb } = worldWithDoneMicrobatch(false);
  const b = w.miners[1];
  const beatAfterHop = w.heartbeatAfter(b, mb.hopDoneAt[1]);
  // b leaves just before that heartbeat: the report of its hop goes with it
  b.alive = false;
  b.leftAt = beatAfterHop - 1;
  w.now = beatAfterHop + 1;
  reported(w, mb.id, mb.attempt);
  assert.equal(mb.status, 'issued', 'not counted done');
  assert.equal(w.counters.done, 0);
  noticed(w, b);
  assert.equal(mb.status, 'pending');
  assert.deepEqual(w.pending, [mb.id]);
  assert.equal(w.counters.droppedUnits, 1, 'charged to the miner that left');

  // the same, but b leaves after that heartbeat: its report went out, the microbatch is done, nobody is charged
  const again = worldWithDoneMicrobatch(false);
  const b2 = again.w.miners[1];
  b2.alive = false;
  b2.leftAt = again.w.heartbeatAfter(b2, again.mb.hopDoneAt[1]) + 1;
  reported(again.w, again.mb.id, again.mb.attempt);
  assert.equal(again.mb.status, 'done');
  noticed(again.w, b2);
  assert.equal(again.w.counters.droppedUnits, 0);
});

test('shared host: a receipt that reaches a miner during its job is noted when the job ends, before the heartbeat that came due meanwhile goes out; an idle miner notes it at once', () => {
  const { w } = worldWithDoneMicrobatch(true);
  const b = w.miners[1];
  w.host!.start(b.index, 100, 0); // b computes
  receiptReaches(w, b, { mb: 0, attempt: 1 });
  assert.deepEqual(b.unreported, [], 'not handled while the job runs');
  beat(w, b); // its heartbeat timer fires during the job: deferred
  assert.equal(b.beatDue, true);
  w.now = 100;
  w.host!.stop(b.index, 100);
  afterWork(w, b);
  assert.equal(b.beatSentAt, 100, 'the heartbeat went out when the job ended');
  assert.deepEqual(b.unreported, [], 'with the receipt\'s report');
  assert.equal(w.microbatches[0].reportedHops, 1);

  const a = w.miners[0];
  receiptReaches(w, a, { mb: 0, attempt: 1 });
  assert.deepEqual(a.unreported, [{ mb: 0, attempt: 1 }]);
});

test('shared host: a miner that leaves with a receipt read but not sent, or come but not yet read, loses that report: the microbatch is re-issued, charged to it', () => {
  for (const pending of ['unreported', 'receiptsDue'] as const) {
    const { w, mb } = worldWithDoneMicrobatch(true);
    const b = w.miners[1];
    b[pending].push({ mb: mb.id, attempt: mb.attempt });
    b.alive = false;
    b.leftAt = 10;
    noticed(w, b);
    assert.equal(mb.status, 'pending', pending);
    assert.equal(w.counters.droppedUnits, 1, pending);
  }
});

test("shared host: a miner's heartbeats keep their period from the request, not from the handled reply", () => {
  const { w } = worldWithDoneMicrobatch(true);
  const a = w.miners[0];
  const hb = w.options.heartbeatMs;
  const nextBeat = (): number => {
    let at = Infinity;
    for (let e = w.events.pop(); e; e = w.events.pop()) if (e.event.type === 'beat' && e.event.miner === a.index) at = Math.min(at, e.at);
    return at;
  };
  w.now = 1000;
  beat(w, a);
  w.now = 1000 + 120; // the reply is handled 120 ms later
  reply(w, a);
  assert.equal(nextBeat(), 1000 + hb);
  // a reply that took longer than the period: the next request goes at once
  w.now = 2000;
  beat(w, a);
  w.now = 2000 + hb + 40;
  reply(w, a);
  assert.equal(nextBeat(), 2000 + hb + 40);
});
