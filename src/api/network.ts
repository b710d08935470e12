// Finding the network a miner is to join (or a developer signs for): the orchestrator's key, accepted
// only with its signature of a fresh challenge (src/protocol/network.ts). The
// key names the signing domain of every request the miner makes and checks,
// and signs the tickets of the microbatches it is given.
import { randomBytes } from 'node:crypto';
import { JsonClient } from '../http/client.ts';
import { showUrl, type BaseUrls, type Failover } from '../http/failover.ts';
import { NimbleError } from '../protocol/errors.ts';
import { NetworkInfo } from '../protocol/messages.ts';
import { NETWORK_VERSION, verifyNetwork } from '../protocol/network.ts';

export interface Network {
  domain: string;
  /** the orchestrator's public key (base64url) */
  orchestratorKey: string;
}

/** A miner started before its orchestrator waits this long for it. */
export const MINER_WAIT_MS = 60_000;

/**
 * Asks `orchestrator` for its network (one URL, or several tried in turn as
 * src/http/failover.ts says), retrying while none is reachable, or while
 * none has a leader, for up to `waitMs` (a miner waits for an orchestrator
 * that is starting; a developer's command gives up after a few seconds and
 * says so).
 */
export async function findNetwork(orchestrator: BaseUrls | Failover, stopped: () => boolean = () => false, waitMs: number = MINER_WAIT_MS): Promise<Network> {
  const client = new JsonClient(orchestrator, 10_000, 'the orchestrator');
  const giveUpAt = Date.now() + waitMs;
  for (let attempt = 0; ; attempt++) {
    const challenge = randomBytes(16).toString('hex');
    try {
      const info = await client.get(`/network?challenge=${challenge}`, NetworkInfo, 'network');
      const domain = verifyNetwork(info, challenge);
      if (!domain) throw new NimbleError('forbidden', `${showUrl(client.baseUrl)} did not prove it holds the key it announces`);
      return { domain, orchestratorKey: info.publicKey };
    } catch (err) {
      // 'unreachable': no answer, or a follower with no leader to pass the request on to (a 503)
      const unreachable = err instanceof NimbleError && err.code === 'unreachable';
      if (!unreachable || Date.now() >= giveUpAt || stopped()) throw err;
      await new Promise((r) => setTimeout(r, Math.min(2000, 100 * 2 ** attempt)));
    }
  }
}

/** JSON with every object's keys sorted: the same text for the same value on both sides of a signature. */
function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * What the orchestrator signs, with the network's key, to name its chain to
 * the holder of `challenge` (GET /chain): a miner learns the chain it checks
 * deployed models on from it, so the answer must be the network's and fresh.
 */
export function chainMessage(challenge: string, chain: unknown): string {
  return `${NETWORK_VERSION}\nchain\n${challenge}\n${canonicalJson(chain)}`;
}
