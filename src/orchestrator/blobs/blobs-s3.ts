// The blob store in an S3 bucket: AWS S3 or any S3-compatible server (MinIO,
// Ceph, R2, s3rver...), through @aws-sdk/client-s3.
//
// A blob is the object <prefix>/<id[0..2]>/<id[2..64]>, the folder store's
// layout, so a folder of blobs syncs to a bucket as it is. put is idempotent (HeadObject
// first) and sends blobs past `multipartThreshold` as a multipart upload
// (aborted on failure, so no parts are left behind); an object only becomes
// visible once complete, so nobody reads half a blob. get checks the sha256 and
// moves a corrupt object aside to <prefix>/corrupt/<id>.<ms> so a later put of
// the same bytes repairs it, as FsBlobStore does. Each request is retried by the
// SDK (`maxAttempts`, 5 by default, with backoff); what still fails (no such
// bucket, access denied, the server unreachable) is a NimbleError naming the
// bucket and the endpoint, never the SDK's own dump.

import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadBucketCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  UploadPartCommand,
  type CompletedPart,
  type GetObjectCommandOutput,
} from '@aws-sdk/client-s3';
import { NimbleError } from '../../protocol/errors.ts';
import { open, stat } from 'node:fs/promises';
import { BlobError, assertBlobId, assertBlobPrefix, blobId, checkFileHash, type BlobStore } from './blobs.ts';
import { describeS3, type S3Location } from './s3-location.ts';

const MiB = 1024 * 1024;
/** S3's smallest part (every part but the last) and its most parts per upload. */
const MIN_PART_BYTES = 5 * MiB;
const MAX_PARTS = 10_000;

/** An S3BlobStore's location and tuning. */
export interface S3BlobStoreOptions extends S3Location {
  /** absent: the SDK's default chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, SSO, instance role) */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
  /** tries of each request, the first included (default 5) */
  maxAttempts?: number;
  /** blobs larger than this go up as a multipart upload (default 16 MiB) */
  multipartThreshold?: number;
  /** bytes per uploaded part, at least 5 MiB (default 8 MiB; raised so an upload has at most 10,000 parts) */
  partSize?: number;
  /** parts uploaded at once (default 4) */
  partConcurrency?: number;
  /** keys per ListObjectsV2 page, 1-1000 (default 1000) */
  pageSize?: number;
}

/** The SDK's fields of an error that matter here. */
interface SdkError {
  name?: string;
  code?: string;
  message?: string;
  $metadata?: { httpStatusCode?: number };
}

