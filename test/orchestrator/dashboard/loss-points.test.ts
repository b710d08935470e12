// The dashboard's loss curves on disk (src/orchestrator/state/loss-points.ts)
// under the memory copy the feed samples into
// (src/orchestrator/dashboard/loss-history.ts): what was written survives
// closing and reopening the SQLite file, the bounds hold on disk as in memory
// (thinned past 10,000 points, at most 256 curves), rows that are not valid
// are never served, and a history built on the reopened file answers what
// the one before the restart answered.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { zeroAddress } from 'viem';
import { LossHistory } from '../../../src/api/dashboard.ts';
import { DEFAULT_LOSS_LIMITS, LossHistories } from '../../../src/orchestrator/dashboard/loss-history.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { thinnedSteps } from '../../../src/orchestrator/state/loss-points.ts';
import type { RunOptions } from '../../../src/orchestrator/state/runs.ts';
import { createHttpServer, type HttpServer } from '../../../src/http/server.ts';
import { dashboardFeedOf, dashboardRoutes } from '../../../src/orchestrator/routes/dashboard.ts';
import { Harness } from '../helpers.ts';

const dir = mkdtempSync(join(tmpdir(), 'nimble-loss-points-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const newPath = (): string => join(dir, `s${n++}.sqlite`);
const validCurve = TypeCompiler.Compile(LossHistory);
const loss = (step: number): number => 5 * Math.exp(-step / 3000) + 1.5;

test('points and statuses written survive closing and reopening the file; a history on the reopened file answers the same curves', () => {
  const path = newPath();
  const state = OrchestratorState.open(path);
  const h = new LossHistories(DEFAULT_LOSS_LIMITS, state.lossPoints);
  h.status('run:r1', 'pending', 1_000);
  h.status('run:r1', 'executing', 2_000);
  for (let step = 1; step <= 30; step++) {
    h.record('run:r1', step * 10, loss(step), 1000 + step, 2_000 + step * 1_000);
    if (step % 10 === 0) h.flush();
  }
  h.status('job:j1', 'queued', 500);
  h.record('job:j1', 1, 4.5, 12.5, 600);
  h.record('job:j1', 2, 4.25, 0, 700);
  h.flush();
  const before = { run: h.get('run:r1'), job: h.get('job:j1') };
  assert.equal(before.run.points.length, 30);
  state.close();

  const reopened = OrchestratorState.open(path);
  const stored = reopened.lossPoints.curve('run:r1');
  assert.deepEqual(stored.points, before.run.points);
  assert.deepEqual(stored.statuses, before.run.statuses);
  assert.equal(stored.skipped, 0);
  const again = new LossHistories(DEFAULT_LOSS_LIMITS, reopened.lossPoints);
  assert.equal(again.size, 2);
  assert.deepEqual(again.get('run:r1'), before.run);
  assert.deepEqual(again.get('job:j1'), before.job);
  assert.ok(validCurve.Check(again.get('run:r1')));
  assert.deepEqual(again.get('run:nope'), { key: 'run:nope', points: [], statuses: [] });
  assert.deepEqual(again.drain(), [], 'what was stored is history, not news for the live stream');

  // the curve goes on where it stopped: an old step is still refused, the same status not noted twice
  assert.equal(again.record('run:r1', 300, 1, 1, 40_000), false);
  assert.equal(again.record('run:r1', 310, 1.9, 900, 41_000), true);
  again.status('run:r1', 'executing', 41_000);
  again.status('run:r1', 'completed', 42_000);
  again.flush();
  reopened.close();
  const third = OrchestratorState.open(path);
  const curve = new LossHistories(DEFAULT_LOSS_LIMITS, third.lossPoints).get('run:r1');
  assert.equal(curve.points.length, 31);
  assert.deepEqual(curve.points[30], [310, 1.9, 900, 41_000]);
  assert.deepEqual(curve.statuses.map((s) => s.status), ['pending', 'executing', 'completed'], 'the timeline knows the statuses seen before the restart');
  third.close();
});

test('past 10,000 points the older half is thinned, on disk exactly as in memory, over restarts too', () => {
  const path = newPath();
  const state = OrchestratorState.open(path);
  const h = new LossHistories(DEFAULT_LOSS_LIMITS, state.lossPoints);
  // a burst (as the bench fills a curve) and then a point a second
  for (let step = 1; step <= 10_000; step++) h.record('run:long', step, loss(step), 1000, step);
  h.flush();
  assert.equal(state.lossPoints.count('run:long'), 10_000);
  for (let step = 10_001; step <= 25_000; step++) {
    h.record('run:long', step, loss(step), 1000, step);
    if (step % 7 === 0) h.flush();
  }
  h.flush();
  const mem = h.get('run:long');
  assert.ok(mem.points.length <= 10_000 && mem.points.length >= 5_000, String(mem.points.length));
  assert.equal(mem.points[mem.points.length - 1][0], 25_000, 'the newest point is kept');
  assert.deepEqual(state.lossPoints.curve('run:long').points, mem.points);
  state.close();
  const reopened = OrchestratorState.open(path);
  const again = new LossHistories(DEFAULT_LOSS_LIMITS, reopened.lossPoints);
  assert.deepEqual(again.get('run:long'), mem);
  // thinning goes on the same way after the restart
  for (let step = 25_001; step <= 40_000; step++) {
    h.record('run:long', step, loss(step), 1000, step);
    again.record('run:long', step, loss(step), 1000, step);
  }
  again.flush();
  assert.deepEqual(again.get('run:long'), h.get('run:long'));
  assert.deepEqual(reopened.lossPoints.curve('run:long').points, again.get('run:long').points);

  // the store's own rule: the same thinning, whoever wrote past the bound
  reopened.lossPoints.write([{ key: 'run:raw', touched: 1, points: Array.from({ length: 12_001 }, (_, i) => [i, 1, 0, i] as [number, number, number, number]), dropped: [], statuses: [] }], [], { maxPoints: 20_000, maxSeries: 256 });
  assert.equal(reopened.lossPoints.count('run:raw'), 12_001);
  const dropped = reopened.lossPoints.thin('run:raw', 10_000);
  assert.deepEqual(dropped, thinnedSteps(Array.from({ length: 12_001 }, (_, i) => i), 10_000));
  assert.equal(reopened.lossPoints.count('run:raw'), 12_001 - dropped.length);
  assert.ok(reopened.lossPoints.count('run:raw') <= 10_000);
  reopened.close();
});

test('at most 256 curves on disk: the least recently touched are dropped, and the order survives a restart', () => {
  const path = newPath();
  const state = OrchestratorState.open(path);
  const h = new LossHistories(DEFAULT_LOSS_LIMITS, state.lossPoints);
  for (let i = 0; i < 300; i++) {
    h.status(`job:j${i}`, 'queued', i);
    h.record(`job:j${i}`, 1, 3, 0, i);
  }
  h.record('job:j50', 2, 2.5, 0, 1_000); // touched last: kept over older ones
  h.flush();
  assert.equal(h.size, 256);
  const keys = state.lossPoints.curves().map((c) => c.key);
  assert.equal(keys.length, 256);
  assert.equal(keys[keys.length - 1], 'job:j50');
  assert.ok(!keys.includes('job:j0') && !keys.includes('job:j43') && keys.includes('job:j44'));
  assert.deepEqual(state.lossPoints.curve('job:j0'), { points: [], statuses: [], skipped: 0 }, 'a dropped curve leaves no rows');
  state.close();

  const reopened = OrchestratorState.open(path);
  const again = new LossHistories(DEFAULT_LOSS_LIMITS, reopened.lossPoints);
  assert.equal(again.size, 256);
  again.record('job:new', 1, 1, 0, 2_000);
  again.flush();
  const later = reopened.lossPoints.curves().map((c) => c.key);
  assert.equal(later.length, 256);
  assert.ok(!later.includes('job:j44') && later.includes('job:j45'), 'the least recently touched before the restart is the one forgotten after it');
  assert.ok(later.includes('job:j50') && later.includes('job:new'));
  // the store holds the cap on its own too
  assert.deepEqual(reopened.lossPoints.trim(255), ['job:j45']);
  reopened.close();
});

test('rows that are not valid are never served: not a number, infinite, negative, a bad key', () => {
  const path = newPath();
  const state = OrchestratorState.open(path);
  const h = new LossHistories(DEFAULT_LOSS_LIMITS, state.lossPoints);
  for (let step = 1; step <= 5; step++) h.record('run:bad', step, 2, 10, 100 * step);
  h.status('run:bad', 'executing', 50);
  h.flush();
  // NaN cannot be stored in a REAL NOT NULL column (SQLite makes it NULL): a damaged file could still hold these
  const id = (state.db.sql.prepare("SELECT id FROM loss_curves WHERE curve = 'run:bad'").get() as { id: number }).id;
  const insert = state.db.sql.prepare('INSERT INTO loss_points (curve_id, step, loss, tokens_per_second, at) VALUES (?, ?, ?, ?, ?)');
  assert.throws(() => insert.run(id, 6, Number.NaN, 0, 600), /NOT NULL/);
  insert.run(id, 7, 'NaN', 0, 700);
  insert.run(id, 8, Number.POSITIVE_INFINITY, 0, 800);
  insert.run(id, 9, 1, -5, 900);
  insert.run(id, 10, 1, 0, -1);
  insert.run(id, -3, 1, 0, 100);
  insert.run(id, 11, 1, 'fast', 1_100);
  state.db.sql.prepare('INSERT INTO loss_statuses (curve_id, seq, at, status) VALUES (?, ?, ?, ?)').run(id, 99, 'later', 'done');
  state.db.sql.prepare('INSERT INTO loss_curves (curve, touched) VALUES (?, ?)').run('<script>', 1);
  state.close();

  const reopened = OrchestratorState.open(path);
  const stored = reopened.lossPoints.curve('run:bad');
  assert.equal(stored.skipped, 7);
  assert.deepEqual(stored.points.map((p) => p[0]), [1, 2, 3, 4, 5]);
  const again = new LossHistories(DEFAULT_LOSS_LIMITS, reopened.lossPoints);
  assert.equal(again.size, 1, 'a key that is not a curve is not one');
  const curve = again.get('run:bad');
  assert.ok(validCurve.Check(curve));
  assert.deepEqual(curve.points, h.get('run:bad').points);
  assert.deepEqual(curve.statuses, [{ at: 50, status: 'executing' }]);
  // the memory copy never hands the store a point it would refuse
  assert.equal(again.record('run:bad', 12, Number.NaN, 0, 1), false);
  reopened.close();
});

test('statuses: the first and the newest 63 kept, on disk as in memory', () => {
  const path = newPath();
  const state = OrchestratorState.open(path);
  const h = new LossHistories(DEFAULT_LOSS_LIMITS, state.lossPoints);
  for (let i = 0; i < 150; i++) {
    h.status('job:flip', i % 2 ? 'running' : 'waiting', i);
    if (i % 40 === 0) h.flush();
  }
  h.flush();
  const mem = h.get('job:flip').statuses;
  assert.equal(mem.length, 64);
  assert.equal(mem[0].at, 0);
  assert.equal(mem[63].at, 149);
  state.close();
  const reopened = OrchestratorState.open(path);
  assert.deepEqual(reopened.lossPoints.curve('job:flip').statuses, mem);
  reopened.close();
});

test('the orchestrator restarts: GET /runs/:id/loss answers the curve and the timeline it answered before', async () => {
  const harness = await Harness.open();
  const options: RunOptions = { lr: 1e-3, codec: 'f16', aggregator: 'mean', minMiners: 1, outerLr: 0.7, outerMomentum: 0.9, requestedStages: 1 };
  harness.state.runs.insert({ id: 'r-restart', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 500, batchSize: 2, mergeEvery: 3, seed: 1, options }, harness.now);
  const serve = async (): Promise<{ app: HttpServer; loss: () => Promise<unknown> }> => {
    const app = createHttpServer({ bodyLimit: 1 << 20 });
    dashboardRoutes(app, harness.coordinator, { jobs: null, paid: false, webRoot: dir, operatorAddress: zeroAddress });
    await app.ready();
    return { app, loss: async () => JSON.parse((await app.inject({ method: 'GET', url: '/runs/r-restart/loss' })).body) as unknown };
  };
  try {
    const first = await serve();
    const feed = dashboardFeedOf(first.app)!;
    feed.step(); // the feed notes the run's status, and writes it
    for (let step = 1; step <= 200; step++) feed.losses.record('run:r-restart', step, loss(step), 900, 1_000 + step);
    const before = await first.loss();
    assert.equal((before as { points: unknown[] }).points.length, 200);
    assert.equal((before as { statuses: unknown[] }).statuses.length, 1);
    await first.app.close(); // the feed writes what it has not yet written as it closes
    await harness.restart();
    const second = await serve();
    assert.deepEqual(await second.loss(), before);
    await second.app.close();
  } finally {
    await harness.close();
  }
});

test('without a store the history is memory only, as before', () => {
  const h = new LossHistories({ maxPoints: 4, maxSeries: 1 });
  for (let step = 1; step <= 9; step++) h.record('run:m', step, 1, 0, step);
  h.flush();
  assert.ok(h.get('run:m').points.length <= 4);
  h.record('run:other', 1, 1, 0, 1);
  assert.deepEqual(h.get('run:m').points, []);
});
