// Miners that joined: their measured hardware and liveness.
import { Type, type Static } from '@sinclair/typebox';
import { ServeSetting } from '../../protocol/messages.ts';
import { all, one, rowReader, type Migrations, type StateDb } from './db.ts';

/** Where a miner's GPT stages run (src/protocol/messages.ts Hardware). */
export const MinerBackend = Type.Union([Type.Literal('wasm'), Type.Literal('webgpu')]);
export type MinerBackend = Static<typeof MinerBackend>;

export const MINER_MIGRATIONS: Migrations = {
  store: 'miners',
  steps: [
    `CREATE TABLE IF NOT EXISTS miners (
      id TEXT PRIMARY KEY, name TEXT NOT NULL, url TEXT NOT NULL,
      gflops REAL NOT NULL, threads INTEGER NOT NULL, memory_bytes INTEGER NOT NULL, bandwidth_mbps REAL NOT NULL,
      joined_at INTEGER NOT NULL, last_seen INTEGER NOT NULL, alive INTEGER NOT NULL DEFAULT 1
    )`,
    // why a miner is refused until it joins again (too little stake); survives a restart
    'ALTER TABLE miners ADD COLUMN evicted TEXT',
    // the Ed25519 key its wallet bound at join, which signs its requests and receipts
    "ALTER TABLE miners ADD COLUMN session_key TEXT NOT NULL DEFAULT ''",
    // until when an eviction for an offence refuses its joins too (ms; null: it may join again at once)
    'ALTER TABLE miners ADD COLUMN banned_until INTEGER',
    // what it offers to do: serve deployed models, train, or both (nbcli miner start --serve)
    "ALTER TABLE miners ADD COLUMN serve TEXT NOT NULL DEFAULT 'both'",
    // where its GPT stages run (wasm for miners that joined before backends were reported), its GPU adapter's name, and whether that adapter is a software one
    `ALTER TABLE miners ADD COLUMN backend TEXT NOT NULL DEFAULT 'wasm';
     ALTER TABLE miners ADD COLUMN adapter TEXT;
     ALTER TABLE miners ADD COLUMN software_adapter INTEGER NOT NULL DEFAULT 0`,
  ],
};

/** What a miner says of itself when it joins (its id is the address that signed). */
export interface MinerProfile {
  id: string;
  name: string;
  url: string;
  gflops: number;
  threads: number;
  memoryBytes: number;
  bandwidthMbps: number;
  /** base64url Ed25519 public key (src/protocol/session-key.ts) */
  sessionKey: string;
  /** what it offers to do (default both) */
  serve?: ServeSetting;
  /** where its GPT stages run (default wasm) */
  backend?: MinerBackend;
  /** its GPU adapter's name, if it reported one (default none) */
  adapter?: string | null;
  /** that adapter is a software one such as SwiftShader (default false) */
  softwareAdapter?: boolean;
}

const MinerRow = Type.Object({
  id: Type.String(),
  name: Type.String(),
  url: Type.String(),
  gflops: Type.Number(),
  threads: Type.Integer(),
  memoryBytes: Type.Integer(),
  bandwidthMbps: Type.Number(),
  sessionKey: Type.String(),
  joinedAt: Type.Integer(),
  lastSeen: Type.Integer(),
  alive: Type.Union([Type.Literal(0), Type.Literal(1)]),
  evicted: Type.Union([Type.String(), Type.Null()]),
  bannedUntil: Type.Union([Type.Integer(), Type.Null()]),
  serve: ServeSetting,
  backend: MinerBackend,
  adapter: Type.Union([Type.String(), Type.Null()]),
  softwareAdapter: Type.Union([Type.Literal(0), Type.Literal(1)]),
});

export interface MinerRecord extends MinerProfile {
  joinedAt: number;
  lastSeen: number;
  alive: boolean;
  /** why it is refused until it joins again (null: it is not) */
  evicted: string | null;
  /** an eviction for an offence also refuses its joins until then (ms) */
  bannedUntil: number | null;
  serve: ServeSetting;
  backend: MinerBackend;
  adapter: string | null;
  softwareAdapter: boolean;
}

