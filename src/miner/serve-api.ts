// The serving half of a miner's peer API (docs/inference.md, "Serve"): the
// orchestrator drives generations stage by stage, and each call runs this
// miner's StageInference once on the rows of one or more sessions
// (continuous batching: sessions join and leave between calls).
//
//   POST /infer      a tensor frame: token ids (stage 0, shape [n]) or
//                    activation rows (shape [n, C]); meta {deploymentId,
//                    stage, sessions: [{id, rows, reset?}…], codec?}: the
//                    rows of each session in turn, `rows` of them. A session
//                    with `reset` (its first call, a restarted context window,
//                    or a replay after a failover) starts again with an empty
//                    cache; a session without it must be on the stage (else
//                    409: the orchestrator replays its window). Answers with a
//                    frame: every row's activations [n, C], or on the last
//                    stage the logits of each session's last row
//                    [sessions, V], in `codec` (f32 unless f16 asked).
//   POST /infer/end  {deploymentId, session}: frees the session's cache.
//
// Everything is checked before anything changes: the meta, that the row
// counts sum to the frame's rows, distinct sessions, at most the stage's
// sessions and rows, room for the sessions that join. A call whose run fails
// drops its sessions (their caches are in an unknown state for the
// orchestrator, which replays or ends them).
//
//   GET /infer/channel  an upgrade to a serving channel (./serve-channel.ts):
//                    the same two calls as frames on one connection, the
//                    path the orchestrator uses; the routes above stay for
//                    clients that cannot hold a connection.
//
// Only the orchestrator may call these (signed with its key, under the
// address orchestratorAddress derives from it). A session nobody used for
// SESSION_IDLE_MS is freed, so a generation the orchestrator abandoned (it
// died, its client left) does not hold a cache slot for ever.
import { Type, type Static } from '@sinclair/typebox';
import type { HttpServer } from '../http/server.ts';
import { signerOf } from '../http/signed.ts';
import { NimbleError } from '../protocol/errors.ts';
import { decodeFrame, encodeFrame } from '../protocol/frame.ts';
import { parse, parseJson } from '../protocol/messages.ts';
import type { RequestVerifier } from '../protocol/signing.ts';
import type { SessionRows } from '../inference/stage-inference.ts';
import type { ServedStage } from './deployment.ts';
import { serveChannels } from './serve-channel.ts';

/** A session idle this long is freed. */
export const SESSION_IDLE_MS = 60_000;
/** Largest frame a serving call takes (a whole prompt's activations). */
export const MAX_INFER_FRAME_BYTES = 32 << 20;
const MAX_VALUE = 1e4;

const SessionId = Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$' });
/** Sessions one call may carry at most (the frame's meta is at most 4 KiB). */
export const MAX_INFER_SESSIONS = 48;
export const InferSessionRows = Type.Object({
  id: SessionId,
  rows: Type.Integer({ minimum: 1, maximum: 1 << 16 }),
  reset: Type.Optional(Type.Boolean()),
}, { additionalProperties: false });
export const InferMeta = Type.Object({
  deploymentId: Type.String({ minLength: 1, maxLength: 64 }),
  stage: Type.Integer({ minimum: 0, maximum: 1023 }),
  sessions: Type.Array(InferSessionRows, { minItems: 1, maxItems: MAX_INFER_SESSIONS }),
  codec: Type.Optional(Type.Union([Type.Literal('f32'), Type.Literal('f16')])),
}, { additionalProperties: false });
export const InferEnd = Type.Object({ deploymentId: Type.String({ minLength: 1, maxLength: 64 }), session: SessionId });

export interface ServeApiOptions {
  /** the stage served now (null: none) */
  served(): ServedStage | null;
  /** the address the orchestrator signs with */
  orchestrator: string;
  /** checks the signed upgrade that opens a serving channel (the peer API's verifier) */
  verifier: RequestVerifier;
  log(line: string): void;
  now?: () => number;
  /** runs before each serving call, on either path (the test helper counts calls and holds them) */
  beforeCall?: (call: 'infer' | 'end') => Promise<void>;
}

