// The orchestrator's identity: an Ed25519 key kept in its data dir (created
// on first start). Its public key names the network (the signing domain,
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

export function loadOrCreateOrchestratorIdentity(dataDir: string): OrchestratorIdentity {
  const path = join(dataDir, 'orchestrator-key.json');
  let key: SessionKey;
  if (existsSync(path)) {
    try {
      key = SessionKey.fromPkcs8(parseJson(KeyFile, readFileSync(path, 'utf8'), `key file ${path}`, 'corrupt').ed25519Pkcs8);
    } catch (err) {
      throw new NimbleError('corrupt', `${(err as Error).message}; the orchestrator's key is unreadable (moving it away makes a new network)`);
    }
  } else {
    key = SessionKey.generate();
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, JSON.stringify({ ed25519Pkcs8: key.toPkcs8() }) + '\n', { mode: 0o600 });
  }
  return { key, domain: domainOf(key.publicKey) };
}
