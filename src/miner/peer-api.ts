// A miner's HTTP API for its peers: `POST /forward` (an activation from a
// previous-stage replica) and `POST /backward` (a gradient from a next-stage
// one), both tensor frames sent as raw binary bodies signed with the sender's
// session key, and `GET /health`. Only the right parties get through:
//   - the signature is checked from the headers, against the session keys the
//     orchestrator gave for this miner's neighbouring replicas (anyone else is
//     refused before the body is read);
//   - an activation must come from a previous-stage replica and carry the
//     orchestrator's ticket for its microbatch (so nobody can make this miner
//     work on a microbatch the orchestrator did not issue);
//   - a gradient must come from the replica this miner sent that microbatch's
//     activation to, for the attempt it holds;
//   - the frame itself (length, shape, dtype, codec, sha256, finite values in
//     range, size) is checked by `decodeFrame` before anything is queued.
// An accepted frame is answered with this miner's receipt of it
// (src/protocol/evidence.ts), which the sender reports.
import { Type, type Static } from '@sinclair/typebox';
import { createHttpServer, type HttpServer } from '../http/server.ts';
import { signerOf } from '../http/signed.ts';
import { NimbleError } from '../protocol/errors.ts';
import { signReceipt, verifyTicket } from '../protocol/evidence.ts';
import { decodeFrame, readFrameHeader } from '../protocol/frame.ts';
import { BackwardMeta, ForwardMeta, parse, PeerAccepted, type Peer } from '../protocol/messages.ts';
import type { SessionKey } from '../protocol/session-key.ts';
import type { RequestVerifier } from '../protocol/signing.ts';
import type { Job } from './pipeline.ts';
import type { StageRunner } from './stage-runner.ts';

/** Largest activation or gradient frame a miner accepts. */
export const MAX_PEER_FRAME_BYTES = 64 << 20;
/** Jobs waiting past which new work is refused (503: try another replica). */
export const MAX_QUEUE = 64;
/** Largest magnitude of an activation or gradient value: far above any a healthy model sends, far below what breaks the arithmetic. */
export const MAX_VALUE = 1e4;

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Number({ minimum: 0 });

/** The time of every job of one kind, as sums: two readings give a window's mean and spread; `cpuMs`: the process's CPU during them (absent from older miners). */
export const JobTimeSums = Type.Object({ count: Count, ms: Ms, msSquared: Ms, cpuMs: Type.Optional(Ms) });
export type JobTimeSums = Static<typeof JobTimeSums>;

export const MinerStats = Type.Object({
  forward: Count,
  backward: Count,
  /** partitions merged */
  merges: Count,
  bytesSent: Count,
  /** peer requests refused with a 4xx */
  rejected: Count,
  /** the pipeline's jobs, timed from start to end: forwards (the last stage's forward and backward are one job) and backwards */
  jobTimes: Type.Optional(Type.Object({ forward: JobTimeSums, backward: JobTimeSums })),
});
/** A miner's counters, for the CLI and tests. */
export type MinerStats = Static<typeof MinerStats>;

export const PeerHealth = Type.Object({
  ok: Type.Literal(true),
  address: Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' }),
  stage: Type.Union([Type.Object({ runId: Type.String(), stage: Count, round: Count }), Type.Null()]),
  stats: MinerStats,
});
export type PeerHealth = Static<typeof PeerHealth>;

/** A tensor frame, as received (checked by `decodeFrame`, not by a schema). */
const FrameBody = Type.Uint8Array();

/** Where accepted work goes: the miner's pipeline. */
export interface PeerWork {
  /** the stage held now, or null */
  readonly runner: StageRunner | null;
  /** jobs waiting */
  readonly queued: number;
  /** whether the gradient of this microbatch's attempt is expected from `sender` (the miner its activation went to) */
  expectsGradient(microbatch: number, attempt: number, sender: string): boolean;
  /** queues a checked activation or gradient (and starts working) */
  push(job: Job): void;
}

/** The network this miner is part of, as its orchestrator proved it (src/protocol/network.ts). */
export interface PeerNetwork {
  domain: string;
  /** the orchestrator's key: it signs the tickets */
  orchestratorKey: string;
  /** this miner's session key: it signs the receipts */
  sessionKey: SessionKey;
  /** the neighbouring replicas, from the latest heartbeat reply */
  previousStage(): readonly Peer[];
  nextStage(): readonly Peer[];
}

