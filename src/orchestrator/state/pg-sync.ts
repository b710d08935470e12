// A synchronous PostgreSQL connection, so the state layer keeps its
// synchronous API on both engines: a worker thread owns an async `pg`
// Client; each call posts a request on a MessagePort and blocks the calling
// thread with Atomics.wait on a shared flag until the worker answers, then
// takes the answer with receiveMessageOnPort (the synckit pattern). One call
// at a time, each bounded by a timeout.
//
// The worker's body is a CommonJS string run with `eval: true`, and `pg` is
// resolved here and passed by path, so it works from source (tsx) and from
// dist alike, from any working directory. int8 and numeric come back as JS
// numbers (an int8 past 2^53 stays a string, which the row decoders refuse),
// booleans as 1/0 (SQLite has none), text as text.
//
// A connection the server dropped is replaced on the next call made outside
// a transaction; inside one, every call fails until it ends (never a silent
// switch to a new session mid-transaction). Nothing is retried: a statement
// whose fate is unknown is reported, not run twice.
import { createRequire } from 'node:module';
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from 'node:worker_threads';
import { NimbleError } from '../../protocol/errors.ts';

/** One query's answer. */
export interface PgResult {
  rows: unknown[];
  rowCount: number;
  /** the command tag (COMMIT answers ROLLBACK when the transaction had failed) */
  command: string;
}

export interface PgQuery {
  text: string;
  values?: readonly unknown[];
  /** a prepared statement's name (prepared once per connection) */
  name?: string;
  /** rows as arrays of column values */
  array?: boolean;
  /** part of a transaction: fails, rather than reconnecting, when the connection was lost */
  inTx?: boolean;
}

export interface PgSyncOptions {
  /** ms a call may take before the connection is given up (default 30 s) */
  timeoutMs?: number;
  /** server settings of every session this connection opens (e.g. lock_timeout: 1000), set at connect so a reconnect keeps them */
  settings?: Readonly<Record<string, number>>;
}

interface WireError {
  message: string;
  code?: string;
  connection: boolean;
}
type Reply = { ok: true; rows: unknown[]; rowCount: number; command: string } | { ok: false; error: WireError };

const WORKER = `
'use strict';
const { workerData } = require('node:worker_threads');
const { port, flag, url, connectMs, options } = workerData;
let pg = null, loadError = null;
try {
  pg = require(workerData.pgPath);
  const types = pg.types;
  types.setTypeParser(20, (v) => { const n = Number(v); return Number.isSafeInteger(n) ? n : v; });
  types.setTypeParser(1700, (v) => Number(v));
  types.setTypeParser(16, (v) => (v === 't' ? 1 : 0));
} catch (err) { loadError = err; }
let client = null, broken = null;
const CONNECTION = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EPIPE', 'EAI_AGAIN']);
function isConnection(err) {
  const code = err && err.code;
  if (typeof code === 'string' && (CONNECTION.has(code) || code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03')) return true;
  return /Connection terminated|connection error|not queryable|timeout expired|Client was closed|ended/i.test(String(err && err.message));
}
async function ensure(inTx) {
  if (client && !broken) return client;
  if (inTx) throw Object.assign(new Error('the connection was lost inside a transaction' + (broken ? ': ' + broken.message : '')), { code: '08006' });
  if (client) { const old = client; client = null; old.end().catch(() => {}); }
  const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: connectMs, options });
  c.on('error', (err) => { if (client === c) broken = err; });
  await c.connect();
  client = c;
  broken = null;
  return c;
}
async function handle(req) {
  if (loadError) throw loadError;
  if (req.op === 'close') {
    if (client) { const c = client; client = null; await c.end().catch(() => {}); }
    return { rows: [], rowCount: 0, command: '' };
  }
  const c = await ensure(req.inTx);
  if (req.op === 'connect') return { rows: [], rowCount: 0, command: '' };
  const config = { text: req.text, values: req.values, rowMode: req.array ? 'array' : undefined };
  if (req.name) config.name = req.name;
  let r;
  try {
    r = await c.query(config);
  } catch (err) {
    // a connection that failed once is not used again: the next call outside a transaction opens another
    if (isConnection(err) && client === c) broken = err;
    throw err;
  }
  // a script of several statements answers with one result per statement: the last one counts
  const last = Array.isArray(r) ? r[r.length - 1] : r;
  return { rows: last ? last.rows : [], rowCount: last && typeof last.rowCount === 'number' ? last.rowCount : 0, command: (last && last.command) || '' };
}
port.on('message', async (req) => {
  let reply;
  try {
    reply = { ok: true, ...(await handle(req)) };
  } catch (err) {
    reply = { ok: false, error: { message: String((err && err.message) || err), code: err && typeof err.code === 'string' ? err.code : undefined, connection: isConnection(err) } };
  }
  port.postMessage(reply);
  Atomics.store(flag, 0, 1);
  Atomics.notify(flag, 0);
});
`;

