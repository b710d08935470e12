// The miners' routes (signed): joining, heartbeats, the bandwidth probe,
// blob downloads (only what the miner's work names: ../blobs/access.ts),
// merge-round uploads and spot-check answers. Message
// contracts in src/protocol/messages.ts; binary bodies (tensor frames, stage
// states, check bundles) are validated by their decoders. An upload (up to
// 256 MiB, a stage state up to its stage's size; held whole until checked) is
// refused from its headers unless its signer has a part in that merge round
// or was asked for that spot check.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { FastifyRequest } from 'fastify';
import { BINARY, type HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { convertUrlPart } from '../../http/validator.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { HeartbeatReply, HeartbeatRequest, JoinReply, JoinRequest } from '../../protocol/messages.ts';
import { blobReaderOf, type BlobAccess } from '../blobs/access.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { Epochs } from '../rewards/epochs.ts';

/** Largest body of a binary upload (a frame, a check bundle). */
export const MAX_UPLOAD_BYTES = 256 << 20;
/**
 * Largest body of a stage state, a single replica's upload: 8 bytes a
 * parameter, so 2 GiB holds every stage a miner's 4 GiB WebAssembly memory
 * can train (24 bytes a parameter). Each upload is held to its own stage's
 * size (MergeUploads.expectStateSaver), declared before its body is read.
 */
export const MAX_STATE_BYTES = 2 ** 31;
/** Largest body of the bandwidth probe (1 MiB is sent). */
const MAX_PROBE_BYTES = 2 << 20;

const Count = Type.Integer({ minimum: 0, maximum: 2 ** 31 - 1 });
const Stage = Type.Integer({ minimum: 0, maximum: 1023 });
const RunId = Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' });
const BlobId = Type.String({ pattern: '^[0-9a-f]{64}$' });
const RoundParams = Type.Object({ runId: RunId, stage: Stage, round: Count });
const PartitionParams = Type.Object({ runId: RunId, stage: Stage, round: Count, partition: Count });
const CheckParams = Type.Object({ runId: RunId, microbatch: Type.Integer({ minimum: 1, maximum: 2 ** 31 - 1 }) });
const Samples = Type.Object({ samples: Count });
const Stored = Type.Object({ blob: BlobId });
/** Joining (and the bandwidth probe before it) is signed with the miner's wallet key; everything after with the session key it bound. */
const wallet = { signed: 'wallet' } as const;
const signed = { signed: 'session' } as const;

export function minerRoutes(app: HttpServer, c: Coordinator, epochs: Epochs | null, access: BlobAccess): void {
  app.post('/miners/join', { config: wallet, schema: { body: JoinRequest, response: { 200: JoinReply } } }, async (req) => {
    await epochs?.checkStake(signerOf(req));
    return c.join(signerOf(req), req.body);
  });
  app.post('/miners/heartbeat', { config: signed, schema: { body: HeartbeatRequest, response: { 200: HeartbeatReply } } }, async (req) => c.heartbeat(signerOf(req), req.body));
  app.post('/bandwidth', { config: wallet, bodyLimit: MAX_PROBE_BYTES, schema: { response: { 200: Type.Object({ bytes: Count }) } } }, async (req) => ({
    bytes: req.rawBody?.length ?? 0,
  }));
  // a blob the miner's current work names (its stage's state, its run's data, its round's slices, its deployment's file), else 403
  app.get('/blobs/:id', { config: signed, schema: { params: Type.Object({ id: BlobId }) } }, async (req, reply) => {
    await access.authorize(blobReaderOf(req.verified), req.params.id);
    const bytes = await c.blobs.get(req.params.id);
    const a = c.state.runs.assignmentOf(signerOf(req));
    if (a) c.state.runs.addCounters(a.runId, { bytes: bytes.length }); // downloads are traffic too
    void reply.header('content-type', BINARY);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });

  // an upload is refused before its body is read when its signer is not a replica of that round (or was not asked for that check)
  const roundUpload = (params: typeof RoundParams | typeof PartitionParams, query?: typeof Samples, state = false) => ({
    config: signed,
    bodyLimit: state ? MAX_STATE_BYTES : MAX_UPLOAD_BYTES,
    onRequest: uploadGuard(state ? MAX_STATE_BYTES : MAX_UPLOAD_BYTES, params, query, (signer, { runId, stage, round }) =>
      state ? c.mergeUploads.expectStateSaver(signer, { runId, stage, round }) : c.mergeUploads.expectReplica(signer, { runId, stage, round }),
    ),
  });
  app.post(
    '/runs/:runId/stages/:stage/rounds/:round/pseudo-gradients/:partition',
    { ...roundUpload(PartitionParams, Samples), schema: { params: PartitionParams, querystring: Samples, response: { 200: Stored } } },
    async (req) => {
      const { partition, ...key } = req.params;
      return { blob: await c.mergeUploads.putPseudoGradient(signerOf(req), key, partition, req.query.samples, binaryBody(req.rawBody)) };
    },
  );
  app.post('/runs/:runId/stages/:stage/rounds/:round/merged/:partition', { ...roundUpload(PartitionParams), schema: { params: PartitionParams, response: { 200: Stored } } }, async (req) => {
    const { partition, ...key } = req.params;
    return { blob: await c.mergeUploads.putMerged(signerOf(req), key, partition, binaryBody(req.rawBody)) };
  });
  app.post('/runs/:runId/stages/:stage/rounds/:round/state', { ...roundUpload(RoundParams, undefined, true), schema: { params: RoundParams, response: { 200: Stored } } }, async (req) => ({
    blob: await c.mergeUploads.putState(signerOf(req), req.params, binaryBody(req.rawBody)),
  }));
  app.post(
    '/runs/:runId/checks/:microbatch',
    {
      config: signed,
      bodyLimit: MAX_UPLOAD_BYTES,
      onRequest: uploadGuard(MAX_UPLOAD_BYTES, CheckParams, undefined, (signer, { runId, microbatch }) => {
        if (!c.state.spotChecks.asked(signer, runId, microbatch)) throw new NimbleError('conflict', `no open spot check of microbatch ${microbatch} in run ${runId} for this miner`);
      }),
      schema: {
        params: CheckParams,
        response: { 200: Type.Object({ status: Type.String(), detail: Type.String() }) },
      },
    },
    async (req) => {
      const r = await c.checks.submit(signerOf(req), req.params.runId, req.params.microbatch, binaryBody(req.rawBody));
      return { status: r.status, detail: r.detail };
    },
  );
}

function binaryBody(raw: Uint8Array | undefined): Uint8Array {
  return raw ?? new Uint8Array(0);
}

/**
 * What an upload's headers must show before its body is read (after its
 * signature): a size within the route's limit, valid path params and query
 * (checked as fastify checks them afterwards), and a signer `allowed` to send
 * it. The refusals are those the route would give after reading the body.
 * When `allowed` names a limit of its own (a stage state: its stage's size),
 * the upload must declare its length, and within that limit.
 */
function uploadGuard<P extends TSchema>(
  routeLimit: number,
  params: P,
  query: TSchema | undefined,
  allowed: (signer: string, p: Static<P>) => number | void,
): (req: FastifyRequest) => Promise<void> {
  return async (req) => {
    const declared = req.headers['content-length'] === undefined ? null : Number(req.headers['content-length']);
    if (declared !== null && declared > routeLimit) throw new NimbleError('too_large', 'the body is larger than this route accepts', 413);
    const p = checked(params, req.params, 'params');
    if (query) checked(query, req.query, 'querystring');
    const limit = allowed(signerOf(req), p);
    if (limit === undefined) return;
    if (declared === null) throw new NimbleError('length_required', 'this upload must declare its Content-Length', 411);
    if (declared > limit) throw new NimbleError('too_large', `the body is ${declared} bytes; this upload takes at most ${limit}`, 413);
  };
}

function checked<T extends TSchema>(schema: T, raw: unknown, what: string): Static<T> {
  const value = convertUrlPart(schema, raw); // as the route's own validator will (src/http/validator.ts)
  if (Value.Check(schema, value)) return value;
  const first = Value.Errors(schema, value).First();
  throw new NimbleError('invalid', `invalid ${what}: ${first?.path || '/'} ${first?.message ?? 'does not match the schema'}`);
}
