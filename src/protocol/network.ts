// A network's identity: the orchestrator's Ed25519 key. Its public key names
// the network (the signing domain every request is bound to), so a request
// signed for one orchestrator cannot be replayed to another. A miner learns
// the key from `GET /network?challenge=…` and accepts it only with the key's
// signature of its own fresh challenge, so an orchestrator cannot pose as
// another one's network.
import { createHash } from 'node:crypto';
import { verifySignature } from './session-key.ts';

export const NETWORK_VERSION = 'nimble-network/v1';

/** The signing domain of the network whose orchestrator holds `publicKey`. */
export function domainOf(publicKey: string): string {
  return `nimble:${createHash('sha256').update(publicKey).digest('hex').slice(0, 32)}`;
}

/** What the orchestrator signs to prove it holds its key. */
export function challengeMessage(challenge: string): string {
  return `${NETWORK_VERSION}\nchallenge\n${challenge}`;
}

/** The domain of a network whose answer to `challenge` is genuine, else null. */
export function verifyNetwork(info: { publicKey: string; signature: string }, challenge: string): string | null {
  return verifySignature(info.publicKey, challengeMessage(challenge), info.signature) ? domainOf(info.publicKey) : null;
}

/**
 * The address the orchestrator signs its own requests to miners with (the
 * serving path, src/orchestrator/serving/completions.ts): derived from its key, which
 * every miner knows, so a miner checks such a request against that key. It is
 * no wallet: nothing is paid from or to it.
 */
export function orchestratorAddress(publicKey: string): `0x${string}` {
  return `0x${createHash('sha256').update(`nimble-orchestrator\n${publicKey}`).digest('hex').slice(0, 40)}`;
}
