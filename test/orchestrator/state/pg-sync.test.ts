// The synchronous PostgreSQL bridge (src/orchestrator/state/pg-sync.ts) and
// the driver on it (pg-driver.ts), against a real server started here: how
// values come back, SQL errors (the connection stays usable), a server that
// is not there, a connection the server drops (replaced outside a
// transaction, never inside one), a call that takes too long, nested
// transactions rolled back, a COMMIT PostgreSQL turns into a ROLLBACK, and
// close() ending the session.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { PgDriver } from '../../../src/orchestrator/state/pg-driver.ts';
import { PgSyncConnection } from '../../../src/orchestrator/state/pg-sync.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { freePort, startPostgres, type PostgresServer } from '../../helpers/postgres-server.ts';

let server: PostgresServer;
before(async () => {
  server = await startPostgres();
});
after(async () => {
  await server?.close();
});

const isError = (code: string, re: RegExp) => (err: unknown): boolean => err instanceof NimbleError && err.code === code && re.test(err.message);
const pid = (c: PgSyncConnection): number => (c.query({ text: 'SELECT pg_backend_pid() AS pid' }).rows[0] as { pid: number }).pid;

test('values: int8 and numeric as numbers (an int8 past 2^53 stays text), booleans as 1/0, floats and text as they are', async () => {
  const c = new PgSyncConnection(await server.createDatabase());
  try {
    const row = c.query({
      text: 'SELECT $1::int8 AS big, 9007199254740993::int8 AS huge, COUNT(*) AS n, SUM(x) AS s, 0.1::float8 AS f, EXISTS (SELECT 1) AS yes, 1 = 2 AS no, $2::text AS t FROM (VALUES (1::int8), (2)) v(x)',
      values: [1_700_000_000_123, 'é ? text'],
    }).rows[0];
    assert.deepEqual(row, { big: 1_700_000_000_123, huge: '9007199254740993', n: 2, s: 3, f: 0.1, yes: 1, no: 0, t: 'é ? text' });
    assert.deepEqual(c.query({ text: 'SELECT 1 AS a, $1::text AS b', values: [null], array: true }).rows, [[1, null]]);
  } finally {
    c.close();
  }
});

test('a SQL error names the statement and its SQLSTATE; the connection goes on', async () => {
  const c = new PgSyncConnection(await server.createDatabase());
  try {
    const before = pid(c);
    assert.throws(() => c.query({ text: 'SELECT missing_column FROM pg_class WHERE relname = $1', values: ['x'] }), isError('internal', /^PostgreSQL refused SELECT missing_column FROM pg_class.*does not exist \(42703\)$/));
    assert.throws(() => c.query({ text: `SELEC ${'x'.repeat(200)}` }), (err: unknown) => err instanceof NimbleError && /refused SELEC x{74}…: syntax error/.test(err.message));
    assert.equal(pid(c), before, 'the same session');
  } finally {
    c.close();
  }
});

test('a server that is not there: unavailable, naming host:port and not the password', async () => {
  const port = await freePort();
  assert.throws(
    () => new PgSyncConnection(`postgres://u:secret-pw@127.0.0.1:${port}/nowhere`, { timeoutMs: 5_000 }),
    (err: unknown) => isError('unavailable', new RegExp(`PostgreSQL at 127\\.0\\.0\\.1:${port}/nowhere is unavailable: .*ECONNREFUSED`))(err) && !/secret-pw/.test((err as Error).message) && (err as NimbleError).status === 503,
  );
});

test('a dropped connection: the call fails as unavailable, the next one outside a transaction gets a new session', async () => {
  const c = new PgSyncConnection(await server.createDatabase());
  try {
    const first = pid(c);
    assert.throws(() => c.query({ text: 'SELECT pg_terminate_backend(pg_backend_pid())' }), isError('unavailable', /is unavailable: terminating connection/));
    const second = pid(c);
    assert.notEqual(second, first);
    // dropped from outside while idle: noticed on the next call, which still runs
    await server.admin('SELECT pg_terminate_backend($1)', [second]);
    await new Promise((r) => setTimeout(r, 100));
    let third: number | undefined;
    try {
      third = pid(c);
    } catch (err) {
      assert.ok(isError('unavailable', /unavailable/)(err), String(err));
      third = pid(c);
    }
    assert.notEqual(third, second);
  } finally {
    c.close();
  }
});