/** Socket errors: the store could not be reached. */
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EPIPE']);
const DENIED = new Set(['AccessDenied', 'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'ExpiredToken', 'InvalidToken', 'Forbidden']);

function statusOf(err: unknown): number | undefined {
  return (err as SdkError).$metadata?.httpStatusCode;
}

/** A missing object (not a missing bucket). */
function isNotFound(err: unknown): boolean {
  const name = (err as SdkError).name;
  return name === 'NotFound' || name === 'NoSuchKey' || (statusOf(err) === 404 && name !== 'NoSuchBucket');
}

/** The SDK warns on every start that it will drop Node 20 in 2027; an orchestrator's output is not the place (the user may still ask for it). */
function quietSdkWarnings(): void {
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
}

/** Blobs as objects of one bucket. */
export class S3BlobStore implements BlobStore {
  readonly bucket: string;
  /** `<prefix>/`, or '' at the bucket's root */
  private readonly root: string;
  private readonly client: S3Client;
  private readonly multipartThreshold: number;
  private readonly partSize: number;
  private readonly partConcurrency: number;
  private readonly pageSize: number;
  /** the store as a user names it, for messages: s3://bucket/prefix (endpoint) */
  readonly where: string;
  /** uploads done since it opened: single PutObjects, completed multipart uploads, and their parts */
  readonly uploads = { single: 0, multipart: 0, parts: 0 };

  private constructor(options: S3BlobStoreOptions) {
    this.bucket = options.bucket;
    this.root = options.prefix ? `${options.prefix}/` : '';
    this.where = describeS3(options);
    this.multipartThreshold = options.multipartThreshold ?? 16 * MiB;
    this.partSize = options.partSize ?? 8 * MiB;
    this.partConcurrency = options.partConcurrency ?? 4;
    this.pageSize = options.pageSize ?? 1000;
    if (!(this.partSize >= MIN_PART_BYTES)) throw new NimbleError('invalid', `S3 part size must be at least ${MIN_PART_BYTES} bytes, got ${this.partSize}`);
    if (!(this.multipartThreshold >= 0)) throw new NimbleError('invalid', `S3 multipart threshold must be a size in bytes, got ${this.multipartThreshold}`);
    if (!Number.isInteger(this.pageSize) || this.pageSize < 1 || this.pageSize > 1000) throw new NimbleError('invalid', `S3 page size must be 1-1000, got ${this.pageSize}`);
    if (!Number.isInteger(this.partConcurrency) || this.partConcurrency < 1) throw new NimbleError('invalid', `S3 part concurrency must be a positive integer, got ${this.partConcurrency}`);
    quietSdkWarnings();
    this.client = new S3Client({
      endpoint: options.endpoint,
      region: options.region,
      forcePathStyle: options.forcePathStyle,
      credentials: options.credentials,
      maxAttempts: options.maxAttempts ?? 5,
      followRegionRedirects: true,
      // blobs are checked against their sha256 on every full read; the SDK's extra CRC32s are not
      // understood by every S3-compatible server
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      requestHandler: { connectionTimeout: 10_000, socketTimeout: 120_000 },
    });
  }

  /** Opens the store, checking that the bucket exists and these credentials reach it (HeadBucket). */
  static async open(options: S3BlobStoreOptions): Promise<S3BlobStore> {
    const store = new S3BlobStore(options);
    try {
      await store.client.send(new HeadBucketCommand({ Bucket: store.bucket }));
    } catch (err) {
      store.close();
      if (statusOf(err) === 404 || (err as SdkError).name === 'NoSuchBucket') {
        throw new NimbleError('not_found', `S3 bucket '${store.bucket}' does not exist at ${store.where}: create it first (e.g. aws s3 mb s3://${store.bucket})`, 404, { cause: err });
      }
      throw store.failure('HeadBucket', err);
    }
    return store;
  }

  /** Closes the client's connections. */
  close(): void {
    this.client.destroy();
  }

  /** The object key of a (validated) id: <prefix>/<id[0..2]>/<id[2..64]>. */
  keyOf(id: string): string {
    assertBlobId(id);
    return `${this.root}${id.slice(0, 2)}/${id.slice(2)}`;
  }

  async put(bytes: Uint8Array): Promise<string> {
    const id = blobId(bytes);
    const key = this.keyOf(id);
    if ((await this.size(id)) === bytes.length) return id;
    if (bytes.length > this.multipartThreshold) {
      await this.putMultipart(key, bytes.length, async (start, end) => bytes.subarray(start, end));
    } else {
      await this.call('PutObject', () => this.client.send(new PutObjectCommand({ Bucket: this.bucket, Key: key, Body: bytes, ContentLength: bytes.length, ContentType: 'application/octet-stream' })));
      this.uploads.single++;
    }
    return id;
  }

  async putFile(path: string, id: string): Promise<string> {
    const key = this.keyOf(id);
    const size = (await stat(path)).size;
    await checkFileHash(path, id);
    if ((await this.size(id)) === size) return id;
    const fh = await open(path, 'r');
    try {
      const read = async (start: number, end: number): Promise<Uint8Array> => {
        const buf = Buffer.allocUnsafe(end - start);
        for (let got = 0; got < buf.length; ) {
          const { bytesRead } = await fh.read(buf, got, buf.length - got, start + got);
          if (bytesRead === 0) throw new BlobError('corrupt', `${path} ended at ${start + got} of ${size} bytes while stored`);
          got += bytesRead;
        }
        return buf;
      };
      if (size > this.multipartThreshold) await this.putMultipart(key, size, read);
      else {
        const body = await read(0, size);
        await this.call('PutObject', () => this.client.send(new PutObjectCommand({ Bucket: this.bucket, Key: key, Body: body, ContentLength: size, ContentType: 'application/octet-stream' })));
        this.uploads.single++;
      }
    } finally {
      await fh.close();
    }
    return id;
  }

  async get(id: string): Promise<Uint8Array> {
    const key = this.keyOf(id);
    const res = await this.callOrMissing('GetObject', () => this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key })));
    if (!res?.Body) throw new BlobError('not_found', `no blob ${id}`);
    const body = res.Body;
    const bytes = await this.call('GetObject', () => body.transformToByteArray());
    const actual = blobId(bytes);
    if (actual !== id) {
      const aside = await this.quarantine(id);
      throw new BlobError('corrupt', `blob ${id} in ${this.where} hashes to ${actual}; moved to ${aside}`);
    }
    return bytes;
  }

  async getRange(id: string, start: number, end: number): Promise<Uint8Array> {
    if (!Number.isSafeInteger(start) || !Number.isSafeInteger(end) || start < 0 || end < start) {
      throw new BlobError('bad_range', `range [${start}, ${end}) is not a pair of integers 0 <= start <= end`);
    }
    const key = this.keyOf(id);
    if (end > start) {
      let res: GetObjectCommandOutput | undefined;
      try {
        res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key, Range: `bytes=${start}-${end - 1}` }));
      } catch (err) {
        if (isNotFound(err)) throw new BlobError('not_found', `no blob ${id}`);
        // 416: the range starts at or past the end; the size below tells which
        if (statusOf(err) !== 416) throw this.failure('GetObject', err);
      }
      if (res?.Body) {
        const body = res.Body;
        const bytes = await this.call('GetObject', () => body.transformToByteArray());
        // a server that ignored the Range header sent the whole object
        return res.ContentRange === undefined ? bytes.slice(start, end) : bytes.subarray(0, end - start);
      }
    }
    const size = await this.size(id);
    if (size === undefined) throw new BlobError('not_found', `no blob ${id}`);
    if (start > size) throw new BlobError('bad_range', `range starts at ${start}, blob ${id} has ${size} bytes`);
    return new Uint8Array(0);
  }

  async size(id: string): Promise<number | undefined> {
    const key = this.keyOf(id);
    const head = await this.callOrMissing('HeadObject', () => this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: key })));
    return head ? (head.ContentLength ?? 0) : undefined;
  }

  async has(id: string): Promise<boolean> {
    return (await this.size(id)) !== undefined;
  }

  async *list(prefix: string = ''): AsyncIterable<string> {
    assertBlobPrefix(prefix);
    // keys sort as their ids do (the fan-out folder is the id's first 2 digits)
    const keyPrefix = this.root + (prefix.length >= 2 ? `${prefix.slice(0, 2)}/${prefix.slice(2)}` : prefix);
    let token: string | undefined;
    do {
      const page = await this.call('ListObjectsV2', () => this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix: keyPrefix, MaxKeys: this.pageSize, ContinuationToken: token })));
      for (const o of page.Contents ?? []) {
        const id = this.idOfKey(o.Key);
        if (id !== undefined) yield id;
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
  }

  async delete(id: string): Promise<boolean> {
    const key = this.keyOf(id);
    // DeleteObject answers the same whether or not the object was there
    if ((await this.size(id)) === undefined) return false;
    await this.call('DeleteObject', () => this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: key })));
    return true;
  }

  /** The id a listed key holds, or undefined for anything else in the bucket (corrupt/, other tools' objects). */
  private idOfKey(key: string | undefined): string | undefined {
    if (!key?.startsWith(this.root)) return undefined;
    const m = /^([0-9a-f]{2})\/([0-9a-f]{62})$/.exec(key.slice(this.root.length));
    return m ? m[1] + m[2] : undefined;
  }

  /** Uploads `bytes` as parts, `partConcurrency` at a time; aborts the upload if any part fails. */
  /** A multipart upload of `size` bytes, each part read by `read(start, end)` when its turn comes (at most partConcurrency parts in memory). */
  private async putMultipart(key: string, size: number, read: (start: number, end: number) => Promise<Uint8Array>): Promise<void> {
    const created = await this.call('CreateMultipartUpload', () => this.client.send(new CreateMultipartUploadCommand({ Bucket: this.bucket, Key: key, ContentType: 'application/octet-stream' })));
    const uploadId = created.UploadId;
    if (!uploadId) throw new NimbleError('internal', `S3 CreateMultipartUpload in ${this.where} answered no upload id`, 500);
    const partSize = Math.max(this.partSize, Math.ceil(size / MAX_PARTS));
    const count = Math.ceil(size / partSize);
    const parts: CompletedPart[] = new Array<CompletedPart>(count);
    let next = 0;
    let failed = false;
    const worker = async (): Promise<void> => {
      while (!failed && next < count) {
        const n = next++;
        try {
          const body = await read(n * partSize, Math.min(size, (n + 1) * partSize));
          const res = await this.call(`UploadPart ${n + 1}/${count}`, () => this.client.send(new UploadPartCommand({ Bucket: this.bucket, Key: key, UploadId: uploadId, PartNumber: n + 1, Body: body, ContentLength: body.length })));
          if (!res.ETag) throw new NimbleError('internal', `S3 UploadPart ${n + 1}/${count} in ${this.where} answered no ETag`, 500);
          parts[n] = { ETag: res.ETag, PartNumber: n + 1 };
        } catch (err) {
          failed = true;
          throw err;
        }
      }
    };
    try {
      const results = await Promise.allSettled(Array.from({ length: Math.min(this.partConcurrency, count) }, worker));
      const rejected = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (rejected) throw rejected.reason;
      await this.call('CompleteMultipartUpload', () => this.client.send(new CompleteMultipartUploadCommand({ Bucket: this.bucket, Key: key, UploadId: uploadId, MultipartUpload: { Parts: parts } })));
      this.uploads.multipart++;
      this.uploads.parts += count;
    } catch (err) {
      await this.client.send(new AbortMultipartUploadCommand({ Bucket: this.bucket, Key: key, UploadId: uploadId })).catch(() => undefined);
      throw err;
    }
  }

  /** Moves a corrupt object aside (copy, then delete) so has() is false and a new put() rewrites it; returns where it went. */
  private async quarantine(id: string): Promise<string> {
    const key = this.keyOf(id);
    const aside = `${this.root}corrupt/${id}.${Date.now()}`;
    const source = `${this.bucket}/${key}`.split('/').map(encodeURIComponent).join('/');
    await this.client.send(new CopyObjectCommand({ Bucket: this.bucket, Key: aside, CopySource: source })).catch(() => undefined);
    await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: key })).catch(() => undefined);
    return aside;
  }

  /** Runs one request; any failure becomes a NimbleError naming the store. */
  private async call<T>(op: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw err instanceof NimbleError ? err : this.failure(op, err);
    }
  }

  /** Runs one request; a missing object is undefined. */
  private async callOrMissing<T>(op: string, fn: () => Promise<T>): Promise<T | undefined> {
    try {
      return await fn();
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw this.failure(op, err);
    }
  }

  /** A failed request as one line a person can act on (the SDK's error is its cause). */
  private failure(op: string, err: unknown): NimbleError {
    const e = err as SdkError;
    const status = statusOf(err);
    const name = e.name ?? 'Error';
    const detail = (e.message ?? '').split('\n')[0];
    const head = `S3 ${op} on ${this.where} failed`;
    if (NETWORK_CODES.has(e.code ?? '') || name === 'TimeoutError' || e.code === 'ECONNABORTED') {
      return new NimbleError('unreachable', `${head}: the store cannot be reached (${e.code ?? name}: ${detail})`, 502, { cause: err });
    }
    if (name === 'CredentialsProviderError' || /credentials/i.test(name)) {
      return new NimbleError('internal', `${head}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE): ${detail}`, 500, { cause: err });
    }
    if (name === 'NoSuchBucket') return new NimbleError('internal', `${head}: the bucket does not exist`, 500, { cause: err });
    if (status === 403 || DENIED.has(name)) {
      return new NimbleError('internal', `${head}: access denied (HTTP 403${name !== 'Unknown' ? ` ${name}` : ''}): check the credentials and the bucket's policy`, 500, { cause: err });
    }
    const why = detail && detail !== 'UnknownError' ? `: ${detail}` : '';
    return new NimbleError('internal', `${head}: ${name}${status ? ` (HTTP ${status})` : ''}${why}`, 500, { cause: err });
  }
}