export interface PeerApiOptions {
  /** checks session signatures against the neighbours' keys */
  verifier: RequestVerifier;
  network: PeerNetwork;
  work: PeerWork;
  /** `rejected` is counted here */
  stats: MinerStats;
  /** what `GET /health` answers */
  health(): PeerHealth;
  log(line: string): void;
  /** largest frame accepted (default MAX_PEER_FRAME_BYTES) */
  maxFrameBytes?: number;
}

export function buildPeerApi(options: PeerApiOptions): HttpServer {
  const { work, network } = options;
  const maxBytes = options.maxFrameBytes ?? MAX_PEER_FRAME_BYTES;
  const app = createHttpServer({
    bodyLimit: 1 << 16,
    verifier: options.verifier,
    onRefused: () => void options.stats.rejected++,
    onFailure: (_req, err) => options.log(`peer request failed: ${err.message}`),
  });
  const frameRoute = {
    bodyLimit: maxBytes,
    config: { signed: 'session' as const },
    schema: { body: FrameBody, response: { 202: PeerAccepted } },
  };

  /** The frame's values and meta, if it fits the stage held and the queue has room. */
  const accept = (body: Uint8Array): { runner: StageRunner; data: Float32Array; meta: unknown; sha: string } => {
    const runner = work.runner;
    if (!runner) throw new NimbleError('conflict', 'this miner holds no stage');
    const frame = decodeFrame(body, { shape: runner.activationShape, codecs: ['f32', 'f16', 'int8-row'], maxBytes });
    for (let i = 0; i < frame.data.length; i++) {
      if (Math.abs(frame.data[i]) > MAX_VALUE) throw new NimbleError('invalid', `value ${frame.data[i]} at ${i} is out of range (|x| <= ${MAX_VALUE})`);
    }
    if (work.queued >= MAX_QUEUE) throw new NimbleError('overloaded', 'queue full; try another replica');
    return { runner, data: frame.data, meta: frame.meta, sha: readFrameHeader(body).header.sha256 };
  };
  const receipt = (runner: StageRunner, microbatch: number, attempt: number, phase: 'forward' | 'backward', frameSha: string): string =>
    signReceipt(network.sessionKey, network.domain, { runId: runner.runId, microbatch, attempt, stage: runner.assignment.stage, phase, frameSha });

  app.post('/forward', frameRoute, async (req, reply) => {
    const sender = signerOf(req);
    if (!network.previousStage().some((p) => p.id === sender)) throw new NimbleError('forbidden', `${sender} is not a replica of the previous stage`);
    const { runner, data, meta: raw, sha } = accept(req.body);
    const meta = parse(ForwardMeta, raw, 'forward meta');
    const held = runner.assignment.stage;
    if (meta.runId !== runner.runId || meta.stage !== held || meta.stage === 0) {
      throw new NimbleError('conflict', `work for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${held} of ${runner.runId}`);
    }
    if (!verifyTicket(network.orchestratorKey, network.domain, meta, meta.ticket)) {
      throw new NimbleError('forbidden', `microbatch ${meta.microbatch} attempt ${meta.attempt} has no valid ticket from the orchestrator`);
    }
    work.push({ kind: 'forward', meta, data, frame: req.body, sha, sender });
    return reply.status(202).send({ queued: work.queued, receipt: receipt(runner, meta.microbatch, meta.attempt, 'forward', sha) });
  });

  app.post('/backward', frameRoute, async (req, reply) => {
    const sender = signerOf(req);
    if (!network.nextStage().some((p) => p.id === sender)) throw new NimbleError('forbidden', `${sender} is not a replica of the next stage`);
    const { runner, data, meta: raw, sha } = accept(req.body);
    const meta = parse(BackwardMeta, raw, 'backward meta');
    const held = runner.assignment.stage;
    if (meta.runId !== runner.runId || meta.stage !== held) {
      throw new NimbleError('conflict', `gradient for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${held} of ${runner.runId}`);
    }
    if (!work.expectsGradient(meta.microbatch, meta.attempt, sender)) {
      throw new NimbleError('conflict', `microbatch ${meta.microbatch} attempt ${meta.attempt} is not held here awaiting a gradient from ${sender} (abandoned or unknown)`);
    }
    work.push({ kind: 'backward', meta, data, sha });
    return reply.status(202).send({ queued: work.queued, receipt: receipt(runner, meta.microbatch, meta.attempt, 'backward', sha) });
  });

  app.get('/health', { schema: { response: { 200: PeerHealth } } }, async () => options.health());
  return app;
}
