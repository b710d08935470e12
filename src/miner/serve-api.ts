// The serving half of a miner's peer API (docs/inference.md, "Serve"): the
// orchestrator drives a generation stage by stage, and each call runs this
// miner's StageInference on one session's rows.
//
//   POST /infer      a tensor frame: token ids (stage 0, shape [n]) or
//                    activation rows (shape [n, C]); meta {deploymentId,
//                    stage, session, reset?, codec?}. The first call of a
//                    session (or one with `reset`: a restarted context window)
//                    joins it with an empty cache. Answers with a frame: the
//                    rows' activations [n, C], or on the last stage the logits
//                    of the last row [1, V], in `codec` (f32 unless f16 asked).
//   POST /infer/end  {deploymentId, session}: frees the session's cache.
//
// Only the orchestrator may call these (signed with its key, under the
// address orchestratorAddress derives from it). A session nobody used for
// SESSION_IDLE_MS is freed, so a generation the orchestrator abandoned (it
// died, its client left) does not hold a cache slot for ever.
import { Type } from '@sinclair/typebox';
import type { HttpServer } from '../http/server.ts';
import { signerOf } from '../http/signed.ts';
import { NimbleError } from '../protocol/errors.ts';
import { decodeFrame, encodeFrame } from '../protocol/frame.ts';
import { parse } from '../protocol/messages.ts';
import type { ServedStage } from './deployment.ts';

/** A session idle this long is freed. */
export const SESSION_IDLE_MS = 60_000;
/** Largest frame a serving call takes (a whole prompt's activations). */
export const MAX_INFER_FRAME_BYTES = 32 << 20;
const MAX_VALUE = 1e4;

const SessionId = Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$' });
export const InferMeta = Type.Object({
  deploymentId: Type.String({ minLength: 1, maxLength: 64 }),
  stage: Type.Integer({ minimum: 0, maximum: 1023 }),
  session: SessionId,
  reset: Type.Optional(Type.Boolean()),
  codec: Type.Optional(Type.Union([Type.Literal('f32'), Type.Literal('f16')])),
});
export const InferEnd = Type.Object({ deploymentId: Type.String({ minLength: 1, maxLength: 64 }), session: SessionId });

export interface ServeApiOptions {
  /** the stage served now (null: none) */
  served(): ServedStage | null;
  /** the address the orchestrator signs with */
  orchestrator: string;
  log(line: string): void;
  now?: () => number;
}

export function serveRoutes(app: HttpServer, options: ServeApiOptions): { sweep(): void } {
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

  app.post('/infer', { bodyLimit: MAX_INFER_FRAME_BYTES, config: { signed: 'session' as const }, schema: { body: Type.Uint8Array() } }, async (req, reply) => {
    const sender = signerOf(req);
    if (sender.toLowerCase() !== options.orchestrator.toLowerCase()) throw new NimbleError('forbidden', 'only the orchestrator drives a generation');
    sweep();
    const s = options.served();
    if (!s) throw new NimbleError('conflict', 'this miner serves no deployment stage (yet)');
    const inf = s.inference;
    const C = inf.config.channels;
    const frame = decodeFrame(req.body, { shape: inf.isFirst ? [-1] : [-1, C], codecs: ['f32', 'f16'], maxBytes: MAX_INFER_FRAME_BYTES });
    const meta = parse(InferMeta, frame.meta, 'infer meta');
    stage(sender, meta.deploymentId);
    if (meta.stage !== s.assignment.stage) throw new NimbleError('conflict', `this miner serves stage ${s.assignment.stage}, not ${meta.stage}`);
    let input: Int32Array | Float32Array;
    if (inf.isFirst) {
      input = new Int32Array(frame.data.length);
      for (let i = 0; i < input.length; i++) {
        const t = frame.data[i];
        if (!(Number.isInteger(t) && t >= 0 && t < inf.config.vocabSize)) throw new NimbleError('invalid', `token ${t} at ${i} is outside the vocabulary of ${inf.config.vocabSize}`);
        input[i] = t;
      }
    } else {
      for (let i = 0; i < frame.data.length; i++) {
        if (!(Math.abs(frame.data[i]) <= MAX_VALUE)) throw new NimbleError('invalid', `activation ${frame.data[i]} at ${i} is out of range (|x| <= ${MAX_VALUE})`);
      }
      input = frame.data;
    }
    if (input.length === 0) throw new NimbleError('invalid', 'no rows');
    if (meta.reset) inf.leave(meta.session);
    if (!inf.has(meta.session)) {
      try {
        inf.join(meta.session);
      } catch (err) {
        throw new NimbleError('overloaded', (err as Error).message);
      }
    }
    lastUsed.set(meta.session, now());
    let out: Float32Array;
    try {
      out = inf.run([{ session: meta.session, input }]);
    } catch (err) {
      // the session's state is unknown to the orchestrator now: drop it
      inf.leave(meta.session);
      lastUsed.delete(meta.session);
      throw new NimbleError('invalid', (err as Error).message);
    }
    const shape = inf.isLast ? [1, inf.config.vocabSize] : [out.length / C, C];
    const bytes = encodeFrame(out, shape, meta.codec ?? 'f32', { session: meta.session, stage: meta.stage, position: inf.position(meta.session) });
    return reply.status(200).header('content-type', 'application/octet-stream').send(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  });

  app.post('/infer/end', { config: { signed: 'session' as const }, schema: { body: InferEnd, response: { 200: Type.Object({ ok: Type.Literal(true) }) } } }, async (req) => {
    const s = stage(signerOf(req), req.body.deploymentId);
    s.inference.leave(req.body.session);
    lastUsed.delete(req.body.session);
    return { ok: true as const };
  });

  return { sweep };
}
