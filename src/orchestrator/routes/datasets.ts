// The dataset store's routes (docs/jobs.md, "Data"): a developer uploads the
// packed bytes of a job's local data (signed with their wallet key, at most
// 256 MiB, one upload received at a time, refused from its headers when too
// large or past the owner's quota), and anyone reads a dataset's metadata,
// which is how the CLI skips uploading the same content twice. An upload
// past the network's free store is stored only paid (`keepDays` and the NIM
// transfer `payment` of GET /storage/quote's price: ../blobs/store-budget.ts);
// the owner keeps a dataset longer (POST /datasets/:sha256/keep, paid the
// same way) and deletes one no job of theirs uses. Contracts in src/api/datasets.ts;
// the rules in ../jobs/datasets.ts. Miners download the bytes with the signed
// GET /blobs/:id (./miners.ts).
import { Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { DatasetList, DatasetOwnerQuery, DatasetSha256, DatasetView, KeepDatasetRequest, UploadDatasetQuery, UploadedDataset } from '../../api/datasets.ts';
import { MAX_DATASET_BYTES } from '../../data/dataset.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { convertUrlPart } from '../../http/validator.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { datasetView, MAX_DATASET_UPLOADS_AT_ONCE, type DatasetService } from '../jobs/datasets.ts';
import type { StoreBudget } from '../blobs/store-budget.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ sha256: DatasetSha256 });

export function datasetRoutes(app: HttpServer, c: Coordinator, datasets: DatasetService, budget: StoreBudget): void {
  let uploading = 0;

  // refused from its headers (size, query, quota, the store's bounds and free pool, another upload under way) before its body is read
  app.post(
    '/datasets',
    {
      config: developer,
      bodyLimit: MAX_DATASET_BYTES,
      onRequest: async (req, reply) => {
        const length = req.headers['content-length'];
        const announced = length === undefined ? 0 : Number(length) || 0; // a chunked body is checked once received
        if (announced > MAX_DATASET_BYTES) throw new NimbleError('too_large', `a dataset may have at most ${MAX_DATASET_BYTES} bytes (256 MiB)`, 413);
        const query = convertUrlPart(UploadDatasetQuery, req.query);
        if (!Value.Check(UploadDatasetQuery, query)) {
          const first = Value.Errors(UploadDatasetQuery, query).First();
          throw new NimbleError('invalid', `invalid querystring: ${first?.path || '/'} ${first?.message ?? 'does not match the schema'}`);
        }
        // the same bytes again from their owner take no quota; a paid upload is past the free pool (its payment is checked with the body)
        if (!(query.sha256 && c.state.datasets.heldBy(query.sha256, signerOf(req)))) await datasets.admit(signerOf(req), announced, budget, query.keepDays !== undefined);
        if (uploading >= MAX_DATASET_UPLOADS_AT_ONCE) throw new NimbleError('rate_limited', 'another dataset upload is under way; retry in a moment', 429);
        uploading++;
        reply.raw.once('close', () => uploading--);
      },
      schema: { querystring: UploadDatasetQuery, response: { 200: UploadedDataset, 201: UploadedDataset } },
    },
    async (req, reply) => {
      const { sha256, keepDays, payment } = req.query;
      const { record, created } = await datasets.store(signerOf(req), req.rawBody ?? new Uint8Array(0), sha256, budget, keepDays ? { days: keepDays, payment } : undefined);
      void reply.status(created ? 201 : 200);
      return { dataset: datasetView(record), created };
    },
  );

  app.get('/datasets', { schema: { querystring: DatasetOwnerQuery, response: { 200: DatasetList } } }, async (req) => c.state.datasets.list(req.query.owner).map(datasetView));
  app.get('/datasets/:sha256', { schema: { params: Params, querystring: DatasetOwnerQuery, response: { 200: DatasetView } } }, async (req) =>
    datasetView(datasets.get(req.params.sha256, req.query.owner)),
  );
  // only its owner keeps a dataset (another address has no row of it: 404), paid first on a paid network
  app.post('/datasets/:sha256/keep', { config: developer, schema: { params: Params, body: KeepDatasetRequest, response: { 200: DatasetView } } }, async (req) =>
    datasetView(await datasets.keep(req.params.sha256, signerOf(req), req.body, budget)),
  );
  app.delete('/datasets/:sha256', { config: developer, schema: { params: Params, response: { 200: DatasetView } } }, async (req) => datasetView(datasets.remove(req.params.sha256, signerOf(req))));
}
