// The --db value: which database the orchestrator's state lives in. A
// postgres:// (or postgresql://) URL names a PostgreSQL database; anything
// else is the path of a SQLite file. Shown without its password.
import { resolve } from 'node:path';
import { NimbleError } from '../../protocol/errors.ts';
import { isPostgresUrl } from './index.ts';
import { describeUrl } from './pg-sync.ts';

/** Checks a --db value: a PostgreSQL URL with a host and a database, or a file path (made absolute). */
export function parseStateTarget(value: string): string {
  const v = value.trim();
  if (v === '') throw new NimbleError('invalid', '--db must be a postgres:// URL or a SQLite file path, got an empty value');
  if (isPostgresUrl(v)) {
    let u: URL;
    try {
      u = new URL(v);
    } catch {
      throw new NimbleError('invalid', `--db: ${describeUrl(v)} is not a valid URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE)`);
    }
    if (!u.hostname) throw new NimbleError('invalid', '--db: the PostgreSQL URL names no host (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE)');
    if (u.pathname.length <= 1) throw new NimbleError('invalid', `--db: the PostgreSQL URL names no database (postgres://USER[:PASSWORD]@${u.host}/DATABASE)`);
    return v;
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(v)) throw new NimbleError('invalid', `--db: '${v.split('://')[0]}://' is not a database this orchestrator keeps state in (postgres:// or a SQLite file path)`);
  return resolve(v);
}

/** Where the state is, for people: the file, or postgres://host:port/database without credentials. */
export function describeStateTarget(target: string): string {
  return isPostgresUrl(target) ? `postgres://${describeUrl(target)}` : target;
}
