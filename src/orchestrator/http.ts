// The orchestrator's HTTP API (fastify). Miner routes are signed (see
// src/protocol/signing.ts) and every body is validated before use; errors map
// to clear 4xx answers and are counted against the miner that sent them.
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { AuthError, NimbleError } from '../protocol/errors.ts';
import { CreateRunRequest } from '../api/schemas.ts';
import {
  HeartbeatRequest,
  JoinRequest,
  parseJson,
} from '../protocol/messages.ts';
import { RequestVerifier } from '../protocol/signing.ts';
import type { Coordinator } from './coordinator.ts';
import type { Epochs } from './epochs.ts';
import { CoordinatorError } from './errors.ts';
import { assembleCheckpoint, epochView, runView } from './views.ts';

/** Largest JSON body. */
const MAX_JSON_BYTES = 1 << 20;
/** Largest binary body (a frame or a stage state). */
export const MAX_FRAME_BYTES = 256 << 20;

declare module 'fastify' {
  interface FastifyRequest {
    minerId?: string;
  }
}

export function buildApi(coordinator: Coordinator, verifier = new RequestVerifier(), epochs: Epochs | null = null): FastifyInstance {
  const app = Fastify({ logger: false, bodyLimit: MAX_FRAME_BYTES });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: MAX_FRAME_BYTES }, (_req, body, done) => done(null, body));

  const raw = (req: FastifyRequest): Uint8Array => (Buffer.isBuffer(req.body) ? req.body : new Uint8Array(0));
  const json = <T extends Parameters<typeof parseJson>[0]>(req: FastifyRequest, schema: T, what: string) => {
    const body = raw(req);
    if (body.length > MAX_JSON_BYTES) throw new CoordinatorError(413, `${what} is ${body.length} bytes; the limit is ${MAX_JSON_BYTES}`);
    return parseJson(schema, body, what);
  };
  const signed = async (req: FastifyRequest): Promise<void> => {
    req.minerId = await verifier.verify({ method: req.method, path: req.url, headers: req.headers, body: raw(req) });
  };
  const int = (value: unknown, name: string): number => {
    const n = Number(value);
    if (!Number.isSafeInteger(n) || n < 0) throw new CoordinatorError(400, `${name} must be a non-negative integer`);
    return n;
  };

  app.setErrorHandler((err: Error & { statusCode?: number }, req: FastifyRequest, reply: FastifyReply) => {
    let status = 500;
    if (err instanceof AuthError) status = err.code === 'overloaded' ? 503 : 401;
    else if (err instanceof NimbleError) status = err.status;
    else if (err instanceof CoordinatorError) status = err.status;
    else if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500) status = err.statusCode;
    const refusedJoin = status === 403 && req.url === '/miners/join'; // too little stake: not a fault
    if (status >= 400 && status < 500 && req.minerId && status !== 401 && !refusedJoin) {
      coordinator.db.logWork(req.minerId, null, 'invalid', 1, Date.now(), null, `${req.method} ${req.url.slice(0, 120)}: ${err.message.slice(0, 200)}`);
    }
    if (status >= 500) console.error(`orchestrator: ${req.method} ${req.url}:`, err);
    reply.status(status).send({ error: status >= 500 ? 'internal error' : err.message });
  });

  // ---- public ----------------------------------------------------------------
  app.get('/health', async () => ({ ok: true }));
  app.get('/miners', async () => coordinator.db.miners().map((m) => ({ ...m, alive: Boolean(m.alive) })));
  app.get('/runs', async () => coordinator.db.runs().map((r) => runView(coordinator, r)));
  app.get('/runs/:id', async (req) => {
    const run = coordinator.db.run((req.params as { id: string }).id);
    if (!run) throw new CoordinatorError(404, `unknown run ${(req.params as { id: string }).id}`);
    return runView(coordinator, run);
  });
  app.post('/runs', async (req, reply) => {
    const run = coordinator.createRun(json(req, CreateRunRequest, 'run request'));
    reply.status(201);
    return runView(coordinator, run);
  });
  app.get('/runs/:id/checkpoint', async (req, reply) => {
    const bytes = await assembleCheckpoint(coordinator, (req.params as { id: string }).id);
    reply.header('content-type', 'application/octet-stream');
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });
  app.get('/work', async () => coordinator.db.workSummary());
  app.get('/epochs', async () => ({ paid: epochs !== null, epochs: coordinator.db.epochs().map((e) => epochView(coordinator.db, e)) }));
  app.get('/epochs/:id', async (req) => {
    const id = int((req.params as { id: string }).id, 'epoch id');
    const e = coordinator.db.epoch(id);
    if (!e) throw new CoordinatorError(404, `unknown epoch ${id}`);
    return epochView(coordinator.db, e);
  });

  // ---- miners (signed) -----------------------------------------------------
  app.post('/miners/join', { preHandler: signed }, async (req) => {
    const body = json(req, JoinRequest, 'join request');
    await epochs?.checkStake(req.minerId!);
    return coordinator.join(req.minerId!, body);
  });
  app.post('/miners/heartbeat', { preHandler: signed }, async (req) => coordinator.heartbeat(req.minerId!, json(req, HeartbeatRequest, 'heartbeat')));
  app.post('/bandwidth', { preHandler: signed }, async (req) => ({ bytes: raw(req).length }));
  app.get('/blobs/:id', { preHandler: signed }, async (req, reply) => {
    const bytes = await coordinator.blobs.get((req.params as { id: string }).id);
    const a = coordinator.db.assignmentOf(req.minerId!);
    if (a) coordinator.db.addRunCounters(a.run_id, { bytes: bytes.length }); // downloads are traffic too
    reply.header('content-type', 'application/octet-stream');
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });
  const roundParams = (req: FastifyRequest): { runId: string; stage: number; round: number } => {
    const p = req.params as Record<string, string>;
    return { runId: p.runId, stage: int(p.stage, 'stage'), round: int(p.round, 'round') };
  };
  app.post('/runs/:runId/stages/:stage/rounds/:round/pseudo-gradients/:partition', { preHandler: signed }, async (req) => {
    const { runId, stage, round } = roundParams(req);
    const partition = int((req.params as Record<string, string>).partition, 'partition');
    const samples = int((req.query as Record<string, string>).samples, 'samples');
    return { blob: await coordinator.merges.putPseudoGradient(req.minerId!, runId, stage, round, partition, samples, raw(req)) };
  });
  app.post('/runs/:runId/stages/:stage/rounds/:round/merged/:partition', { preHandler: signed }, async (req) => {
    const { runId, stage, round } = roundParams(req);
    const partition = int((req.params as Record<string, string>).partition, 'partition');
    return { blob: await coordinator.merges.putMerged(req.minerId!, runId, stage, round, partition, raw(req)) };
  });
  app.post('/runs/:runId/checks/:microbatch', { preHandler: signed }, async (req) => {
    const p = req.params as Record<string, string>;
    const microbatch = int(p.microbatch, 'microbatch');
    const r = await coordinator.checks.submit(req.minerId!, p.runId, microbatch, raw(req));
    return { status: r.status, detail: r.detail };
  });
  app.post('/runs/:runId/stages/:stage/rounds/:round/state', { preHandler: signed }, async (req) => {
    const { runId, stage, round } = roundParams(req);
    return { blob: await coordinator.merges.putState(req.minerId!, runId, stage, round, raw(req)) };
  });
  return app;
}
