// The orchestrator's SQLite file (WAL): opening it, each store's migrations,
// transactions, cached statements, and reading rows back into typed records.
// Every table belongs to one store (./miners.ts, ./runs.ts, …) that declares
// its migrations and holds the only SQL that touches it.
import Database from 'better-sqlite3';
import type { Static, TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { NimbleError } from '../../protocol/errors.ts';
import { parseJson } from '../../protocol/messages.ts';

/** A store's schema history: step i takes it from version i to i + 1. */
export interface Migrations {
  store: string;
  steps: readonly (string | ((sql: Database.Database) => void))[];
}

/** A value a statement binds. */
export type SqlValue = string | number | bigint | null;

export class StateDb {
  readonly sql: Database.Database;
  private readonly statements = new Map<string, Database.Statement>();

  constructor(path: string, migrations: readonly Migrations[]) {
    this.sql = new Database(path);
    this.sql.pragma('journal_mode = WAL');
    this.sql.pragma('synchronous = NORMAL');
    this.sql.pragma('busy_timeout = 5000');
    this.migrate(migrations);
  }

  /** Brings every store to its latest version, each step in its own transaction. */
  private migrate(all: readonly Migrations[]): void {
    this.sql.exec('CREATE TABLE IF NOT EXISTS schema_versions (store TEXT PRIMARY KEY, version INTEGER NOT NULL)');
    const read = this.sql.prepare('SELECT version FROM schema_versions WHERE store = ?');
    const write = this.sql.prepare('INSERT INTO schema_versions (store, version) VALUES (?, ?) ON CONFLICT(store) DO UPDATE SET version = excluded.version');
    for (const m of all) {
      const at = (read.get(m.store) as { version: number } | undefined)?.version ?? 0;
      if (at > m.steps.length) throw new NimbleError('corrupt', `the ${m.store} tables are at version ${at}, newer than this build knows (${m.steps.length}); upgrade nbcli`);
      for (let v = at; v < m.steps.length; v++) {
        const step = m.steps[v];
        this.sql.transaction(() => {
          if (typeof step === 'string') this.sql.exec(step);
          else step(this.sql);
          write.run(m.store, v + 1);
        })();
      }
    }
  }

  /** The version each store's tables are at. */
  versions(): Record<string, number> {
    const rows = this.sql.prepare('SELECT store, version FROM schema_versions').all() as { store: string; version: number }[];
    return Object.fromEntries(rows.map((r) => [r.store, r.version]));
  }

  /** A prepared statement, prepared once per SQL text. */
  statement(text: string): Database.Statement {
    let s = this.statements.get(text);
    if (!s) this.statements.set(text, (s = this.sql.prepare(text)));
    return s;
  }

  run(text: string, ...params: SqlValue[] | [Record<string, SqlValue>]): Database.RunResult {
    return this.statement(text).run(...params);
  }

  /** Runs fn in one transaction (nested calls join the outer one). */
  tx<T>(fn: () => T): T {
    return this.sql.transaction(fn)();
  }

  close(): void {
    this.statements.clear();
    this.sql.close();
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