/** Settings as the startup packet's options ('-c name=value ...'); names are checked, values are integers. */
function sessionOptions(settings: Readonly<Record<string, number>> | undefined): string | undefined {
  if (!settings) return undefined;
  const parts = Object.entries(settings).map(([name, value]) => {
    if (!/^[a-z_]{1,63}$/.test(name) || !Number.isSafeInteger(value) || value < 0) throw new NimbleError('invalid', `not a PostgreSQL setting: ${name}=${value}`);
    return `-c ${name}=${value}`;
  });
  return parts.length > 0 ? parts.join(' ') : undefined;
}

/** Where the connection goes, without its password: host:port/database. */
export function describeUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname || 'localhost'}:${u.port || '5432'}${u.pathname}`;
  } catch {
    return '(an invalid URL)';
  }
}

export class PgSyncConnection {
  private readonly worker: Worker;
  private readonly port: MessagePort;
  private readonly flag = new Int32Array(new SharedArrayBuffer(4));
  private readonly timeoutMs: number;
  private closed: string | null = null;
  /** host:port/database, for messages */
  readonly where: string;

  /** Connects (blocking) to `url` (postgres://user:pass@host:port/db); throws 'unavailable' when it cannot. */
  constructor(url: string, options: PgSyncOptions = {}) {
    this.where = describeUrl(url);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    const pgPath = createRequire(import.meta.url).resolve('pg');
    this.worker = new Worker(WORKER, {
      eval: true,
      // plain CommonJS: none of the parent's loaders (tsx) are needed, and they cost a quarter of a second to start
      execArgv: [],
      workerData: { port: port2, flag: this.flag, url, pgPath, connectMs: Math.min(this.timeoutMs, 10_000), options: sessionOptions(options.settings) },
      transferList: [port2],
    });
    // nothing here may keep the process alive: the caller blocks while it waits anyway
    this.worker.unref();
    this.port.unref();
    try {
      this.call({ op: 'connect' }, 'connect');
    } catch (err) {
      this.close();
      throw err;
    }
  }

  /** Runs one statement (or, with no values, a script of several) and returns its rows. */
  query(q: PgQuery): PgResult {
    return this.call({ op: 'query', text: q.text, values: q.values, name: q.name, array: q.array, inTx: q.inTx }, q.text);
  }

  get isClosed(): boolean {
    return this.closed !== null;
  }

  /** Ends the client and the worker (idempotent). */
  close(): void {
    if (this.closed) return;
    try {
      this.call({ op: 'close' }, 'close', 5_000);
    } catch {
      // ending a client that is gone already: nothing left to do
    }
    this.closed = 'the PostgreSQL connection is closed';
    void this.worker.terminate();
    this.port.close();
  }

  private call(req: Record<string, unknown>, what: string, timeoutMs = this.timeoutMs): PgResult {
    if (this.closed) throw new NimbleError('unavailable', `${this.closed} (${this.where})`, 503);
    Atomics.store(this.flag, 0, 0);
    this.port.postMessage(req);
    const waited = Atomics.wait(this.flag, 0, 0, timeoutMs);
    const msg = receiveMessageOnPort(this.port);
    if (!msg) {
      // the worker never answered: it is stuck or gone, and so is this connection
      this.closed = `a PostgreSQL call timed out after ${timeoutMs} ms`;
      void this.worker.terminate();
      this.port.close();
      throw new NimbleError('unavailable', `PostgreSQL at ${this.where} did not answer within ${timeoutMs} ms${waited === 'timed-out' ? '' : ' (no reply)'}: ${head(what)}`, 503);
    }
    const reply = msg.message as Reply;
    if (reply.ok) return { rows: reply.rows, rowCount: reply.rowCount, command: reply.command };
    const e = reply.error;
    if (e.connection) throw new NimbleError('unavailable', `PostgreSQL at ${this.where} is unavailable: ${e.message}`, 503);
    throw new NimbleError('internal', `PostgreSQL refused ${head(what)}: ${e.message}${e.code ? ` (${e.code})` : ''}`, 500, { cause: e });
  }
}

/** The first 80 characters of a statement, on one line. */
function head(text: string): string {
  const one = text.replace(/\s+/g, ' ').trim();
  return one.length > 80 ? `${one.slice(0, 80)}…` : one;
}
