// The PostgreSQL engine: the stores' SQL translated (./sql-dialect.ts) and
// run through the synchronous bridge (./pg-sync.ts), each statement prepared
// once per connection under its own name. Transactions are BEGIN / COMMIT /
// ROLLBACK, nested ones savepoints, as better-sqlite3's `transaction` does.
// One difference remains (docs/postgres.md): a statement that fails inside a
// transaction aborts all of it on PostgreSQL, so code that survives a SQL
// error must wrap the statement in its own (nested) tx; a COMMIT PostgreSQL
// turns into a ROLLBACK for that reason throws here, never passes silently.
//
// A fence (several orchestrators on one database, src/orchestrator/cluster/)
// makes every write prove that this process still leads: each outermost
// transaction first runs the fence's query, which locks the lease row for
// the rest of the transaction, and a write outside a transaction gets one of
// its own. When the query finds no row another orchestrator took the lease:
// the write is refused (nothing of the transaction is committed) and the
// fence's onLost is told, once.
import { NimbleError } from '../../protocol/errors.ts';
import type { RunResult, SqlDriver, SqlParams, Statement } from './driver.ts';
import { PgSyncConnection, type PgResult, type PgSyncOptions } from './pg-sync.ts';
import { bindings, toPostgres, type Translated } from './sql-dialect.ts';

/** What every write of a fenced driver proves first (./pg-driver.ts header). */
export interface Fence {
  /**
   * PostgreSQL SQL that returns a row while this process may write; it should
   * lock that row (FOR SHARE). It takes no values (it is sent in one round trip
   * with the BEGIN), so its literals must be the caller's own, never input.
   */
  text: string;
  /** what a refused write says */
  lostMessage: string;
  /** called once, the first time the query finds no row */
  onLost(): void;
}

export interface PgDriverOptions extends PgSyncOptions {
  fence?: Fence;
}

export class PgDriver implements SqlDriver {
  readonly engine = 'postgres' as const;
  readonly connection: PgSyncConnection;
  private depth = 0;
  private named = 0;
  private readonly fence: Fence | null;
  private lost = false;

  /** Connects to `url` (postgres://user:pass@host:port/db). */
  constructor(url: string, options: PgDriverOptions = {}) {
    this.connection = new PgSyncConnection(url, options);
    this.fence = options.fence ?? null;
  }

  /** Whether a transaction is open. */
  get inTransaction(): boolean {
    return this.depth > 0;
  }

  prepare(text: string): Statement {
    return new PgStatement(this, toPostgres(text), `nimble_${++this.named}`);
  }

  exec(script: string): void {
    const tr = toPostgres(script);
    if (tr.params) throw new NimbleError('invalid', `a script takes no values: ${script.slice(0, 80)}`);
    this.fenced(tr.text, () => this.query(tr.text));
  }

  /** Runs `send`, inside a transaction of its own when a fence is set, it is a write and none is open. */
  fenced(text: string, send: () => PgResult): PgResult {
    if (this.fence === null || this.depth > 0 || /^\s*SELECT\b/i.test(text)) return send();
    return this.transaction(send);
  }

  /** Refuses to go on when the fence's query, sent with the BEGIN, found no row (another orchestrator holds the lease). */
  private proveLease(fence: Fence, begun: PgResult): void {
    if (!this.lost && begun.rows.length > 0) return;
    if (!this.lost) {
      this.lost = true;
      fence.onLost();
    }
    throw new NimbleError('unavailable', fence.lostMessage, 503);
  }

  /** Runs translated SQL (the caller's transaction, if any, is the one it joins). */
  query(text: string, values?: readonly unknown[], name?: string, array?: boolean): PgResult {
    return this.connection.query({ text, values, name, array, inTx: this.depth > 0 });
  }

  transaction<T>(fn: () => T): T {
    const level = this.depth;
    const savepoint = `nimble_sp${level}`;
    // fenced: the BEGIN and the fence's query go as one script, one round trip
    const fence = level === 0 ? this.fence : null;
    const begun = this.query(level > 0 ? `SAVEPOINT ${savepoint}` : fence ? `BEGIN; ${fence.text}` : 'BEGIN');
    this.depth++;
    let result: T;
    try {
      if (fence) this.proveLease(fence, begun);
      result = fn();
      if (result instanceof Promise) throw new TypeError('Transaction function cannot return a promise');
    } catch (err) {
      try {
        this.query(level === 0 ? 'ROLLBACK' : `ROLLBACK TO SAVEPOINT ${savepoint}; RELEASE SAVEPOINT ${savepoint}`);
      } catch {
        // the connection is gone, and the transaction with it
      } finally {
        this.depth = level;
      }
      throw err;
    }
    try {
      const done = this.query(level === 0 ? 'COMMIT' : `RELEASE SAVEPOINT ${savepoint}`);
      if (level === 0 && done.command === 'ROLLBACK') {
        throw new NimbleError('internal', 'PostgreSQL rolled the transaction back: a statement in it had failed (catch SQL errors inside a nested tx)');
      }
    } finally {
      this.depth = level;
    }
    return result;
  }

  close(): void {
    this.connection.close();
  }
}

class PgStatement implements Statement {
  private array = false;

  constructor(
    private readonly driver: PgDriver,
    private readonly tr: Translated,
    private readonly name: string,
  ) {}

  get(...params: SqlParams): unknown {
    return this.exec(params).rows[0];
  }

  all(...params: SqlParams): unknown[] {
    return this.exec(params).rows;
  }

  run(...params: SqlParams): RunResult {
    return { changes: this.exec(params).rowCount };
  }

  raw(on = true): Statement {
    this.array = on;
    return this;
  }

  private exec(params: SqlParams): PgResult {
    return this.driver.fenced(this.tr.text, () => this.driver.query(this.tr.text, bindings(this.tr, params), this.name, this.array));
  }
}
