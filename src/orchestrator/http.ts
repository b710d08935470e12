// The orchestrator's HTTP API: the public routes (./routes/public.ts) and the
// miners' signed routes (./routes/miners.ts) on the shared server of
// src/http/server.ts. A refused signed request (a 4xx other than a bad
// signature or too little stake) counts as invalid work of its signer.
import { createHttpServer, type HttpServer } from '../http/server.ts';
import { AuthError } from '../protocol/errors.ts';
import { RequestVerifier } from '../protocol/signing.ts';
import type { Coordinator } from './coordinator.ts';
import type { Epochs } from './epochs.ts';
import { minerRoutes } from './routes/miners.ts';
import { publicRoutes } from './routes/public.ts';

/** Largest JSON body (a heartbeat with thousands of reports stays below it). */
export const MAX_JSON_BYTES = 1 << 20;

export function buildApi(coordinator: Coordinator, verifier = new RequestVerifier(), epochs: Epochs | null = null): HttpServer {
  const app = createHttpServer({
    bodyLimit: MAX_JSON_BYTES,
    verifier,
    onRefused: (req, err) => {
      if (!req.signer || err instanceof AuthError || err.code === 'stake_too_low') return;
      coordinator.state.ledger.logWork({ minerId: req.signer, runId: null, kind: 'invalid', detail: `${req.method} ${req.url.slice(0, 120)}: ${err.message.slice(0, 200)}` }, Date.now());
    },
    onFailure: (req, err) => console.error(`orchestrator: ${req.method} ${req.url}:`, err.cause ?? err),
  });
  publicRoutes(app, coordinator, epochs !== null);
  minerRoutes(app, coordinator, epochs);
  return app;
}