const decodeId = rowReader(Type.Object({ id: Type.String() }), 'miner id');
const COLUMNS = 'id, name, url, gflops, threads, memory_bytes AS memoryBytes, bandwidth_mbps AS bandwidthMbps, session_key AS sessionKey, joined_at AS joinedAt, last_seen AS lastSeen, alive, evicted, banned_until AS bannedUntil, serve, backend, adapter, software_adapter AS softwareAdapter';
const readRow = rowReader(MinerRow, 'miner');
const decode = (row: unknown): MinerRecord => {
  const r: Static<typeof MinerRow> = readRow(row);
  return { ...r, alive: r.alive === 1, softwareAdapter: r.softwareAdapter === 1 };
};

export class MinerStore {
  constructor(private readonly db: StateDb) {}

  /** Records a join: a new miner, or new hardware figures (backend and adapter included) and URL for a known one (alive again, no longer evicted). */
  upsert(m: MinerProfile, now: number): void {
    this.db.run(
      `INSERT INTO miners (id, name, url, gflops, threads, memory_bytes, bandwidth_mbps, session_key, serve, backend, adapter, software_adapter, joined_at, last_seen, alive)
       VALUES (@id, @name, @url, @gflops, @threads, @memoryBytes, @bandwidthMbps, @sessionKey, @serve, @backend, @adapter, @softwareAdapter, @now, @now, 1)
       ON CONFLICT(id) DO UPDATE SET name = @name, url = @url, gflops = @gflops, threads = @threads,
         memory_bytes = @memoryBytes, bandwidth_mbps = @bandwidthMbps, session_key = @sessionKey, serve = @serve,
         backend = @backend, adapter = @adapter, software_adapter = @softwareAdapter, last_seen = @now, alive = 1, evicted = NULL`,
      { ...m, serve: m.serve ?? 'both', backend: m.backend ?? 'wasm', adapter: m.adapter ?? null, softwareAdapter: m.softwareAdapter ? 1 : 0, now },
    );
  }

  get(id: string): MinerRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM miners WHERE id = ?`, id);
  }

  list(aliveOnly = false): MinerRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM miners ${aliveOnly ? 'WHERE alive = 1' : ''} ORDER BY joined_at, id`);
  }

  /** A heartbeat: seen now, alive. */
  touch(id: string, now: number): void {
    this.db.run('UPDATE miners SET last_seen = ?, alive = 1 WHERE id = ?', now, id);
  }

  markGone(id: string): void {
    this.db.run('UPDATE miners SET alive = 0 WHERE id = ?', id);
  }

  /** Refused (its heartbeats get 403 with `reason`) until it joins again. */
  evict(id: string, reason: string, bannedUntil: number | null = null): void {
    this.db.run('UPDATE miners SET alive = 0, evicted = ?, banned_until = ? WHERE id = ?', reason.slice(0, 500), bannedUntil, id);
  }

  /**
   * Deletes at most `limit` miners gone (not alive), except those in `keep`:
   * the ones last seen before `before`, and the ones beyond the `maxGone` most
   * recently seen. Returns their ids. A deleted miner that comes back joins
   * like a new one.
   */
  deleteGone(before: number, maxGone: number, keep: readonly string[], limit: number): string[] {
    return all(
      this.db,
      decodeId,
      `DELETE FROM miners WHERE id IN (
         SELECT id FROM miners WHERE alive = 0 AND id NOT IN (SELECT value FROM json_each(?))
           AND (last_seen < ? OR id NOT IN (SELECT id FROM miners WHERE alive = 0 ORDER BY last_seen DESC, id LIMIT ?))
         ORDER BY last_seen LIMIT ?
       ) RETURNING id`,
      JSON.stringify(keep),
      before,
      maxGone,
      limit,
    ).map((r) => r.id);
  }
}
