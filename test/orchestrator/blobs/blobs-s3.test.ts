// S3BlobStore against a real S3-protocol server (s3rver in a child process):
// the BlobStore contract (./blob-store-cases.ts), multipart uploads, corrupt
// objects, list pagination, errors that name the store, and --blobs parsing.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative, resolve, sep } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CreateBucketCommand, DeleteBucketCommand, ListObjectsV2Command, PutObjectCommand, type S3Client } from '@aws-sdk/client-s3';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { FsBlobStore, blobId } from '../../../src/orchestrator/blobs/blobs.ts';
import { S3BlobStore, type S3BlobStoreOptions } from '../../../src/orchestrator/blobs/blobs-s3.ts';
import { openBlobStore, parseBlobStoreUrl } from '../../../src/orchestrator/blobs/blob-store-url.ts';
import { S3RVER_CREDENTIALS, startS3, type TestS3 } from '../../helpers/s3-server.ts';
import { blobStoreContract, bytes, collect, rejects, type TestContext } from './blob-store-cases.ts';

let s3: TestS3;
before(async () => {
  s3 = await startS3('nimble-blobs');
});
after(() => s3?.close());

let stores = 0;
/** Options of a store under a prefix of its own in the test bucket. */
function optionsOf(extra: Partial<S3BlobStoreOptions> = {}): S3BlobStoreOptions {
  return { bucket: s3.bucket, prefix: `t${++stores}/blobs`, endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true, credentials: S3RVER_CREDENTIALS, ...extra };
}

async function openStore(t: TestContext, extra: Partial<S3BlobStoreOptions> = {}): Promise<S3BlobStore> {
  const store = await S3BlobStore.open(optionsOf(extra));
  t.after(() => store.close());
  return store;
}

/** Every key in the bucket under `prefix`. */
async function keys(client: S3Client, prefix: string): Promise<string[]> {
  const out: string[] = [];
  let token: string | undefined;
  do {
    const page = await client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix, ContinuationToken: token }));
    out.push(...(page.Contents ?? []).map((o) => o.Key!));
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
  return out;
}

blobStoreContract('S3BlobStore', (t) => openStore(t));
// a page of 7 keys: every listing above spans several pages
blobStoreContract('S3BlobStore (7 keys a page)', (t) => openStore(t, { pageSize: 7 }));