export function serveRoutes(app: HttpServer, options: ServeApiOptions): { sweep(): void; closeChannels(): void } {
  const now = options.now ?? Date.now;
  const lastUsed = new Map<string, number>();
  const sweep = (): void => {
    const s = options.served();
    if (!s) return lastUsed.clear();
    const t = now();
    for (const id of s.inference.sessionIds()) {
      if (t - (lastUsed.get(id) ?? 0) < SESSION_IDLE_MS) continue;
      s.inference.leave(id);
      lastUsed.delete(id);
      options.log(`serving: session ${id} idle for ${SESSION_IDLE_MS / 1000} s, its cache freed`);
    }
  };
  const stage = (sender: string, deploymentId: string): ServedStage => {
    if (sender.toLowerCase() !== options.orchestrator.toLowerCase()) throw new NimbleError('forbidden', 'only the orchestrator drives a generation');
    const s = options.served();
    if (!s) throw new NimbleError('conflict', 'this miner serves no deployment stage (yet)');
    if (s.assignment.deploymentId !== deploymentId) throw new NimbleError('conflict', `this miner serves deployment ${s.assignment.deploymentId}, not ${deploymentId}`);
    return s;
  };

  /** A POST /infer body run: the answer's frame bytes, or a NimbleError. */
  const infer = (sender: string, body: Uint8Array): Uint8Array => {
    if (sender.toLowerCase() !== options.orchestrator.toLowerCase()) throw new NimbleError('forbidden', 'only the orchestrator drives a generation');
    sweep();
    const s = options.served();
    if (!s) throw new NimbleError('conflict', 'this miner serves no deployment stage (yet)');
    const inf = s.inference;
    const C = inf.config.channels;
    const frame = decodeFrame(body, { shape: inf.isFirst ? [-1] : [-1, C], codecs: ['f32', 'f16'], maxBytes: MAX_INFER_FRAME_BYTES });
    const meta = parse(InferMeta, frame.meta, 'infer meta');
    stage(sender, meta.deploymentId);
    if (meta.stage !== s.assignment.stage) throw new NimbleError('conflict', `this miner serves stage ${s.assignment.stage}, not ${meta.stage}`);
    const ids = meta.sessions.map((e) => e.id);
    if (new Set(ids).size !== ids.length) throw new NimbleError('invalid', 'a session appears twice in one call');
    if (ids.length > inf.maxSessions) throw new NimbleError('invalid', `${ids.length} sessions in one call; this stage holds at most ${inf.maxSessions}`);
    const rows = meta.sessions.reduce((n, e) => n + e.rows, 0);
    const frameRows = inf.isFirst ? frame.data.length : frame.data.length / C;
    if (rows !== frameRows) throw new NimbleError('invalid', `the sessions' row counts sum to ${rows}, the frame holds ${frameRows} rows`);
    if (rows > inf.maxRows) throw new NimbleError('invalid', `${rows} rows in one call; this stage runs at most ${inf.maxRows}`);
    if (inf.isFirst) {
      for (let i = 0; i < frame.data.length; i++) {
        const t = frame.data[i];
        if (!(Number.isInteger(t) && t >= 0 && t < inf.config.vocabSize)) throw new NimbleError('invalid', `token ${t} at ${i} is outside the vocabulary of ${inf.config.vocabSize}`);
      }
    } else {
      for (let i = 0; i < frame.data.length; i++) {
        if (!(Math.abs(frame.data[i]) <= MAX_VALUE)) throw new NimbleError('invalid', `activation ${frame.data[i]} at ${i} is out of range (|x| <= ${MAX_VALUE})`);
      }
    }
    for (const e of meta.sessions) {
      if (!e.reset && !inf.has(e.id)) throw new NimbleError('conflict', `session ${e.id} is not on this stage (never started, freed, or this miner restarted): replay its window with reset`);
    }
    const joining = meta.sessions.filter((e) => !inf.has(e.id)).length;
    const held = inf.sessionIds().length;
    if (held + joining > inf.maxSessions) throw new NimbleError('overloaded', `this stage holds ${held} of ${inf.maxSessions} sessions: ${joining} more do not fit`);
    // checked: now the sessions that start again do, and the rows run
    const batch: SessionRows[] = [];
    let off = 0;
    for (const e of meta.sessions) {
      if (e.reset) {
        inf.leave(e.id);
        inf.join(e.id);
      }
      lastUsed.set(e.id, now());
      const n = inf.isFirst ? e.rows : e.rows * C;
      const part = frame.data.subarray(off, off + n);
      batch.push({ session: e.id, input: inf.isFirst ? Int32Array.from(part) : part });
      off += n;
    }
    let out: Float32Array;
    try {
      out = inf.run(batch);
    } catch (err) {
      // the sessions' state is unknown to the orchestrator now: drop them
      for (const id of ids) {
        inf.leave(id);
        lastUsed.delete(id);
      }
      throw new NimbleError('invalid', (err as Error).message);
    }
    const shape = inf.isLast ? [ids.length, inf.config.vocabSize] : [rows, C];
    return encodeFrame(out, shape, meta.codec ?? 'f32', { stage: meta.stage, positions: ids.map((id) => inf.position(id)) });
  };

  /** A POST /infer/end body: frees the session's cache. */
  const end = (sender: string, body: Static<typeof InferEnd>): void => {
    const s = stage(sender, body.deploymentId);
    s.inference.leave(body.session);
    lastUsed.delete(body.session);
  };

  app.post('/infer', { bodyLimit: MAX_INFER_FRAME_BYTES, config: { signed: 'session' as const }, schema: { body: Type.Uint8Array() } }, async (req, reply) => {
    await options.beforeCall?.('infer');
    const bytes = infer(signerOf(req), req.body);
    return reply.status(200).header('content-type', 'application/octet-stream').send(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  });

  app.post('/infer/end', { config: { signed: 'session' as const }, schema: { body: InferEnd, response: { 200: Type.Object({ ok: Type.Literal(true) }) } } }, async (req) => {
    await options.beforeCall?.('end');
    end(signerOf(req), req.body);
    return { ok: true as const };
  });

  // the same calls on a serving channel (./serve-channel.ts): one connection, a frame per call
  const channels = serveChannels(app, {
    verifier: options.verifier,
    orchestrator: options.orchestrator,
    maxPayload: MAX_INFER_FRAME_BYTES,
    infer: async (sender, body) => {
      await options.beforeCall?.('infer');
      return infer(sender, body);
    },
    end: async (sender, bytes) => {
      await options.beforeCall?.('end');
      end(sender, parseJson(InferEnd, bytes, 'infer end'));
    },
    log: options.log,
  });

  return { sweep, closeChannels: () => channels.closeAll() };
}
