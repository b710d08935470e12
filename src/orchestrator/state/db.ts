// The orchestrator's durable state: an engine (SQLite by default, or
// PostgreSQL: ./driver.ts), each store's migrations, transactions, cached
// statements, and reading rows back into typed records. Every table belongs
// to one store (./miners.ts, ./runs.ts, …) that declares its migrations and
// holds the only SQL that touches it, written in SQLite's dialect in the
// subset both engines run alike (./sql-dialect.ts translates it).
import type Database from 'better-sqlite3';
import type { Static, TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { NimbleError } from '../../protocol/errors.ts';
import { parseJson } from '../../protocol/messages.ts';
import type { Engine, RunResult, SqlDriver, SqlParams, SqlValue, Statement } from './driver.ts';
import { SqliteDriver } from './sqlite-driver.ts';

export type { Engine, RunResult, SqlValue, Statement } from './driver.ts';

/** A migration step: a script, or a function that runs statements through the state (on either engine). */
export type MigrationStep = string | ((db: StateDb) => void);

/** A store's schema history: step i takes it from version i to i + 1. */
export interface Migrations {
  store: string;
  steps: readonly MigrationStep[];
}

export class StateDb {
  readonly driver: SqlDriver;
  private readonly statements = new Map<string, Statement>();

  /** Opens the state on `driver` (a path: a SQLite file, as before) and brings every store to its latest version. */
  constructor(driver: SqlDriver | string, migrations: readonly Migrations[]) {
    this.driver = typeof driver === 'string' ? new SqliteDriver(driver) : driver;
    try {
      this.migrate(migrations);
    } catch (err) {
      this.driver.close();
      throw err;
    }
  }

  get engine(): Engine {
    return this.driver.engine;
  }

  /** The better-sqlite3 handle of a SQLite state (tests reach into the file through it); PostgreSQL has none. */
  get sql(): Database.Database {
    if (this.driver instanceof SqliteDriver) return this.driver.sql;
    throw new NimbleError('invalid', `a ${this.driver.engine} state has no SQLite handle`);
  }

  /** Brings every store to its latest version, each step in its own transaction. */
  private migrate(all: readonly Migrations[]): void {
    this.exec('CREATE TABLE IF NOT EXISTS schema_versions (store TEXT PRIMARY KEY, version INTEGER NOT NULL)');
    const read = this.statement('SELECT version FROM schema_versions WHERE store = ?');
    const write = this.statement('INSERT INTO schema_versions (store, version) VALUES (?, ?) ON CONFLICT(store) DO UPDATE SET version = excluded.version');
    for (const m of all) {
      const at = (read.get(m.store) as { version: number } | undefined)?.version ?? 0;
      if (at > m.steps.length) throw new NimbleError('corrupt', `the ${m.store} tables are at version ${at}, newer than this build knows (${m.steps.length}); upgrade nbcli`);
      for (let v = at; v < m.steps.length; v++) {
        const step = m.steps[v];
        this.tx(() => {
          if (typeof step === 'string') this.exec(step);
          else step(this);
          write.run(m.store, v + 1);
        });
      }
    }
  }

  /** The version each store's tables are at. */
  versions(): Record<string, number> {
    const rows = this.statement('SELECT store, version FROM schema_versions').all() as { store: string; version: number }[];
    return Object.fromEntries(rows.map((r) => [r.store, r.version]));
  }

  /** A prepared statement, prepared once per SQL text. */
  statement(text: string): Statement {
    let s = this.statements.get(text);
    if (!s) this.statements.set(text, (s = this.driver.prepare(text)));
    return s;
  }

  run(text: string, ...params: SqlParams): RunResult {
    return this.statement(text).run(...params);
  }

  /** Runs a script of statements that take no values (migrations). */
  exec(script: string): void {
    this.driver.exec(script);
  }

  /** Runs fn in one transaction (nested calls are savepoints inside the outer one). */
  tx<T>(fn: () => T): T {
    return this.driver.transaction(fn);
  }

  close(): void {
    this.statements.clear();
    this.driver.close();
  }
}

/**
 * A decoder of one table's rows: checks a row (selected with camelCase
 * aliases) against `schema` once and returns it typed. A row that does not
 * match is corrupt state: a 500, never a silent cast.
 */
export function rowReader<S extends TSchema>(schema: S, what: string): (row: unknown) => Static<S> {
  const check: TypeCheck<S> = TypeCompiler.Compile(schema);
  return (row) => {
    if (check.Check(row)) return row;
    const first = check.Errors(row).First();
    throw new NimbleError('corrupt', `stored ${what} is invalid: ${first?.path || '/'} ${first?.message ?? ''}`);
  };
}

/** A JSON column read back and validated (a mismatch is corrupt state). */
export function jsonColumn<S extends TSchema>(schema: S, text: string, what: string): Static<S> {
  return parseJson(schema, text, `stored ${what}`, 'corrupt');
}

/** Rows of a query, decoded. */
export function all<T>(db: StateDb, decode: (row: unknown) => T, text: string, ...params: SqlValue[]): T[] {
  return db.statement(text).all(...params).map(decode);
}

/** The first row of a query, decoded, or undefined. */
export function one<T>(db: StateDb, decode: (row: unknown) => T, text: string, ...params: SqlValue[]): T | undefined {
  const row = db.statement(text).get(...params);
  return row === undefined ? undefined : decode(row);
}

/** A single number a query returns (COUNT, MAX, …). */
export function scalar(db: StateDb, text: string, ...params: SqlValue[]): number {
  const row = db.statement(text).get(...params) as Record<string, unknown> | undefined;
  const v = row ? Object.values(row)[0] : null;
  if (typeof v !== 'number') throw new NimbleError('corrupt', `expected a number from ${text.slice(0, 60)}`);
  return v;
}
