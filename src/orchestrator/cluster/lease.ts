// The lease that lets several orchestrators share one PostgreSQL database:
// whoever holds it leads (runs the coordinator, writes the state); the others
// follow (forward requests to the leader, ./forwarder.ts) and take it over
// once the leader stops renewing it. One row of the table nimble_lease:
//   holder      the leading process (a random id per process start)
//   url         where it answers
//   term        bumped at each takeover
//   expires_at  the database's clock, so the members' clocks never matter
//   forward_key a random key made at each takeover: the followers prove with
//               it the client address of the requests they forward to the
//               leader (./forwarder.ts, ../dashboard/auth.ts), which no
//               other process on the machine can then forge
// Taking it over needs expires_at in the past; the leader renews it every
// ttl/4. Correctness does not rest on timing: every write of the leader's
// state runs the fence's query (the row, FOR SHARE, still ours) inside its
// transaction (../state/pg-driver.ts), and a takeover's UPDATE waits for that
// lock, so once another process holds the lease no write of the old leader
// commits. A leader frozen inside a transaction (SIGSTOP, a dead machine) is
// cut off by PostgreSQL after idle_in_transaction_session_timeout, which
// releases its lock (./member.ts sets it on the state's connection).
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { NimbleError } from '../../protocol/errors.ts';
import type { Fence } from '../state/pg-driver.ts';
import { PgSyncConnection, type PgSyncOptions } from '../state/pg-sync.ts';

/** The lease's default time to live: a dead leader is replaced this long after its last renewal. */
export const DEFAULT_LEASE_TTL_MS = 5_000;

/** The coordinator's lease (one per database). */
const NAME = 'coordinator';

export interface LeaseOptions {
  /** the shared database: postgres://… */
  db: string;
  /** where this process answers once it leads (followers forward there) */
  url: string;
  ttlMs?: number;
  pg?: PgSyncOptions;
}

/** Who holds the lease, as the database says now. */
export interface LeaseState {
  holder: string;
  url: string;
  term: number;
  /** false once it expired without being renewed */
  live: boolean;
  /** the key of the leader's term that forwarded requests are proven with ('' from a leader of a build without one) */
  forwardKey: string;
}

interface LeaseRow {
  holder: string;
  url: string;
  term: number;
  live: number;
  forwardKey: string;
}

/** A process id no other start of any orchestrator shares. */
export function newHolderId(): string {
  return `${hostname().replace(/[^A-Za-z0-9.-]/g, '').slice(0, 40) || 'host'}:${process.pid}:${randomBytes(6).toString('hex')}`;
}

export class Lease {
  readonly holder = newHolderId();
  readonly ttlMs: number;
  /** where this process answers once it leads, as the others see it */
  readonly url: string;
  private readonly conn: PgSyncConnection;
  /** the key of the term this process took last (tryAcquire): what its followers prove forwarded requests with */
  forwardKey = '';

  private constructor(
    private readonly options: LeaseOptions,
    conn: PgSyncConnection,
  ) {
    this.ttlMs = options.ttlMs ?? DEFAULT_LEASE_TTL_MS;
    this.url = options.url;
    if (!Number.isSafeInteger(this.ttlMs) || this.ttlMs < 100) throw new NimbleError('invalid', `a lease lives at least 100 ms, got ${this.ttlMs}`);
    this.conn = conn;
  }

  /** Connects (its own connection: a lock wait never blocks longer than a second) and creates the table if it is not there. */
  static open(options: LeaseOptions): Lease {
    const conn = new PgSyncConnection(options.db, { ...options.pg, settings: { lock_timeout: 1_000, ...options.pg?.settings } });
    try {
      // two members starting at once must not both create it
      conn.query({ text: 'BEGIN' });
      conn.query({ text: 'SELECT pg_advisory_xact_lock(7286513), 1', inTx: true });
      conn.query({ text: 'CREATE TABLE IF NOT EXISTS nimble_lease (name TEXT PRIMARY KEY, holder TEXT NOT NULL, url TEXT NOT NULL, term BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)', inTx: true });
      conn.query({ text: "ALTER TABLE nimble_lease ADD COLUMN IF NOT EXISTS forward_key TEXT NOT NULL DEFAULT ''", inTx: true });
      conn.query({ text: 'COMMIT', inTx: true });
      return new Lease(options, conn);
    } catch (err) {
      conn.close();
      throw err;
    }
  }

  /** Takes the lease when nobody holds a live one: the new term, or null (someone leads, or a lock wait timed out). */
  tryAcquire(): number | null {
    const forwardKey = randomBytes(32).toString('hex');
    try {
      const r = this.conn.query({
        text: `INSERT INTO nimble_lease (name, holder, url, term, expires_at, forward_key) VALUES ($1, $2, $3, 1, now() + $4 * interval '1 millisecond', $5)
               ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, url = EXCLUDED.url, term = nimble_lease.term + 1, expires_at = EXCLUDED.expires_at, forward_key = EXCLUDED.forward_key
               WHERE nimble_lease.expires_at < now()
               RETURNING term`,
        values: [NAME, this.holder, this.url, this.ttlMs, forwardKey],
      });
      if (r.rows.length === 0) return null;
      this.forwardKey = forwardKey;
      return (r.rows[0] as { term: number }).term;
    } catch (err) {
      if (isLockTimeout(err)) return null;
      throw err;
    }
  }

  /** Pushes the expiry one ttl further; false when this process no longer holds it. */
  renew(): boolean {
    try {
      const r = this.conn.query({ text: `UPDATE nimble_lease SET expires_at = now() + $3 * interval '1 millisecond' WHERE name = $1 AND holder = $2`, values: [NAME, this.holder, this.ttlMs] });
      return r.rowCount > 0;
    } catch (err) {
      // its own state transaction holds the row for a moment: the lease is still ours
      if (isLockTimeout(err)) return true;
      throw err;
    }
  }

  /** Who leads now (null: nobody ever did). */
  current(): LeaseState | null {
    const row = this.conn.query({ text: 'SELECT holder, url, term, (expires_at > now())::int AS live, forward_key AS "forwardKey" FROM nimble_lease WHERE name = $1', values: [NAME] }).rows[0] as LeaseRow | undefined;
    return row ? { holder: row.holder, url: row.url, term: Number(row.term), live: row.live === 1, forwardKey: row.forwardKey } : null;
  }

  /** Lets go (a leader that stops cleanly): the next member takes over at once. */
  release(): void {
    this.conn.query({ text: `UPDATE nimble_lease SET expires_at = now() - interval '1 millisecond' WHERE name = $1 AND holder = $2`, values: [NAME, this.holder] });
  }

  /** The fence the leader's state writes prove (../state/pg-driver.ts): its literals are this process's own id, checked here. */
  fence(onLost: () => void): Fence {
    if (!/^[A-Za-z0-9.:-]{1,80}$/.test(this.holder)) throw new NimbleError('internal', `a lease holder id must be letters, digits, '.', ':' and '-', got '${this.holder}'`);
    return {
      text: `SELECT term FROM nimble_lease WHERE name = '${NAME}' AND holder = '${this.holder}' FOR SHARE`,
      lostMessage: 'this orchestrator no longer leads the network (another one took over its lease); nothing was written',
      onLost,
    };
  }

  close(): void {
    this.conn.close();
  }
}

function isLockTimeout(err: unknown): boolean {
  return err instanceof Error && /lock timeout/i.test(err.message);
}
