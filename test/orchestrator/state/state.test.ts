// The orchestrator's state layer without a server, on both engines (SQLite,
// and a real PostgreSQL started here from npm): migrations (including a
// file written by the single-schema layout of earlier versions, SQLite
// only, and a store at an older version migrated by its function steps on
// both), every store's transitions, and stored rows that no longer decode
// refused as corrupt state rather than cast.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Database from 'better-sqlite3';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { StateDb } from '../../../src/orchestrator/state/db.ts';
import { PgDriver } from '../../../src/orchestrator/state/pg-driver.ts';
import { MIGRATIONS, OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { MINER_MIGRATIONS, type MinerProfile } from '../../../src/orchestrator/state/miners.ts';
import { RUN_MIGRATIONS, type RunOptions } from '../../../src/orchestrator/state/runs.ts';
import type { Plan } from '../../../src/planner/types.ts';
import { startPostgres, type PostgresServer } from '../../helpers/postgres-server.ts';

const dir = mkdtempSync(join(tmpdir(), 'nimble-state-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
let pg: PostgresServer | undefined;
before(async () => {
  pg = await startPostgres();
});
after(async () => {
  await pg?.close();
});

type EngineName = 'sqlite' | 'postgres';
/** A new empty state on `engine`: a file path or a database URL to reopen it by. */
async function target(engine: EngineName): Promise<string> {
  return engine === 'sqlite' ? join(dir, `s${n++}.sqlite`) : await pg!.createDatabase();
}
async function openState(engine: EngineName): Promise<{ state: OrchestratorState; path: string }> {
  const path = await target(engine);
  return { state: OrchestratorState.open(path), path };
}

const OPTIONS: RunOptions = { lr: 1e-3, codec: 'f16', aggregator: 'mean', minMiners: 2, outerLr: 0.7, outerMomentum: 0.9, requestedStages: 2 };
const PLAN: Plan = {
  stages: [
    { range: { from: 0, to: 2 }, params: 10, flopsPerToken: { forward: 1, backward: 2 }, memoryBytes: 100, miners: ['0xa'], throughputTokensPerS: 5 },
    { range: { from: 2, to: 4 }, params: 12, flopsPerToken: { forward: 1, backward: 2 }, memoryBytes: 120, miners: ['0xb'], throughputTokensPerS: 4 },
  ],
  bottleneckTokensPerS: 4,
  unassigned: [],
};
const isCorrupt = (err: unknown): boolean => err instanceof NimbleError && err.code === 'corrupt' && err.status === 500;
test('a file from the single-schema layout migrates: the created count moves out of the options JSON', () => {
  const path = join(dir, 'old.sqlite');
  const old = new Database(path);
  old.exec(`CREATE TABLE runs (
    id TEXT PRIMARY KEY, model TEXT NOT NULL, data TEXT NOT NULL, status TEXT NOT NULL,
    steps INTEGER NOT NULL, batch_size INTEGER NOT NULL, merge_every INTEGER NOT NULL, seed INTEGER NOT NULL,
    stage_count INTEGER NOT NULL, plan TEXT NOT NULL, options TEXT NOT NULL,
    microbatches_done INTEGER NOT NULL DEFAULT 0, merges_done INTEGER NOT NULL DEFAULT 0,
    tokens_done INTEGER NOT NULL DEFAULT 0, bytes_sent INTEGER NOT NULL DEFAULT 0, last_loss REAL,
    created_at INTEGER NOT NULL, started_at INTEGER, finished_at INTEGER, error TEXT)`);
  old.prepare(`INSERT INTO runs (id, model, data, status, steps, batch_size, merge_every, seed, stage_count, plan, options, created_at)
    VALUES ('r-old', 'gpt-micro', 'moby-dick', 'executing', 50, 4, 10, 1, 2, ?, ?, 1)`).run(JSON.stringify(PLAN), JSON.stringify({ ...OPTIONS, created: 7 }));
  old.close();
  const state = OrchestratorState.open(path);
  const run = state.runs.get('r-old')!;
  assert.equal(run.microbatchesCreated, 7);
  assert.deepEqual(run.options, OPTIONS, 'no created count left in the options');
  assert.deepEqual(run.plan, PLAN);
  state.close();
});

test('a miners table from before backends were recorded migrates: its miners read back as wasm, no adapter, not software', () => {
  const path = join(dir, 'miners-old.sqlite');
  const old = new Database(path);
  const before = MINER_MIGRATIONS.steps.length - 1;
  for (const step of MINER_MIGRATIONS.steps.slice(0, before)) {
    assert.equal(typeof step, 'string');
    old.exec(step as string);
  }
  old.exec(`CREATE TABLE schema_versions (store TEXT PRIMARY KEY, version INTEGER NOT NULL); INSERT INTO schema_versions VALUES ('miners', ${before})`);
  old.prepare(`INSERT INTO miners (id, name, url, gflops, threads, memory_bytes, bandwidth_mbps, joined_at, last_seen, session_key, serve) VALUES ('0xold', 'old', 'http://127.0.0.1:1', 5, 1, 1024, 10, 1, 2, 'k', 'training')`).run();
  old.close();
  const state = OrchestratorState.open(path);
  assert.equal(state.db.versions().miners, MINER_MIGRATIONS.steps.length);
  const m = state.miners.get('0xold')!;
  assert.deepEqual([m.name, m.serve, m.backend, m.adapter, m.softwareAdapter], ['old', 'training', 'wasm', null, false]);
  state.close();
});

for (const engine of ['sqlite', 'postgres'] as const) {
  describe(engine, () => {
    test('a new file gets every store at its latest version; reopening runs nothing again', async () => {
      const { state, path } = await openState(engine);
      const expected = Object.fromEntries(MIGRATIONS.map((m) => [m.store, m.steps.length]));
      assert.deepEqual(state.db.versions(), expected);
      state.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 5, batchSize: 2, mergeEvery: 3, seed: 1, options: OPTIONS }, 10);
      state.close();
      const again = OrchestratorState.open(path);
      assert.deepEqual(again.db.versions(), expected);
      assert.equal(again.runs.get('r1')!.steps, 5);
      again.close();
    });

    test('a runs table at version 1 migrates through its function step: the created count moves out of the options JSON', async () => {
      const path = await target(engine);
      const old = new StateDb(engine === 'sqlite' ? path : new PgDriver(path), [{ store: 'runs', steps: RUN_MIGRATIONS.steps.slice(0, 1) }]);
      const insert = `INSERT INTO runs (id, model, data, status, steps, batch_size, merge_every, seed, stage_count, plan, options, created_at)
        VALUES (?, 'gpt-micro', 'moby-dick', 'executing', 50, 4, 10, 1, 2, ?, ?, 1)`;
      old.run(insert, 'r-old', JSON.stringify(PLAN), JSON.stringify({ ...OPTIONS, created: 7 }));
      old.run(insert, 'r-none', JSON.stringify(PLAN), JSON.stringify(OPTIONS));
      assert.equal(old.versions().runs, 1);
      old.close();
      const state = OrchestratorState.open(path);
      assert.equal(state.db.versions().runs, RUN_MIGRATIONS.steps.length);
      assert.deepEqual(state.runs.list().map((r) => [r.id, r.microbatchesCreated, r.options]), [
        ['r-old', 7, OPTIONS],
        ['r-none', 0, OPTIONS],
      ]);
      state.close();
    });

    test('transactions: a throw rolls everything back; a nested one that throws undoes only its own work', async () => {
      const { state } = await openState(engine);
      const blob = (c: string): string => c.repeat(64);
      assert.throws(() => state.tx(() => {
        state.garbage.condemn([blob('a')], 1);
        throw new Error('boom');
      }), /boom/);
      assert.equal(state.garbage.count(), 0);
      const out = state.tx(() => {
        state.garbage.condemn([blob('b')], 1);
        assert.throws(() => state.tx(() => {
          state.garbage.condemn([blob('c')], 1);
          throw new Error('inner');
        }), /inner/);
        state.garbage.condemn([blob('d')], 2);
        return 'kept';
      });
      assert.equal(out, 'kept');
      assert.deepEqual(state.garbage.due(10, 10), [blob('b'), blob('d')]);
      state.close();
    });

    test('a file written by a newer build is refused, not misread', async () => {
      const { state, path } = await openState(engine);
      state.db.run("UPDATE schema_versions SET version = 99 WHERE store = 'runs'");
      state.close();
      assert.throws(() => OrchestratorState.open(path), (err: unknown) => isCorrupt(err) && /newer than this build/.test((err as Error).message));
    });
  
    const MINER: MinerProfile = { id: '0xa', name: 'm1', url: 'http://127.0.0.1:1', gflops: 10, threads: 2, memoryBytes: 1 << 30, bandwidthMbps: 100, sessionKey: 'k1' };
    const backendOf = (state: OrchestratorState, id: string): unknown => {
      const m = state.miners.get(id)!;
      return { backend: m.backend, adapter: m.adapter, softwareAdapter: m.softwareAdapter };
    };

    test('miners: the backend, the GPU adapter and whether it is a software one are stored at join and replaced by a rejoin; a join without them is wasm, no adapter, not software', async () => {
      const { state, path } = await openState(engine);
      state.miners.upsert({ ...MINER, backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true }, 10);
      state.miners.upsert({ ...MINER, id: '0xb', name: 'm2' }, 11);
      assert.deepEqual(backendOf(state, '0xa'), { backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true });
      assert.deepEqual(backendOf(state, '0xb'), { backend: 'wasm', adapter: null, softwareAdapter: false });
      // a rejoin (after an eviction, too) takes what it says now
      state.miners.evict('0xa', 'test');
      state.miners.upsert({ ...MINER, backend: 'webgpu', adapter: 'NVIDIA GeForce RTX 4090', softwareAdapter: false }, 20);
      assert.deepEqual(backendOf(state, '0xa'), { backend: 'webgpu', adapter: 'NVIDIA GeForce RTX 4090', softwareAdapter: false });
      assert.equal(state.miners.get('0xa')!.evicted, null);
      state.miners.upsert({ ...MINER, id: '0xb', name: 'm2', backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true }, 21);
      state.close();
      // it survives a restart; a rejoin that says nothing of them is wasm again
      const again = OrchestratorState.open(path);
      assert.deepEqual(backendOf(again, '0xb'), { backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true });
      assert.deepEqual(again.miners.list().map((m) => [m.id, m.backend, m.adapter, m.softwareAdapter]), [
        ['0xa', 'webgpu', 'NVIDIA GeForce RTX 4090', false],
        ['0xb', 'webgpu', 'SwiftShader driver', true],
      ]);
      again.miners.upsert({ ...MINER, id: '0xb', name: 'm2' }, 30);
      assert.deepEqual(backendOf(again, '0xb'), { backend: 'wasm', adapter: null, softwareAdapter: false });
      again.close();
    });

    test('runs: waiting → started → executing ⇄ merging → completed, with counters', async () => {
      const { state } = await openState(engine);
      state.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 5, batchSize: 2, mergeEvery: 3, seed: 1, options: OPTIONS }, 10);
      let run = state.runs.get('r1')!;
      assert.equal(run.status, 'waiting');
      assert.equal(run.plan, null);
      assert.equal(run.stageCount, 0);
      state.runs.setMessage('r1', 'waiting for miners: 1 of 2 available');
      assert.equal(state.runs.get('r1')!.message, 'waiting for miners: 1 of 2 available');
      state.runs.start('r1', PLAN, 20);
      run = state.runs.get('r1')!;
      assert.equal(run.status, 'started');
      assert.equal(run.stageCount, 2);
      assert.deepEqual(run.plan, PLAN);
      assert.equal(run.startedAt, 20);
      assert.equal(run.message, null);
      state.runs.start('r1', PLAN, 30);
      assert.equal(state.runs.get('r1')!.startedAt, 20, 'a re-plan keeps the first start');
      state.runs.setStatus('r1', 'executing');
      state.runs.addCounters('r1', { microbatches: 2, tokens: 64, bytes: 1000 });
      state.runs.addCounters('r1', { bytes: 24, merges: 1 });
      state.runs.setCreated('r1', 3);
      state.runs.recordLoss('r1', 2.5);
      state.runs.complete('r1', 40);
      run = state.runs.get('r1')!;
      assert.deepEqual(
        [run.status, run.microbatchesDone, run.tokensDone, run.bytesSent, run.mergesDone, run.microbatchesCreated, run.lastLoss, run.finishedAt],
        ['completed', 2, 64, 1024, 1, 3, 2.5, 40],
      );
      assert.deepEqual(state.runs.active(), []);
    });

    test('stages and assignments: merging → training after a round; a miner holds one stage of an active run', async () => {
      const { state } = await openState(engine);
      state.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 5, batchSize: 2, mergeEvery: 3, seed: 1, options: OPTIONS }, 10);
      state.runs.insertStages('r1', [{ from: 0, to: 2 }, { from: 2, to: 4 }]);
      state.runs.addInnerStep('r1');
      state.runs.addInnerStep('r1');
      state.runs.startMerging('r1', 1);
      assert.deepEqual(state.runs.stages('r1').map((s) => [s.mode, s.innerSteps]), [['training', 2], ['merging', 2]]);
      const blob = 'ab'.repeat(32);
      state.runs.finishRound('r1', 1, 1, blob);
      assert.deepEqual(state.runs.stage('r1', 1), { runId: 'r1', stage: 1, fromPart: 2, toPart: 4, mode: 'training', round: 1, stateBlob: blob, innerSteps: 0, lastLoss: null });
      state.runs.assign('r1', 0, '0xa', 1);
      state.runs.assign('r1', 1, '0xa', 2); // moves
      assert.deepEqual(state.runs.assignments('r1'), [{ runId: 'r1', stage: 1, minerId: '0xa', assignedAt: 2 }]);
      assert.equal(state.runs.assignmentOf('0xa')!.stage, 1);
      state.runs.complete('r1', 3);
      assert.equal(state.runs.assignmentOf('0xa'), undefined, 'a completed run holds nobody');
    });

    test('microbatches: pending → issued → (pending again) → done, with the path and progress', async () => {
      const { state } = await openState(engine);
      const id = state.microbatches.insert('r1', 4, 4);
      state.microbatches.issue(id, '0xa', 100, 200);
      let mb = state.microbatches.get(id)!;
      assert.deepEqual([mb.status, mb.minerId, mb.path, mb.attempts, mb.deadline], ['issued', '0xa', ['0xa'], 1, 200]);
      assert.deepEqual(state.microbatches.issuedTo('0xa').map((m) => m.id), [id]);
      state.microbatches.recordHop(id, 0b01, ['0xa', '0xb'], null);
      state.microbatches.recordHop(id, 0b11, ['0xa', '0xb'], 3.25);
      state.microbatches.requeue(id);
      mb = state.microbatches.get(id)!;
      assert.deepEqual([mb.status, mb.minerId, mb.deadline, mb.loss], ['pending', null, null, 3.25]);
      assert.equal(state.microbatches.count('r1', 'pending'), 1);
      state.microbatches.issue(id, '0xc', 300, 400);
      state.microbatches.complete(id, 0b1111, ['0xc', '0xd'], 2.75);
      mb = state.microbatches.get(id)!;
      assert.deepEqual([mb.status, mb.progress, mb.attempts, mb.path, mb.loss], ['done', 0b1111, 2, ['0xc', '0xd'], 2.75]);
    });

    test('merge rounds: open, advance, uploads and results replace earlier ones from the same miner', async () => {
      const { state } = await openState(engine);
      const k = { runId: 'r1', stage: 0, round: 1 };
      const blob = (c: string): string => c.repeat(64);
      state.mergeRounds.open(k, { status: 'uploading', partitions: 2, replicas: ['0xa', '0xb'], plan: { mergers: [['0xa', '0xb'], ['0xb', '0xa']], chosen: null, phaseAt: 5 }, startedAt: 5 });
      state.mergeRounds.putUpload(k, { minerId: '0xa', partition: 0, blob: blob('1'), samples: 10, norm: 1.5 });
      state.mergeRounds.putUpload(k, { minerId: '0xa', partition: 0, blob: blob('2'), samples: 11, norm: 2.5 });
      assert.deepEqual(state.mergeRounds.uploads(k), [{ minerId: '0xa', partition: 0, blob: blob('2'), samples: 11, norm: 2.5 }]);
      state.mergeRounds.update(k, { status: 'merging', replicas: ['0xa'] });
      state.mergeRounds.putResult(k, { partition: 1, minerId: '0xa', blob: blob('3') });
      state.mergeRounds.update(k, { status: 'applying', plan: { mergers: [['0xa'], ['0xa']], chosen: [blob('3'), blob('3')], phaseAt: 9 }, stateBlob: blob('4') });
      const r = state.mergeRounds.get(k)!;
      assert.deepEqual([r.status, r.replicas, r.plan.chosen, r.plan.phaseAt, r.stateBlob], ['applying', ['0xa'], [blob('3'), blob('3')], 9, blob('4')]);
      assert.deepEqual(state.mergeRounds.results(k), [{ partition: 1, minerId: '0xa', blob: blob('3') }]);
      assert.equal(state.mergeRounds.get({ ...k, round: 2 }), undefined);
    });

    test('the ledger: work totals, epochs open → settling → settled, rewards and slashes', async () => {
      const { state } = await openState(engine);
      state.ledger.logWork({ minerId: '0xa', runId: 'r1', kind: 'forward', stage: 0 }, 1);
      state.ledger.logWork({ minerId: '0xa', runId: 'r1', kind: 'forward', units: 2, stage: 0 }, 1);
      state.ledger.logWork({ minerId: '0xb', runId: null, kind: 'invalid', detail: 'x'.repeat(2000) }, 1);
      assert.deepEqual(state.ledger.workTotals(), [
        { minerId: '0xa', kind: 'forward', units: 3 },
        { minerId: '0xb', kind: 'invalid', units: 1 },
      ]);
      assert.deepEqual(state.ledger.workTotals('r1'), [{ minerId: '0xa', kind: 'forward', units: 3 }]);
      const open = state.ledger.openEpoch(5);
      assert.equal(state.ledger.openEpoch(6).id, open.id, 'one open epoch at a time');
      assert.equal(state.ledger.lastWorkId(), 3);
      assert.deepEqual(state.ledger.workBetween(1, 3).map((w) => w.units), [2, 1]);
      state.ledger.putReward({ epoch: open.id, miner: '0xa', score: 3, amount: 10n ** 20n, units: { forward: 3 } });
      state.ledger.closeEpoch(open.id, { runId: 'r1', mergesMark: 1, toLog: 3, closedAt: 7, emission: 10n ** 20n, remainder: 0n, settled: false });
      assert.equal(state.ledger.epoch(open.id)!.status, 'settling');
      assert.equal(state.ledger.openEpoch(8).fromLog, 3, 'the next epoch starts after the closed one');
      assert.equal(state.ledger.runMergesMark('r1'), 1);
      state.ledger.setChainEpoch(open.id, 12n, 31337);
      state.ledger.setEpochError(open.id, 'rpc down', 1, 1009);
      assert.deepEqual([state.ledger.epoch(open.id)!.attempts, state.ledger.epoch(open.id)!.retryAt], [1, 1009]);
      assert.equal(state.ledger.maxChainEpoch(), 12n);
      state.ledger.markSettled(open.id, '0xdead', 9);
      const e = state.ledger.epoch(open.id)!;
      assert.deepEqual([e.status, e.txHash, e.settledAt, e.error, e.chainEpoch, e.emission], ['settled', '0xdead', 9, null, '12', '100000000000000000000']);
      assert.deepEqual(state.ledger.rewards(open.id), [{ epoch: open.id, miner: '0xa', score: 3, amount: '100000000000000000000', units: { forward: 3 } }]);
  
      state.ledger.putSlash({ epoch: open.id, miner: '0xa', checkId: 7, fraction: 0.05, reason: 'r7' });
      state.ledger.putSlash({ epoch: open.id, miner: '0xa', checkId: 7, fraction: 0.5, reason: 'again' });
      state.ledger.putSlash({ epoch: open.id, miner: '0xa', checkId: 8, fraction: 0.05, reason: 'r8' });
      const [first, second] = state.ledger.slashes({ status: 'pending' });
      assert.deepEqual([first.checkId, second.checkId, first.fraction], [7, 8, 0.05], 'once per failed check');
      state.ledger.setSlashAmount(first.id, 5n);
      state.ledger.setSlashAmount(first.id, null, 'stake fell');
      assert.deepEqual([state.ledger.slashes()[0].amount, state.ledger.slashes()[0].error], [null, 'stake fell']);
      state.ledger.setSlashError(first.id, 'rpc down', 3, 4321);
      assert.deepEqual([state.ledger.slashes()[0].attempts, state.ledger.slashes()[0].retryAt], [3, 4321]);
      state.ledger.markSlashed(first.id, '0xbeef', 4n);
      assert.equal(state.ledger.slashes()[0].retryAt, null);
      state.ledger.skipSlash(second.id, 'nothing staked');
      const s = state.ledger.slashes({ epoch: open.id })[0];
      assert.deepEqual([s.status, s.txHash, s.amount, s.error, s.failed], ['slashed', '0xbeef', '4', null, 1]);
      assert.deepEqual(state.ledger.slashes({ status: 'pending' }), []);
    });

    test('datasets in the free store (each at least a minimum, paid ones not) and build probes (non-finite deviations kept finite)', async () => {
      const { state } = await openState(engine);
      state.datasets.add({ sha256: 'a'.repeat(64), owner: '0xA', bytes: 10, retentionMs: 100 }, 1);
      state.datasets.add({ sha256: 'b'.repeat(64), owner: '0xa', bytes: 5000, retentionMs: 100 }, 1);
      assert.equal(state.datasets.freeBytes(1, 1000), 6000);
      state.datasets.keep('b'.repeat(64), '0xA', 500);
      state.datasets.keep('b'.repeat(64), '0xA', 400); // never shortened
      assert.deepEqual([state.datasets.freeBytes(1, 1000), state.datasets.heldBy('b'.repeat(64), '0xa')!.keptUntil, state.datasets.countOf('0xa')], [1000, 500, 2]);
      assert.deepEqual(state.datasets.expired(450, 10).map((d) => d.sha256), ['a'.repeat(64)], 'kept until 500: not expired at 450');
      state.buildProbes.put({ sha256: 'c'.repeat(64), ranges: [{ from: 0, to: 1, oneMinusCosine: 1e-14, normDeviation: Infinity }], refused: 'too far' }, 7);
      assert.deepEqual(state.buildProbes.get('c'.repeat(64)), { sha256: 'c'.repeat(64), ranges: [{ from: 0, to: 1, oneMinusCosine: 1e-14, normDeviation: Number.MAX_VALUE }], refused: 'too far', probedAt: 7 });
      state.buildProbes.forget('c'.repeat(64));
      assert.deepEqual(state.buildProbes.list(), []);
    });

    test('claims: one row per hop and claimant, written once; attempts kept apart', async () => {
      const { state } = await openState(engine);
      const sha = 'c'.repeat(64);
      const claim = { microbatch: 3, attempt: 1, stage: 1, phase: 'forward' as const, minerId: '0xa', nextId: '0xb', inputSha: sha, outputSha: null, loss: null, round: 2, at: 5, bytes: 640 };
      assert.equal(state.claims.put(claim), true);
      assert.equal(state.claims.put({ ...claim, outputSha: 'd'.repeat(64), at: 6 }), false, 'a repeat changes nothing');
      assert.equal(state.claims.put({ ...claim, minerId: '0xz' }), true, 'another claimant of the same hop is its own row');
      assert.equal(state.claims.put({ ...claim, attempt: 2, at: 7 }), true);
      assert.deepEqual(state.claims.ofHop(3, 1, 1, 'forward').map((c) => [c.minerId, c.outputSha]), [['0xa', null], ['0xz', null]]);
      assert.deepEqual(state.claims.ofAttempt(3, 2).map((c) => c.at), [7]);
      state.claims.put({ ...claim, microbatch: 4, at: 1 });
      assert.equal(state.claims.deleteBefore(6, [4], 100), 2, 'the claims of microbatch 4 are kept');
      assert.deepEqual(state.claims.ofAttempt(3, 1), []);
      assert.equal(state.claims.ofAttempt(3, 2).length, 1);
      assert.equal(state.claims.ofAttempt(4, 1).length, 1);
    });

    test('spot checks: asked → passed | failed; the timeout counts from delivery and restarts; figures that are not finite stored as null', async () => {
      const { state } = await openState(engine);
      const id = state.spotChecks.ask({ runId: 'r1', microbatch: 3, attempt: 2, stage: 1, minerId: '0xa', createdAt: 10 });
      assert.equal(state.spotChecks.asked('0xa', 'r1', 3)!.id, id);
      assert.deepEqual(state.spotChecks.deliveredBefore(1e12), [], 'not delivered yet: no timeout runs');
      state.spotChecks.markDelivered([id], 20);
      state.spotChecks.markDelivered([id], 30);
      assert.equal(state.spotChecks.openOf('0xa')[0].deliveredAt, 20, 'the first delivery counts');
      state.spotChecks.restartTimeouts(50);
      assert.deepEqual(state.spotChecks.deliveredBefore(50).map((c) => c.id), []);
      assert.deepEqual(state.spotChecks.deliveredBefore(51).map((c) => c.id), [id]);
      state.spotChecks.decide(id, { status: 'failed', cosine: 0, normRatio: Infinity, detail: 'all zeros' }, 12);
      const c = state.spotChecks.list()[0];
      assert.deepEqual([c.status, c.attempt, c.cosine, c.normRatio, c.decidedAt], ['failed', 2, 0, null, 12]);
      assert.equal(state.spotChecks.asked('0xa', 'r1', 3), undefined);
      assert.deepEqual(state.spotChecks.openOf('0xa'), []);
      assert.deepEqual(state.spotChecks.totals('r1'), [{ minerId: '0xa', status: 'failed', n: 1 }]);
    });

    test('rows that no longer decode are corrupt state (500), never cast', async () => {
      const { state } = await openState(engine);
      state.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 5, batchSize: 2, mergeEvery: 3, seed: 1, options: OPTIONS }, 10);
      state.db.run("UPDATE runs SET plan = '{\"stages\": 3}' WHERE id = 'r1'");
      assert.throws(() => state.runs.get('r1'), (err: unknown) => isCorrupt(err) && /plan of r1/.test((err as Error).message));
      state.db.run("UPDATE runs SET plan = 'null', options = 'not json' WHERE id = 'r1'");
      assert.throws(() => state.runs.get('r1'), (err: unknown) => isCorrupt(err) && /options of r1: not JSON/.test((err as Error).message));
      state.db.run("UPDATE runs SET options = ?, status = 'exploded' WHERE id = 'r1'", JSON.stringify(OPTIONS));
      assert.throws(() => state.runs.get('r1'), (err: unknown) => isCorrupt(err) && /stored run is invalid: \/status/.test((err as Error).message));
      const id = state.microbatches.insert('r1', 0, 0);
      state.db.run("UPDATE microbatches SET path = '[1, 2]' WHERE id = ?", id);
      assert.throws(() => state.microbatches.get(id), isCorrupt);
      state.ledger.logWork({ minerId: '0xa', runId: 'r1', kind: 'forward' }, 1);
      state.db.run("UPDATE work_log SET kind = 'bribe'");
      assert.throws(() => state.ledger.workTotals(), isCorrupt);
      state.miners.upsert(MINER, 10);
      state.db.run("UPDATE miners SET backend = 'cuda' WHERE id = '0xa'");
      assert.throws(() => state.miners.get('0xa'), (err: unknown) => isCorrupt(err) && /\/backend/.test((err as Error).message));
    });
  });
}
