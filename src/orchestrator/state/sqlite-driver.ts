// The embedded default engine: one SQLite file (WAL) through better-sqlite3,
// whose statements are the driver's statements as they are.
import Database from 'better-sqlite3';
import type { SqlDriver, Statement } from './driver.ts';

export class SqliteDriver implements SqlDriver {
  readonly engine = 'sqlite' as const;
  /** the better-sqlite3 handle (tests reach into the file through it) */
  readonly sql: Database.Database;

  /** Opens (creating) the file at `path`; ':memory:' for a throwaway one. */
  constructor(path: string) {
    this.sql = new Database(path);
    this.sql.pragma('journal_mode = WAL');
    this.sql.pragma('synchronous = NORMAL');
    this.sql.pragma('busy_timeout = 5000');
  }

  prepare(text: string): Statement {
    return this.sql.prepare(text) as unknown as Statement;
  }

  exec(script: string): void {
    this.sql.exec(script);
  }

  transaction<T>(fn: () => T): T {
    return this.sql.transaction(fn)();
  }

  close(): void {
    this.sql.close();
  }
}