test('S3: objects are <prefix>/<id[0..2]>/<id[2..]>, as in the folder; other objects in the bucket are not listed', async (t) => {
  const store = await openStore(t);
  const id = await store.put(bytes('stage 1 weights'));
  const prefix = `t${stores}/blobs/`;
  assert.deepEqual(await keys(s3.client, prefix), [`${prefix}${id.slice(0, 2)}/${id.slice(2)}`]);
  // a stray object, a whole id under its fan-out folder, a name one digit short
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}notes.txt`, Body: 'x' }));
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}${id.slice(0, 2)}/${id}`, Body: 'x' }));
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}${id.slice(0, 2)}/${id.slice(2, 63)}`, Body: 'x' }));
  assert.deepEqual(await collect(store.list()), [id]);
});

test('S3: a folder store copied file for file into the bucket (aws s3 sync) is the same store', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'nimble-blob-sync-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const folder = await FsBlobStore.open(dir);
  const ids = (await Promise.all(['a', 'b', 'c'].map((s) => folder.put(bytes(`partition ${s}`))))).sort();
  const store = await openStore(t);
  for (const id of ids) {
    const file = relative(dir, folder.pathOf(id)).split(sep).join('/');
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `t${stores}/blobs/${file}`, Body: await readFile(folder.pathOf(id)) }));
  }
  assert.deepEqual(await collect(store.list()), ids);
  for (const id of ids) assert.deepEqual(await store.get(id), await folder.get(id));
});

test('S3: a blob past the threshold goes up in parts and round-trips; a failed upload names the store', async (t) => {
  const MiB = 1024 * 1024;
  const store = await openStore(t, { multipartThreshold: 6 * MiB, partSize: 5 * MiB, partConcurrency: 2 });
  const data = new Uint8Array(randomBytes(12 * MiB + 123)); // 3 parts: 5 + 5 + 2 MiB
  const id = await store.put(data);
  assert.equal(id, blobId(data));
  assert.equal(await store.size(id), data.length);
  assert.deepEqual(await store.get(id), data);
  assert.deepEqual(await store.getRange(id, 5 * MiB - 10, 5 * MiB + 10), data.subarray(5 * MiB - 10, 5 * MiB + 10));
  assert.deepEqual(store.uploads, { single: 0, multipart: 1, parts: 3 });
  const small = await store.put(new Uint8Array(randomBytes(6 * MiB))); // at the threshold: one PutObject
  assert.deepEqual(await store.get(small), await store.get(small));
  assert.deepEqual(store.uploads, { single: 1, multipart: 1, parts: 3 });
  assert.equal(await store.put(data), id, 'idempotent');
  assert.deepEqual(store.uploads, { single: 1, multipart: 1, parts: 3 }, 'nothing sent again');
  // a bucket deleted under a running store: the failure names the store and the step
  await s3.client.send(new CreateBucketCommand({ Bucket: 'short-lived' }));
  const gone = await openStore(t, { bucket: 'short-lived', multipartThreshold: 6 * MiB, partSize: 5 * MiB });
  await s3.client.send(new DeleteBucketCommand({ Bucket: 'short-lived' }));
  await assert.rejects(gone.put(new Uint8Array(randomBytes(11 * MiB))), (e: unknown) => e instanceof NimbleError && /^S3 CreateMultipartUpload on s3:\/\/short-lived\/\S+ \(http:\/\/127\.0\.0\.1:\d+\) failed: the bucket does not exist$/.test(e.message));
  await assert.rejects(S3BlobStore.open(optionsOf({ partSize: MiB })), /S3 part size must be at least 5242880 bytes/);
});

test('S3: a corrupt object is detected on get, moved to corrupt/, and repaired by the next put', async (t) => {
  const store = await openStore(t);
  const data = bytes('merged partition 3');
  const id = await store.put(data);
  const bad = new Uint8Array(data);
  bad[0] ^= 0xff; // same size, flipped bits
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: store.keyOf(id), Body: bad }));
  const e = await rejects(store.get(id), 'corrupt');
  assert.equal(e.status, 500);
  assert.match(e.message, /corrupt\//);
  assert.equal(await store.has(id), false, 'moved aside');
  const aside = await keys(s3.client, `t${stores}/blobs/corrupt/`);
  assert.equal(aside.length, 1);
  assert.ok(aside[0].includes(id));
  assert.deepEqual(await collect(store.list()), [], 'corrupt/ is not listed');
  await store.put(data);
  assert.deepEqual(await store.get(id), data);
});

test('S3: open refuses a missing bucket, bad credentials and an unreachable endpoint, naming the store', async () => {
  const missing = await S3BlobStore.open(optionsOf({ bucket: 'no-such-bucket' })).then(() => null, (e: unknown) => e);
  assert.ok(missing instanceof NimbleError, String(missing));
  assert.match(missing.message, /S3 bucket 'no-such-bucket' does not exist at s3:\/\/no-such-bucket\/.* \(http:\/\/127\.0\.0\.1:\d+\)/);
  const denied = await S3BlobStore.open(optionsOf({ credentials: { accessKeyId: 'WRONG', secretAccessKey: 'WRONG' } })).then(() => null, (e: unknown) => e);
  assert.ok(denied instanceof NimbleError, String(denied));
  assert.match(denied.message, /HeadBucket on s3:\/\/nimble-blobs\/.* failed: access denied/);
  const down = await S3BlobStore.open(optionsOf({ endpoint: 'http://127.0.0.1:1', maxAttempts: 2 })).then(() => null, (e: unknown) => e);
  assert.ok(down instanceof NimbleError, String(down));
  assert.equal(down.code, 'unreachable');
  assert.match(down.message, /http:\/\/127\.0\.0\.1:1\).*cannot be reached \(ECONNREFUSED/);
  assert.ok(!/\n/.test(down.message), 'one line');
});

test('S3: without credentials anywhere, open says which variables to set', async (t) => {
  const saved = { ...process.env };
  t.after(() => {
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  });
  for (const k of Object.keys(process.env)) if (k.startsWith('AWS_') && k !== 'AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED') delete process.env[k];
  process.env.AWS_EC2_METADATA_DISABLED = 'true'; // not the instance role of a CI machine
  process.env.HOME = join(tmpdir(), 'nimble-no-home'); // no ~/.aws
  const e = await S3BlobStore.open(optionsOf({ credentials: undefined })).then(() => null, (err: unknown) => err);
  assert.ok(e instanceof NimbleError, String(e));
  assert.match(e.message, /^S3 HeadBucket on s3:\/\/nimble-blobs\/\S+ \(http:\/\/127\.0\.0\.1:\d+\) failed: no credentials \(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE\)/);
});

test('S3: --blobs values are parsed, checked, and opened', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'nimble-blob-url-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  assert.deepEqual(parseBlobStoreUrl('s3://my-bucket'), { kind: 's3', bucket: 'my-bucket', prefix: '', endpoint: undefined, region: process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION ?? 'us-east-1', forcePathStyle: false });
  assert.deepEqual(parseBlobStoreUrl('s3://my.bucket/a/b/?endpoint=http://127.0.0.1:9000/&region=eu-west-3'), { kind: 's3', bucket: 'my.bucket', prefix: 'a/b', endpoint: 'http://127.0.0.1:9000', region: 'eu-west-3', forcePathStyle: true });
  assert.equal((parseBlobStoreUrl('s3://abc?endpoint=https%3A%2F%2Fs3.example.com&pathStyle=false') as { forcePathStyle: boolean }).forcePathStyle, false);
  assert.deepEqual(parseBlobStoreUrl('blobs'), { kind: 'fs', dir: resolve('blobs') });
  assert.deepEqual(parseBlobStoreUrl(pathToFileURL(dir).href), { kind: 'fs', dir });
  for (const [value, why] of [
    ['', /empty/],
    ['s3://AB', /not a bucket name/],
    ['s3://ab', /not a bucket name/],
    ['s3://-bucket', /not a bucket name/],
    ['s3://a..b', /not a bucket name/],
    ['s3://192.168.1.1', /not a bucket name/],
    [`s3://${'a'.repeat(64)}`, /not a bucket name/],
    ['s3://key:secret@bucket', /credentials do not go in the URL/],
    ['s3://bucket/../x', /prefix segment/],
    ['s3://bucket/a b', /prefix segment/],
    ['s3://bucket?endpoint=ftp://x', /http:\/\/ or https:\/\//],
    ['s3://bucket?endpoint=not a url', /not a URL/],
    ['s3://bucket?endpoint=http://u:p@host', /credentials do not go in the endpoint/],
    ['s3://bucket?endpoint=http://a&endpoint=http://b', /given twice/],
    ['s3://bucket?pathstyle=true', /unknown parameter 'pathstyle'/],
    ['s3://bucket?pathStyle=yes', /pathStyle must be true or false/],
    ['s3://bucket?region=EU WEST', /not a region name/],
    ['s3://bucket#x', /no fragment/],
    ['gs://bucket', /unknown scheme 'gs:'/],
    ['https://bucket.s3.amazonaws.com', /unknown scheme 'https:'/],
    ['file:relative/path', /not an absolute file URL/],
  ] as const) {
    assert.throws(() => parseBlobStoreUrl(value), (e: unknown) => e instanceof NimbleError && e.code === 'invalid' && why.test(e.message) && e.message.includes('accepted: s3://BUCKET'), value);
  }
  // opened from a URL, credentials from the environment (the SDK's default chain)
  const saved = { id: process.env.AWS_ACCESS_KEY_ID, secret: process.env.AWS_SECRET_ACCESS_KEY };
  process.env.AWS_ACCESS_KEY_ID = 'S3RVER';
  process.env.AWS_SECRET_ACCESS_KEY = 'S3RVER';
  t.after(() => {
    for (const [k, v] of [['AWS_ACCESS_KEY_ID', saved.id], ['AWS_SECRET_ACCESS_KEY', saved.secret]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  const opened = await openBlobStore(parseBlobStoreUrl(`s3://${s3.bucket}/from-url?endpoint=${encodeURIComponent(s3.endpoint)}`), dir);
  t.after(() => opened.close());
  assert.ok(opened.store instanceof S3BlobStore);
  assert.equal(opened.where, `s3://${s3.bucket}/from-url (${s3.endpoint})`);
  const id = await opened.store.put(bytes('via url'));
  assert.deepEqual(await keys(s3.client, 'from-url/'), [`from-url/${id.slice(0, 2)}/${id.slice(2)}`]);
  // no flag: the folder <dataDir>/blobs
  const fallback = await openBlobStore(undefined, dir);
  assert.ok(fallback.store instanceof FsBlobStore);
  assert.equal(fallback.where, join(dir, 'blobs'));
});
