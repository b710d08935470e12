// Where the orchestrator keeps its blobs, as the user writes it (--blobs):
//   s3://BUCKET[/PREFIX][?endpoint=URL&region=R&pathStyle=true|false]
//       an S3 bucket: AWS by default, any S3-compatible server with endpoint=;
//       credentials come from the SDK's default chain (AWS_ACCESS_KEY_ID and
//       AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...), never from the URL;
//   PATH or file:///PATH
//       a folder (FsBlobStore), relative paths from the working directory.
// Without --blobs the folder is <data dir>/blobs. Anything else is refused
// with a message saying what is accepted.

import { resolve, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NimbleError } from '../../protocol/errors.ts';
import { FsBlobStore, type BlobStore } from './blobs.ts';
import { describeS3, type S3Location } from './s3-location.ts';

/** A parsed --blobs value. */
export type BlobStoreSpec = { kind: 'fs'; dir: string } | ({ kind: 's3' } & S3Location);

/** An opened blob store, and how to let go of it. */
export interface OpenedBlobStore {
  store: BlobStore;
  /** where the blobs are, for a person: a folder or s3://bucket/prefix (endpoint) */
  where: string;
  /** Closes its connections (nothing for a folder). */
  close(): void;
}

const FORMS = 's3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&pathStyle=true], a folder path, or file:///PATH';
const S3_PARAMS = new Set(['endpoint', 'region', 'pathStyle']);
/** AWS's bucket naming rules (general purpose buckets). */
const BUCKET_RE = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
const IP_RE = /^\d+\.\d+\.\d+\.\d+$/;
/** a key prefix: '/'-separated segments of letters, digits, '.', '_', '-' */
const PREFIX_SEGMENT_RE = /^[A-Za-z0-9._-]+$/;
const REGION_RE = /^[a-z0-9-]{1,32}$/;

function refuse(value: string, why: string): NimbleError {
  return new NimbleError('invalid', `--blobs '${value}': ${why} (accepted: ${FORMS})`);
}

/** Parses a --blobs value; NimbleError 'invalid' saying why when it is not one of the accepted forms. */
export function parseBlobStoreUrl(value: string): BlobStoreSpec {
  if (value.trim() === '') throw refuse(value, 'empty');
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(value)?.[1];
  // a one-letter "scheme" is a Windows drive (C:\blobs)
  if (scheme === undefined || scheme.length === 1) return { kind: 'fs', dir: resolve(value) };
  if (scheme.toLowerCase() === 'file') {
    if (!value.toLowerCase().startsWith('file:///')) throw refuse(value, 'not an absolute file URL (file:///PATH)');
    try {
      return { kind: 'fs', dir: fileURLToPath(value) };
    } catch (err) {
      throw refuse(value, `not an absolute file URL (${(err as Error).message})`);
    }
  }
  if (scheme !== 's3') throw refuse(value, `unknown scheme '${scheme}:'`);
  return parseS3(value);
}

function parseS3(value: string): BlobStoreSpec {
  const m = /^s3:\/\/([^/?#]*)(\/[^?#]*)?(\?[^#]*)?$/.exec(value);
  if (!m) throw refuse(value, 'not s3://BUCKET[/PREFIX][?...] (no fragment)');
  const [, bucket, path = '', query = ''] = m;
  if (bucket.includes('@') || bucket.includes(':')) throw refuse(value, 'credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)');
  if (!BUCKET_RE.test(bucket) || bucket.includes('..') || IP_RE.test(bucket) || bucket.startsWith('xn--') || bucket.endsWith('-s3alias')) {
    throw refuse(value, `'${bucket}' is not a bucket name (3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit)`);
  }
  const segments = path.split('/').filter((s) => s !== '');
  for (const s of segments) {
    if (!PREFIX_SEGMENT_RE.test(s) || s === '.' || s === '..') throw refuse(value, `prefix segment '${s}' must be letters, digits, '.', '_' and '-' (not '.' or '..')`);
  }
  const prefix = segments.join('/');
  if (prefix.length > 512) throw refuse(value, 'the prefix is longer than 512 characters');
  const params = new URLSearchParams(query.slice(1));
  for (const key of new Set(params.keys())) {
    if (!S3_PARAMS.has(key)) throw refuse(value, `unknown parameter '${key}' (known: ${[...S3_PARAMS].join(', ')})`);
    if (params.getAll(key).length > 1) throw refuse(value, `parameter '${key}' given twice`);
  }
  const endpoint = params.get('endpoint') ?? undefined;
  if (endpoint !== undefined) checkEndpoint(value, endpoint);
  const region = params.get('region') ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION ?? 'us-east-1';
  if (!REGION_RE.test(region)) throw refuse(value, `region '${region}' is not a region name (e.g. us-east-1)`);
  const pathStyle = params.get('pathStyle');
  if (pathStyle !== null && pathStyle !== 'true' && pathStyle !== 'false') throw refuse(value, `pathStyle must be true or false, got '${pathStyle}'`);
  // S3-compatible servers mostly want the bucket in the path; AWS wants it in the host name
  const forcePathStyle = pathStyle === null ? endpoint !== undefined : pathStyle === 'true';
  return { kind: 's3', bucket, prefix, endpoint: endpoint?.replace(/\/+$/, ''), region, forcePathStyle };
}

/** An endpoint is a bare http(s) URL: no credentials, query or fragment. */
function checkEndpoint(value: string, endpoint: string): void {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw refuse(value, `endpoint '${endpoint}' is not a URL (e.g. endpoint=http://127.0.0.1:9000)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw refuse(value, `endpoint '${endpoint}' must be an http:// or https:// URL`);
  if (url.username || url.password) throw refuse(value, 'credentials do not go in the endpoint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY');
  if (url.search || url.hash) throw refuse(value, `endpoint '${endpoint}' must not have a query or fragment`);
}

/** How a spec is shown to a person. */
export function describeBlobStore(spec: BlobStoreSpec): string {
  return spec.kind === 'fs' ? spec.dir : describeS3(spec);
}

/** Opens the blob store of `spec`, or the folder <dataDir>/blobs without one; an S3 bucket must exist. */
export async function openBlobStore(spec: BlobStoreSpec | undefined, dataDir: string): Promise<OpenedBlobStore> {
  const chosen = spec ?? { kind: 'fs', dir: join(dataDir, 'blobs') };
  if (chosen.kind === 'fs') return { store: await FsBlobStore.open(chosen.dir), where: chosen.dir, close: () => {} };
  // loaded here: the AWS SDK is a fifth of nbcli's start-up, and most orchestrators keep a folder
  const { S3BlobStore } = await import('./blobs-s3.ts');
  const store = await S3BlobStore.open(chosen);
  return { store, where: store.where, close: () => store.close() };
}
