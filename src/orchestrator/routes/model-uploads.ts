// The routes of a large model file's upload in chunks (the rules in
// ../models/model-uploads.ts, contracts in src/api/models.ts): open one with
// its size and sha256 (admitted by the store's budget before a byte comes),
// PUT chunks at its offset, GET how far it is (to resume), and store it as
// POST /models/file stores a small file, with the same query and the same
// publish ticket back. Every route is signed by the developer's wallet; an
// upload is its opener's alone.
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyRequest } from 'fastify';
import { CreateUploadRequest, PublishTicket, STORE_ANSWER_MS, StoreFileQuery, UploadChunkQuery, UploadView } from '../../api/models.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import type { StoreBudget } from '../blobs/store-budget.ts';
import { UPLOAD_CHUNK_BYTES, type ModelUploads, type Upload } from '../models/model-uploads.ts';
import type { ModelService } from '../models/models.ts';
import type { ModelRecord } from '../state/models.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ id: Type.String({ pattern: '^[0-9a-f]{32}$' }) });

const viewOf = (u: Upload): UploadView => ({ id: u.id, bytes: u.bytes, received: u.received, sha256: u.sha256, chunkBytes: UPLOAD_CHUNK_BYTES });

export function modelUploadRoutes(
  app: HttpServer,
  deps: {
    models: ModelService;
    uploads: ModelUploads;
    budget: StoreBudget;
    ticket: (req: FastifyRequest, m: ModelRecord, query: Static<typeof StoreFileQuery>) => Promise<PublishTicket>;
  },
): void {
  const { models, uploads, budget } = deps;

  app.post('/models/uploads', { config: developer, schema: { body: CreateUploadRequest, response: { 200: UploadView } } }, async (req) => {
    const owner = signerOf(req);
    models.admit(owner);
    // the store's bounds and the disk, for the declared size beside every open upload's (the free pool and a payment are
    // checked when it is stored)
    await budget.admit(req.body.bytes + uploads.pendingBytes(), true);
    return viewOf(uploads.create(owner, req.body.bytes, req.body.sha256));
  });

  app.get('/models/uploads/:id', { config: developer, schema: { params: Params, response: { 200: UploadView } } }, async (req) => viewOf(uploads.get(signerOf(req), req.params.id)));

  app.put(
    '/models/uploads/:id',
    { config: developer, bodyLimit: UPLOAD_CHUNK_BYTES, schema: { params: Params, querystring: UploadChunkQuery, response: { 200: UploadView } } },
    async (req) => viewOf(uploads.append(signerOf(req), req.params.id, req.query.offset, req.rawBody ?? new Uint8Array(0))),
  );

  app.post(
    '/models/uploads/:id/store',
    { config: developer, schema: { params: Params, querystring: StoreFileQuery, response: { 200: PublishTicket } } },
    async (req) => {
      const owner = signerOf(req);
      const { keepDays, payment } = req.query;
      // the store checks every tensor of the file (src/model/whole-model.ts) before it answers: for a model of gigabytes on a
      // busy machine that is longer than the 30 s of silence after which the server drops a connection
      // (src/http/server.ts), so this one socket waits as long as the client does (STORE_ANSWER_MS)
      req.raw.socket.setTimeout(STORE_ANSWER_MS);
      const m = await uploads.finish(owner, req.params.id, (u) => models.storeUploaded(owner, u.path, u.sha256, u.bytes, req.query.name, keepDays ? { days: keepDays, payment } : undefined));
      return deps.ticket(req, m, req.query);
    },
  );
}
