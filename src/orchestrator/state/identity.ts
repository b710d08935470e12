// The network's identity key, kept in the state when the state is shared:
// every orchestrator on one PostgreSQL database signs as the same network
// (src/orchestrator/identity.ts decides where the key comes from). One row;
// the first orchestrator writes it and it never changes.
import { Type } from '@sinclair/typebox';
import { one, rowReader, type Migrations, type StateDb } from './db.ts';

export const IDENTITY_MIGRATIONS: Migrations = {
  store: 'identity',
  steps: [`CREATE TABLE orchestrator_identity (id INTEGER PRIMARY KEY, ed25519_pkcs8 TEXT NOT NULL)`],
};

const IdentityRow = Type.Object({ ed25519Pkcs8: Type.String({ pattern: '^[A-Za-z0-9_-]{1,200}$' }) });
const readIdentity = rowReader(IdentityRow, 'orchestrator identity');

export class IdentityStore {
  constructor(private readonly db: StateDb) {}

  /** The stored key (PKCS#8, base64url), or null before the first orchestrator wrote it. */
  get(): string | null {
    return one(this.db, readIdentity, 'SELECT ed25519_pkcs8 AS ed25519Pkcs8 FROM orchestrator_identity WHERE id = 1')?.ed25519Pkcs8 ?? null;
  }

  /** Stores `pkcs8` unless a key is there already; returns the key that is. */
  init(pkcs8: string): string {
    return this.db.tx(() => {
      this.db.statement('INSERT INTO orchestrator_identity (id, ed25519_pkcs8) VALUES (1, ?) ON CONFLICT(id) DO NOTHING').run(pkcs8);
      return this.get() ?? pkcs8;
    });
  }
}
