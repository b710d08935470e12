// The dataset store's contracts (what `nbcli job submit` sends and reads when
// a spec's data is a local file or folder): the upload of the packed bytes
// and the stored dataset's metadata. Routes in
// src/orchestrator/routes/datasets.ts, client in ./dataset-client.ts,
// packing in src/data/dataset.ts.
import { Type, type Static } from '@sinclair/typebox';
import { KeepModelRequest } from './models.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });

export const DatasetSha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });

/** `POST /datasets?sha256=…`: the sha256 the uploader expects (the server computes its own and refuses a mismatch). */
export const UploadDatasetQuery = Type.Object(
  {
    sha256: Type.Optional(DatasetSha256),
    /** kept paid this many days (a store past the network's free store; GET /storage/quote says the price) */
    keepDays: Type.Optional(Type.Integer({ minimum: 1, maximum: 3650 })),
    /** the NIM transfer of the quote (on a paid network) */
    payment: Type.Optional(Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' })),
  },
  { additionalProperties: false },
);
export type UploadDatasetQuery = Static<typeof UploadDatasetQuery>;

export const DatasetOwnerQuery = Type.Object({ owner: Type.Optional(Address) }, { additionalProperties: false });

export const DatasetView = Type.Object({
  /** what a job spec's `data` says: `sha256:<hex>` */
  id: Type.String({ pattern: '^sha256:[0-9a-f]{64}$' }),
  sha256: DatasetSha256,
  /** who uploaded it (only their jobs train on it) */
  owner: Address,
  bytes: Count,
  createdAt: Count,
  /** last uploaded again or named by a job or run that had not ended */
  usedAt: Count,
  /** paid for until then (0: never paid) */
  keptUntil: Count,
  /** when it is deleted unless used again or kept longer (a job or run naming it keeps it) */
  expiresAt: Count,
});
export type DatasetView = Static<typeof DatasetView>;

export const DatasetList = Type.Array(DatasetView);

/** `POST /datasets/:sha256/keep`: keep it `days` more, paid by `payment` on a paid network. */
export const KeepDatasetRequest = KeepModelRequest;
export type KeepDatasetRequest = KeepModelRequest;

/** The answer to an upload: the dataset, and whether this upload stored it (false: its owner had it already). */
export const UploadedDataset = Type.Object({ dataset: DatasetView, created: Type.Boolean() });
export type UploadedDataset = Static<typeof UploadedDataset>;
