// A serving stage without the rest of a miner, for the serving path's tests
// and benches: src/miner/serve-api.ts's routes on a signed HTTP server of
// their own (127.0.0.1), serving one StageInference, called by whoever holds
// the orchestrator's key. `kill()` drops it at once (listener and open
// connections), as a killed process would; ./stage-server-child.ts runs one
// in a child process.
import type { AddressInfo } from 'node:net';
import { createHttpServer, type HttpServer } from '../../src/http/server.ts';
import type { StageInference } from '../../src/inference/stage-inference.ts';
import { serveRoutes } from '../../src/miner/serve-api.ts';
import type { DeploymentAssignment, Peer } from '../../src/protocol/messages.ts';
import { orchestratorAddress } from '../../src/protocol/network.ts';
import { RequestVerifier } from '../../src/protocol/signing.ts';
import { ORCHESTRATOR_NONCES } from '../../src/miner/miner.ts';

export interface StageServer {
  /** the peer the orchestrator routes to (a made-up address as its id) */
  peer: Peer;
  app: HttpServer;
  /** serving calls (HTTP or channel frames) answered (any status), /infer/end not counted */
  calls(): number;
  /** drops the listener and every connection at once */
  kill(): void;
}

export interface StageServerOptions {
  /** the orchestrator's public key (base64url) and signing domain */
  orchestratorKey: string;
  domain: string;
  deploymentId: string;
  stage: number;
  stageCount: number;
  inference: StageInference;
  /** the address the peer is named by */
  id: string;
  /** waits this long before answering each /infer call (to hold a generation mid-stream in tests) */
  delayMs?: number;
  /** answers this many /infer calls, then never answers again, its connections open (a hung miner) */
  hangAfter?: number;
}

export async function startStageServer(o: StageServerOptions): Promise<StageServer> {
  const orchestrator = orchestratorAddress(o.orchestratorKey);
  // the orchestrator's own nonce quota, as a miner gives it (src/miner/miner.ts)
  const verifier = new RequestVerifier({
    domain: o.domain,
    sessionKeyOf: (a) => (a.toLowerCase() === orchestrator.toLowerCase() ? o.orchestratorKey : undefined),
    quotaOf: (a) => (a.toLowerCase() === orchestrator.toLowerCase() ? ORCHESTRATOR_NONCES : undefined),
  });
  const app = createHttpServer({ bodyLimit: 1 << 16, verifier });
  let calls = 0;
  const beforeCall = async (call: 'infer' | 'end'): Promise<void> => {
    if (call !== 'infer') return;
    calls++;
    if (o.hangAfter !== undefined && calls > o.hangAfter) await new Promise(() => {});
    if (o.delayMs) await new Promise((r) => setTimeout(r, o.delayMs));
  };
  const assignment: DeploymentAssignment = {
    deploymentId: o.deploymentId, sha256: '0'.repeat(64), bytes: 1, model: 'gpt', stage: o.stage, stageCount: o.stageCount,
    from: o.inference.range.from, to: o.inference.range.to, maxSessions: o.inference.maxSessions, registry: null,
  };
  const serve = serveRoutes(app, { served: () => ({ assignment, inference: o.inference, sha256: assignment.sha256, verifiedBy: 'sha256' }), orchestrator, verifier, log: () => {}, beforeCall });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  return {
    peer: { id: o.id, url, sessionKey: o.orchestratorKey, weight: 1 },
    app,
    calls: () => calls,
    kill: () => {
      app.server.close();
      app.server.closeAllConnections();
      serve.closeChannels();
    },
  };
}
