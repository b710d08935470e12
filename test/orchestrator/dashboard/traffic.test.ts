// The traffic between a run's stages (src/orchestrator/dashboard/traffic.ts,
// in the runs section of src/orchestrator/dashboard/sections.ts): the
// microbatches that crossed each boundary (forward units of stage s, backward
// units of stage s + 1, from the work log) × the payload bytes of one
// microbatch's activation frame at the run's codec; per second over about
// the last minute; computed again at most every 2 s.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { DashboardSections as Schemas, type DashboardRun } from '../../../src/api/dashboard.ts';
import { DashboardSections } from '../../../src/orchestrator/dashboard/sections.ts';
import { activationFrame, TRAFFIC_EVERY_MS } from '../../../src/orchestrator/dashboard/traffic.ts';
import { beatAll, trainMicrobatches } from '../flows.ts';
import { CONFIG, Harness, MODEL, OWNER } from '../helpers.ts';

const harnesses: Harness[] = [];
after(async () => {
  for (const h of harnesses) await h.close();
});
const runsCheck = TypeCompiler.Compile(Schemas.runs);

async function open(): Promise<Harness> {
  const h = await Harness.open();
  harnesses.push(h);
  return h;
}

function runOf(sections: DashboardSections, id: string): DashboardRun {
  const runs = sections.runs();
  assert.ok(runsCheck.Check(runs), 'the runs section matches its schema');
  return runs.find((r) => r.id === id)!;
}

test('one microbatch frame: f32 4n, f16 2n, int8-row 4·rows + n bytes of [batch × context, d_model]; none for an MLP', () => {
  const rows = 3 * CONFIG.contextLength;
  const n = rows * CONFIG.channels;
  assert.deepEqual(activationFrame(MODEL, 3, 'f32'), { shape: [rows, CONFIG.channels], bytes: 4 * n });
  assert.deepEqual(activationFrame(MODEL, 3, 'f16'), { shape: [rows, CONFIG.channels], bytes: 2 * n });
  assert.deepEqual(activationFrame(MODEL, 3, 'int8-row'), { shape: [rows, CONFIG.channels], bytes: 4 * rows + n });
  // gpt-tiny: batch 8 × context 64 rows of 128 values at f16
  assert.equal(activationFrame('gpt-tiny', 8, 'f16')!.bytes, 8 * 64 * 128 * 2);
  assert.equal(activationFrame('mlp:4096-64-2', 8, 'f16'), null);
  assert.equal(activationFrame('no such model', 8, 'f16'), null);
});

test('a 2-stage run trained for real: the microbatches done × the frame, each way; the rate over the time since the first look; null once it ended', async () => {
  const h = await open();
  h.joinMany('m', 2);
  const run = h.coordinator.createRun({ model: MODEL, data: 'moby-dick', steps: 100, stages: 2, batchSize: 2, codec: 'int8-row' }, OWNER);
  beatAll(...h.replicas(run.id, 0), ...h.replicas(run.id, 1));
  const sections = new DashboardSections(h.coordinator, null, false, () => h.now);
  const frame = 4 * (2 * CONFIG.contextLength) + 2 * CONFIG.contextLength * CONFIG.channels;

  let t = runOf(sections, run.id).traffic!;
  assert.deepEqual(t, {
    codec: 'int8-row',
    shape: [2 * CONFIG.contextLength, CONFIG.channels],
    frameBytes: frame,
    boundaries: [{ from: 0, forwardMicrobatches: 0, backwardMicrobatches: 0, forwardBytes: 0, backwardBytes: 0, forwardBytesPerSecond: null, backwardBytesPerSecond: null }],
  });

  trainMicrobatches(h, h.run(run.id), 3);
  assert.equal(runOf(sections, run.id).traffic!.boundaries[0].forwardMicrobatches, 0, 'not computed again within 2 s');
  h.advance(10_000);
  t = runOf(sections, run.id).traffic!;
  assert.equal(h.run(run.id).microbatchesDone, 3);
  assert.deepEqual(t.boundaries, [
    { from: 0, forwardMicrobatches: 3, backwardMicrobatches: 3, forwardBytes: 3 * frame, backwardBytes: 3 * frame, forwardBytesPerSecond: (3 * frame) / 10, backwardBytesPerSecond: (3 * frame) / 10 },
  ]);

  h.coordinator.cancelRun(run.id, OWNER);
  h.advance(TRAFFIC_EVERY_MS);
  assert.equal(runOf(sections, run.id).traffic, null, 'an ended run has none');
});

test('3 stages: boundary s counts the forwards of stage s and the backwards of stage s + 1 on that run only; the rate is over about the last minute', async () => {
  const h = await open();
  h.joinMany('m', 3);
  const run = h.createRun({ stages: 3, batchSize: 4 });
  assert.equal(h.run(run.id).stageCount, 3);
  const sections = new DashboardSections(h.coordinator, null, false, () => h.now);
  const frame = activationFrame(MODEL, 4, h.run(run.id).options.codec)!.bytes;
  const m = h.replicas(run.id, 0)[0].id;
  const log = (stage: number, kind: 'forward' | 'backward' | 'dropped', units: number, runId: string | null = run.id): void => {
    for (let i = 0; i < units; i++) h.state.ledger.logWork({ minerId: m, runId, kind, stage }, h.now);
  };
  log(0, 'forward', 5);
  log(1, 'backward', 4);
  log(1, 'forward', 7);
  log(2, 'backward', 6);
  log(0, 'backward', 100); // stage 0's backward sends nothing on
  log(2, 'forward', 100); // the last stage's forward computes the loss
  log(0, 'dropped', 100);
  log(0, 'forward', 100, 'another-run');
  const counts = (r: DashboardRun): number[][] => r.traffic!.boundaries.map((b) => [b.from, b.forwardMicrobatches, b.backwardMicrobatches, b.forwardBytes, b.backwardBytes]);
  assert.deepEqual(counts(runOf(sections, run.id)), [
    [0, 5, 4, 5 * frame, 4 * frame],
    [1, 7, 6, 7 * frame, 6 * frame],
  ]);

  // rates: from the look 30 s ago; then, a minute on, from the mark a minute old
  h.advance(30_000);
  log(0, 'forward', 3);
  log(2, 'backward', 6);
  let b = runOf(sections, run.id).traffic!.boundaries;
  assert.equal(b[0].forwardBytesPerSecond, (3 * frame) / 30);
  assert.equal(b[0].backwardBytesPerSecond, 0);
  assert.equal(b[1].backwardBytesPerSecond, (6 * frame) / 30);
  h.advance(60_000);
  log(1, 'forward', 12);
  b = runOf(sections, run.id).traffic!.boundaries;
  assert.equal(b[0].forwardBytesPerSecond, 0, 'the 3 forwards of 60 s ago are out of the window');
  assert.equal(b[1].forwardBytesPerSecond, (12 * frame) / 60);
  assert.equal(b[0].forwardMicrobatches, 8);
  // nobody looked for 10 minutes: no rate until a few seconds were watched again
  h.advance(600_000);
  b = runOf(sections, run.id).traffic!.boundaries;
  assert.equal(b[1].forwardBytesPerSecond, null);
  assert.equal(b[1].forwardMicrobatches, 19);
});
