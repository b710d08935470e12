// The orchestrator's identity: an Ed25519 key kept in its data dir (created
// on first start), or in the state when it is PostgreSQL, where every
// orchestrator sharing the database reads the same one. Its public key names the network (the signing domain,
// src/protocol/network.ts); it signs the tickets of the microbatches the
// orchestrator issues (src/protocol/evidence.ts).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Type } from '@sinclair/typebox';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';
import { domainOf } from '../protocol/network.ts';
import { SessionKey } from '../protocol/session-key.ts';

const KeyFile = Type.Object({ ed25519Pkcs8: Type.String({ pattern: '^[A-Za-z0-9_-]{1,200}$' }) });

export interface OrchestratorIdentity {
  key: SessionKey;
  /** the signing domain of this network */
  domain: string;
}

/** Where a shared state keeps the key (src/orchestrator/state/identity.ts). */
export interface IdentityKeeper {
  get(): string | null;
  init(pkcs8: string): string;
}

function keyFilePath(dataDir: string): string {
  return join(dataDir, 'orchestrator-key.json');
}

function readKeyFile(path: string): SessionKey {
  try {
    return SessionKey.fromPkcs8(parseJson(KeyFile, readFileSync(path, 'utf8'), `key file ${path}`, 'corrupt').ed25519Pkcs8);
  } catch (err) {
    throw new NimbleError('corrupt', `${(err as Error).message}; the orchestrator's key is unreadable (moving it away makes a new network)`);
  }
}

/**
 * The identity of an orchestrator whose state is shared: the key stored in
 * the state; the first one stores its data dir's key if it has one (a network
 * that ran on one orchestrator keeps its name), else a new key. A data dir
 * key that differs from the stored one is refused: it names another network.
 */
export function sharedOrchestratorIdentity(keeper: IdentityKeeper, dataDir: string): OrchestratorIdentity {
  const path = keyFilePath(dataDir);
  const local = existsSync(path) ? readKeyFile(path) : null;
  const stored = keeper.get() ?? keeper.init((local ?? SessionKey.generate()).toPkcs8());
  let key: SessionKey;
  try {
    key = SessionKey.fromPkcs8(stored);
  } catch (err) {
    throw new NimbleError('corrupt', `the network's key in the database is unreadable: ${(err as Error).message}`);
  }
  if (local && local.toPkcs8() !== key.toPkcs8()) {
    throw new NimbleError('conflict', `${path} is the key of another network than the one in the database (${domainOf(key.publicKey)}); move it away to join this one`);
  }
  return { key, domain: domainOf(key.publicKey) };
}

export function loadOrCreateOrchestratorIdentity(dataDir: string): OrchestratorIdentity {
  const path = keyFilePath(dataDir);
  let key: SessionKey;
  if (existsSync(path)) {
    key = readKeyFile(path);
  } else {
    key = SessionKey.generate();
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, JSON.stringify({ ed25519Pkcs8: key.toPkcs8() }) + '\n', { mode: 0o600 });
  }
  return { key, domain: domainOf(key.publicKey) };
}
