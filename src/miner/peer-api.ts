// A miner's HTTP API for its peers: `POST /forward` (an activation from a
// previous-stage replica) and `POST /backward` (a gradient from a next-stage
// one), both signed tensor frames sent as raw binary bodies, and `GET /health`.
// A frame is checked before anything is queued: the signature over the body
// as received, then the frame (length, shape, dtype, codec, sha256, finite
// values, size) by `decodeFrame`, then its meta against the stage held. Built
// on the shared server (src/http/server.ts): a refusal answers
// `{ error, code }` with a 4xx, is counted, and its verified sender is
// reported in the next heartbeat (the orchestrator counts it against them).
import { Type, type Static } from '@sinclair/typebox';
import { createHttpServer, type HttpServer } from '../http/server.ts';
import { NimbleError } from '../protocol/errors.ts';
import { decodeFrame, readFrameHeader } from '../protocol/frame.ts';
import { BackwardMeta, ForwardMeta, parse } from '../protocol/messages.ts';
import type { RequestVerifier } from '../protocol/signing.ts';
import type { Job } from './pipeline.ts';
import type { StageRunner } from './stage-runner.ts';

/** Largest activation or gradient frame a miner accepts. */
export const MAX_PEER_FRAME_BYTES = 64 << 20;
/** Jobs waiting past which new work is refused (503: try another replica). */
export const MAX_QUEUE = 64;
/** Refusals kept for the next heartbeat (its `rejected` list holds at most this many). */
const MAX_REFUSALS = 1024;

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });

export const MinerStats = Type.Object({
  forward: Count,
  backward: Count,
  /** partitions merged */
  merges: Count,
  bytesSent: Count,
  /** peer requests refused with a 4xx */
  rejected: Count,
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

const Queued = Type.Object({ queued: Count });
/** A tensor frame, as received (checked by `decodeFrame`, not by a schema). */
const FrameBody = Type.Uint8Array();

/** A peer request refused, by its verified sender. */
export interface Refusal {
  sender: string;
  reason: string;
}

/** Refused peer requests with a verified sender, until a heartbeat reports them. */
export class Refusals {
  private list: Refusal[] = [];

  add(sender: string, reason: string): void {
    if (this.list.length < MAX_REFUSALS) this.list.push({ sender, reason: reason.slice(0, 256) });
  }

  /** The refusals to report in a heartbeat (at most its limit); they are forgotten unless put back. */
  take(): Refusal[] {
    return this.list.splice(0, MAX_REFUSALS);
  }

  /** Puts back refusals a failed heartbeat did not deliver. */
  putBack(refusals: Refusal[]): void {
    this.list.unshift(...refusals);
  }
}

/** Where accepted work goes: the miner's pipeline. */
export interface PeerWork {
  /** the stage held now, or null */
  readonly runner: StageRunner | null;
  /** jobs waiting */
  readonly queued: number;
  /** queues a checked activation or gradient (and starts working) */
  push(job: Job): void;
}

export interface PeerApiOptions {
  verifier: RequestVerifier;
  work: PeerWork;
  refusals: Refusals;
  /** `rejected` is counted here */
  stats: MinerStats;
  /** what `GET /health` answers */
  health(): PeerHealth;
  log(line: string): void;
  /** largest frame accepted (default MAX_PEER_FRAME_BYTES) */
  maxFrameBytes?: number;
}

export function buildPeerApi(options: PeerApiOptions): HttpServer {
  const { work } = options;
  const maxBytes = options.maxFrameBytes ?? MAX_PEER_FRAME_BYTES;
  const app = createHttpServer({
    bodyLimit: 1 << 16,
    verifier: options.verifier,
    onRefused: (req, err) => {
      options.stats.rejected++;
      if (req.signer) options.refusals.add(req.signer, err.message);
    },
    onFailure: (_req, err) => options.log(`peer request failed: ${err.message}`),
  });
  const frameRoute = {
    bodyLimit: maxBytes,
    config: { signed: true },
    schema: { body: FrameBody, response: { 202: Queued } },
  };

  /** The frame's values and meta, if it fits the stage held and the queue has room. */
  const accept = (body: Uint8Array): { runner: StageRunner; data: Float32Array; meta: unknown } => {
    const runner = work.runner;
    if (!runner) throw new NimbleError('conflict', 'this miner holds no stage');
    const frame = decodeFrame(body, { shape: runner.activationShape, codecs: ['f32', 'f16', 'int8-row'], maxBytes });
    if (work.queued >= MAX_QUEUE) throw new NimbleError('overloaded', 'queue full; try another replica');
    return { runner, data: frame.data, meta: frame.meta };
  };

  app.post('/forward', frameRoute, async (req, reply) => {
    const { runner, data, meta: raw } = accept(req.body);
    const meta = parse(ForwardMeta, raw, 'forward meta');
    const held = runner.assignment.stage;
    if (meta.runId !== runner.runId || meta.stage !== held || meta.stage === 0) {
      throw new NimbleError('conflict', `work for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${held} of ${runner.runId}`);
    }
    if (meta.route.length !== meta.stage) throw new NimbleError('invalid', `route has ${meta.route.length} hops for stage ${meta.stage}`);
    work.push({ kind: 'forward', meta, data, frame: req.body, sha: readFrameHeader(req.body).header.sha256 });
    return reply.status(202).send({ queued: work.queued });
  });

  app.post('/backward', frameRoute, async (req, reply) => {
    const { runner, data, meta: raw } = accept(req.body);
    const meta = parse(BackwardMeta, raw, 'backward meta');
    const held = runner.assignment.stage;
    if (meta.runId !== runner.runId || meta.stage !== held) {
      throw new NimbleError('conflict', `gradient for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${held} of ${runner.runId}`);
    }
    if (!runner.holds(meta.microbatch)) throw new NimbleError('conflict', `microbatch ${meta.microbatch} is not held here (abandoned or unknown)`);
    work.push({ kind: 'backward', meta, data });
    return reply.status(202).send({ queued: work.queued });
  });

  app.get('/health', { schema: { response: { 200: PeerHealth } } }, async () => options.health());
  return app;
}