test('a connection dropped inside a transaction is not replaced until it ends: its work is gone, never half-committed', async () => {
  const url = await server.createDatabase();
  const d = new PgDriver(url);
  try {
    d.exec('CREATE TABLE t (k TEXT PRIMARY KEY)');
    const insert = d.prepare('INSERT INTO t (k) VALUES (?)');
    assert.throws(
      () =>
        d.transaction(() => {
          insert.run('a');
          assert.throws(() => d.prepare('SELECT pg_terminate_backend(pg_backend_pid())').get(), isError('unavailable', /terminating connection/));
          // the transaction's session is gone: the next statement in it fails rather than run on a new session
          insert.run('b');
        }),
      isError('unavailable', /lost inside a transaction/),
    );
    assert.equal(d.inTransaction, false);
    assert.deepEqual(d.prepare('SELECT k FROM t ORDER BY k').all(), []);
    insert.run('c');
    assert.deepEqual(d.prepare('SELECT k FROM t ORDER BY k').all(), [{ k: 'c' }]);
  } finally {
    d.close();
  }
});

test('transactions: commit, rollback on a throw, nested ones as savepoints; a caught SQL error makes COMMIT throw, not pass', async () => {
  const d = new PgDriver(await server.createDatabase());
  try {
    d.exec('CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER NOT NULL)');
    const insert = d.prepare('INSERT INTO t (k, n) VALUES (?, ?)');
    const keys = (): unknown[] => d.prepare('SELECT k FROM t ORDER BY k').raw(true).all().map((r) => (r as unknown[])[0]);
    assert.equal(d.transaction(() => insert.run('a', 1).changes), 1);
    assert.throws(() => d.transaction(() => {
      insert.run('b', 1);
      throw new Error('boom');
    }), /boom/);
    d.transaction(() => {
      insert.run('c', 1);
      // a nested transaction that throws undoes its own work, twice deep
      assert.throws(() => d.transaction(() => {
        insert.run('d', 1);
        d.transaction(() => insert.run('e', 1));
        throw new Error('inner');
      }), /inner/);
      // a nested one that fails in SQL leaves the outer one usable
      assert.throws(() => d.transaction(() => insert.run('a', 2)), isError('internal', /duplicate key.*\(23505\)/));
      insert.run('f', 1);
    });
    assert.deepEqual(keys(), ['a', 'c', 'f']);
    // a SQL error caught without a nested transaction aborts the whole one on PostgreSQL: COMMIT says so
    assert.throws(() => d.transaction(() => {
      insert.run('g', 1);
      assert.throws(() => insert.run('a', 3), /duplicate key/);
    }), isError('internal', /rolled the transaction back/));
    assert.deepEqual(keys(), ['a', 'c', 'f']);
    assert.throws(() => d.transaction(() => Promise.resolve(1)), /cannot return a promise/);
    assert.deepEqual(keys(), ['a', 'c', 'f']);
  } finally {
    d.close();
  }
});

test('a call past its timeout gives the connection up: unavailable now and after', async () => {
  // the limit also bounds the connection's start (a worker thread and a connect): 1.5 s, so that a busy machine still connects in time
  const c = new PgSyncConnection(await server.createDatabase(), { timeoutMs: 1_500 });
  const t0 = performance.now();
  assert.throws(() => c.query({ text: 'SELECT pg_sleep(10)' }), isError('unavailable', /did not answer within 1500 ms: SELECT pg_sleep\(10\)/));
  assert.ok(performance.now() - t0 < 6_000);
  assert.ok(c.isClosed);
  assert.throws(() => c.query({ text: 'SELECT 1' }), isError('unavailable', /timed out/));
  c.close();
});

test('close() ends the session and the worker; calls after it are refused', async () => {
  const url = await server.createDatabase();
  const name = new URL(url).pathname.slice(1);
  const c = new PgSyncConnection(url);
  const sessions = async (): Promise<number> => Number((await server.admin('SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = $1', [name])).rows[0].n);
  assert.equal(await sessions(), 1);
  c.close();
  c.close();
  for (let i = 0; i < 50 && (await sessions()) > 0; i++) await new Promise((r) => setTimeout(r, 20));
  assert.equal(await sessions(), 0);
  assert.throws(() => c.query({ text: 'SELECT 1' }), isError('unavailable', /closed/));
});
