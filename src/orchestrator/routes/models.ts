// The model store's routes (docs/jobs.md, "Publish"): a developer stores a
// whole-model checkpoint (from one of their jobs, or an uploaded safetensors
// file) and gets back its sha256 with the orchestrator's publish attestation;
// anyone lists the stored models (each with its newest deployment:
// ./deployments.ts) and downloads their files (a published model's is public;
// until it is published, its owner's and its serving miners', signed:
// ../blobs/access.ts; an interrupted download resumes with an HTTP range). Contracts
// in src/api/models.ts; the rules in ../models/models.ts.
import { Readable } from 'node:stream';
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import type { FastifyRequest } from 'fastify';
import { PublishTicket, Sha256, StoredModelList, StoredModelView, StoreFileQuery, StoreFromJobRequest } from '../../api/models.ts';
import { BINARY, type HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { convertUrlPart } from '../../http/validator.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { blobReaderOf, type BlobAccess } from '../blobs/access.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { ChainOptions } from '../rewards/epochs.ts';
import { deploymentViewOf } from '../models/deployments.ts';
import { chainAttester } from '../models/model-attester.ts';
import { MAX_MODEL_BYTES, MAX_MODEL_UPLOADS_AT_ONCE, ModelService, storedModelView, type PublishTerms } from '../models/models.ts';
import type { ModelRecord } from '../state/models.ts';
import { StoreBudget } from '../blobs/store-budget.ts';
import { parseRange } from './jobs.ts';
import { modelUploadRoutes } from './model-uploads.ts';
import type { ModelUploads } from '../models/model-uploads.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ sha256: Sha256 });
const Owner = Type.Object({ owner: Type.Optional(Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' })) });
/** A file is sent in reads of this size. */
const CHUNK_BYTES = 4 << 20;
const URI = /^[!-~]{1,512}$/;

/** `chain`: the orchestrator's chain signer (null without a chain: storing is refused, listing and downloads work). */
export function modelRoutes(
  app: HttpServer, c: Coordinator, chain: Pick<ChainOptions, 'client' | 'signer'> | null, access: BlobAccess, budget: StoreBudget = new StoreBudget(c.state, null), uploads: ModelUploads | null = null,
): ModelService {
  const models = new ModelService(c.state, c.blobs, chain ? chainAttester(chain) : null, budget);
  let uploading = 0;
  const ticket = async (req: FastifyRequest, m: ModelRecord, body: Static<typeof StoreFileQuery>): Promise<PublishTicket> => {
    const terms: PublishTerms = { name: body.name, pricePer1kTokens: BigInt(body.pricePer1kTokens), metadataURI: body.metadataURI ?? metadataUriOf(req, m.sha256) };
    return { model: storedModelView(m, budget), attestation: await models.attest(m, terms) };
  };

  app.post('/models', { config: developer, schema: { body: StoreFromJobRequest, response: { 200: PublishTicket } } }, async (req) => {
    const { job, step, keepDays, payment, ...terms } = req.body;
    return ticket(req, await models.storeFromJob(signerOf(req), job, step, terms.name, keepDays ? { days: keepDays, payment } : undefined), terms);
  });

  // the upload is refused from its headers (size, query, no chain, quota, another upload under way) before its body is read
  app.post(
    '/models/file',
    {
      config: developer,
      bodyLimit: MAX_MODEL_BYTES,
      onRequest: async (req, reply) => {
        if (Number(req.headers['content-length']) > MAX_MODEL_BYTES) throw new NimbleError('too_large', `a model file may have at most ${MAX_MODEL_BYTES} bytes`, 413);
        const query = convertUrlPart(StoreFileQuery, req.query);
        if (!Value.Check(StoreFileQuery, query)) {
          const first = Value.Errors(StoreFileQuery, query).First();
          throw new NimbleError('invalid', `invalid querystring: ${first?.path || '/'} ${first?.message ?? 'does not match the schema'}`);
        }
        models.admit(signerOf(req));
        // the store's bounds, the disk and the free allowance, from the announced size (checked again once the body is here)
        const announced = Number(req.headers['content-length']) || 0;
        if (announced > 0) await budget.admit(announced, query.keepDays !== undefined);
        if (uploading >= MAX_MODEL_UPLOADS_AT_ONCE) throw new NimbleError('rate_limited', 'another model upload is under way; retry in a moment', 429);
        uploading++;
        reply.raw.once('close', () => uploading--);
      },
      schema: { querystring: StoreFileQuery, response: { 200: PublishTicket } },
    },
    async (req) => {
      const { keepDays, payment } = req.query;
      return ticket(req, await models.storeFile(signerOf(req), req.rawBody ?? new Uint8Array(0), req.query.name, keepDays ? { days: keepDays, payment } : undefined), req.query);
    },
  );

  if (uploads) modelUploadRoutes(app, { models, uploads, budget, ticket });

  const withDeployment = (m: ModelRecord): StoredModelView => ({ ...storedModelView(m, budget), deployment: deploymentViewOf(c.state, m.sha256) });
  app.get('/models', { schema: { querystring: Owner, response: { 200: StoredModelList } } }, async (req) => c.state.models.list(req.query.owner).map(withDeployment));
  app.get('/models/:sha256', { schema: { params: Params, response: { 200: StoredModelView } } }, async (req) => withDeployment(models.get(req.params.sha256)));

  // public once published (before: signed by its owner, or by a miner serving it); a Range request resumes; the bytes are
  // streamed, and the client checks them against the sha256 on chain
  app.get('/models/:sha256/file', { config: { mayBeSigned: true }, schema: { params: Params } }, async (req, reply) => {
    const m = models.get(req.params.sha256);
    await access.authorize(blobReaderOf(req.verified), m.sha256);
    const size = await c.blobs.size(m.sha256);
    if (size === undefined) throw new NimbleError('corrupt', `the file of model ${m.sha256} is missing from the store`);
    const range = parseRange(req.headers.range, size) ?? { start: 0, end: size };
    void reply.header('content-type', BINARY).header('accept-ranges', 'bytes').header('etag', `"${m.sha256}"`).header('x-content-sha256', m.sha256);
    if (req.headers.range) void reply.status(206).header('content-range', `bytes ${range.start}-${range.end - 1}/${size}`);
    return reply.send(Readable.from(chunks(c.blobs, m.sha256, range.start, range.end)));
  });
  return models;
}

/** The model's view on this orchestrator, as the caller reached it (a default metadata URI). */
function metadataUriOf(req: FastifyRequest, sha256: string): string {
  const uri = `${req.protocol}://${req.host}/models/${sha256}`;
  return URI.test(uri) ? uri : `nimble-model:${sha256}`;
}

/** Bytes [start, end) of a blob in reads of CHUNK_BYTES (a blob shorter than announced ends the stream early). */
async function* chunks(blobs: BlobStore, id: string, start: number, end: number): AsyncGenerator<Buffer> {
  for (let at = start; at < end; ) {
    const b = await blobs.getRange(id, at, Math.min(end, at + CHUNK_BYTES));
    if (b.length === 0) return;
    yield Buffer.from(b.buffer, b.byteOffset, b.byteLength);
    at += b.length;
  }
}
