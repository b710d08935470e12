// What the state layer asks of an engine: prepared statements (get, all,
// run, raw rows), scripts, transactions. Two implementations: SQLite
// (better-sqlite3, the embedded default, ./sqlite-driver.ts) and PostgreSQL
// (./pg-driver.ts, through the synchronous bridge ./pg-sync.ts). Stores
// write SQLite's dialect; the PostgreSQL driver translates it
// (./sql-dialect.ts). Everything is synchronous on both.

/** A value a statement binds. */
export type SqlValue = string | number | bigint | null;

/** A statement's values: in order for `?`, or one object for `@name` parameters. */
export type SqlParams = SqlValue[] | [Record<string, SqlValue>];

/** What a write changed. */
export interface RunResult {
  /** rows inserted, updated or deleted */
  changes: number;
}

/** A prepared statement (better-sqlite3's shape). */
export interface Statement {
  /** The first row, or undefined. */
  get(...params: SqlParams): unknown;
  all(...params: SqlParams): unknown[];
  run(...params: SqlParams): RunResult;
  /** From now on rows are arrays of column values (true) or objects (false); returns the statement. */
  raw(on?: boolean): Statement;
}

export type Engine = 'sqlite' | 'postgres';

export interface SqlDriver {
  readonly engine: Engine;
  /** Prepares a statement (the caller caches it). */
  prepare(text: string): Statement;
  /** Runs a script of statements that take no values (a migration step). */
  exec(script: string): void;
  /** Runs fn in a transaction: committed when it returns, rolled back when it throws; nested calls are savepoints. */
  transaction<T>(fn: () => T): T;
  close(): void;
}
