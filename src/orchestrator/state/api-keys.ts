// API keys (docs/inference.md, "Payment"): a key `nk-…` is bound to the wallet
// that created it with a signed request, and spends that wallet's prepaid
// balance on POST /v1/completions. Only its sha256 is kept, with a short
// prefix to recognise it by; a revoked key is kept (revoked_at set) so that
// its requests stay attributable.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const API_KEY_MIGRATIONS: Migrations = {
  store: 'api-keys',
  steps: [
    `CREATE TABLE api_keys (
      id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, owner TEXT NOT NULL, name TEXT NOT NULL, prefix TEXT NOT NULL,
      created_at INTEGER NOT NULL, last_used_at INTEGER, revoked_at INTEGER
    );
    CREATE INDEX api_keys_by_owner ON api_keys (owner, created_at)`,
  ],
};

const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);

const ApiKeyRow = Type.Object({
  /** `key-…`: how the owner names it (list, revoke); not the secret */
  id: Type.String({ pattern: '^key-[0-9a-f]{12}$' }),
  /** sha256 of the whole key, hex */
  hash: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  /** the wallet it spends (checksummed address) */
  owner: Type.String(),
  name: Type.String(),
  /** the key's first characters, to recognise it by */
  prefix: Type.String(),
  createdAt: Int,
  lastUsedAt: NullableInt,
  revokedAt: NullableInt,
});
export type ApiKeyRecord = Static<typeof ApiKeyRow>;
const COLUMNS = 'id, hash, owner, name, prefix, created_at AS createdAt, last_used_at AS lastUsedAt, revoked_at AS revokedAt';
const decode = rowReader(ApiKeyRow, 'API key');

export class ApiKeyStore {
  constructor(private readonly db: StateDb) {}

  insert(k: { id: string; hash: string; owner: string; name: string; prefix: string }, now: number): void {
    this.db.run('INSERT INTO api_keys (id, hash, owner, name, prefix, created_at) VALUES (?, ?, ?, ?, ?, ?)', k.id, k.hash, k.owner, k.name, k.prefix, now);
  }

  get(id: string): ApiKeyRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM api_keys WHERE id = ?`, id);
  }

  /** The key whose sha256 is `hash` (revoked or not). */
  byHash(hash: string): ApiKeyRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM api_keys WHERE hash = ?`, hash);
  }

  /** `owner`'s keys, oldest first (revoked ones too). */
  list(owner: string): ApiKeyRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM api_keys WHERE owner = ? ORDER BY created_at, id`, owner);
  }

  countActive(owner: string): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM api_keys WHERE owner = ? AND revoked_at IS NULL', owner);
  }

  /** Revokes `owner`'s key `id`; false when it is not theirs or was revoked already. */
  revoke(id: string, owner: string, now: number): boolean {
    return this.db.run('UPDATE api_keys SET revoked_at = ? WHERE id = ? AND owner = ? AND revoked_at IS NULL', now, id, owner).changes > 0;
  }

  touch(id: string, now: number): void {
    this.db.run('UPDATE api_keys SET last_used_at = ? WHERE id = ?', now, id);
  }
}
