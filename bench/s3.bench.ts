// Blob store throughput, S3 against the folder: a 64 MiB blob put and got
// whole through S3BlobStore against s3rver (a real S3-protocol server in a
// child process on loopback; the put is a multipart upload of 8 MiB parts,
// 4 at a time) and through FsBlobStore (fsync'd) in the same run, so the two
// compare as a ratio on one machine. MB/s counts 10^6 bytes; put includes the
// sha256 that names the blob, get the sha256 check. Each figure is the median
// of REPS runs, each on a blob not stored before.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomFillSync } from 'node:crypto';
import { median, type Bench, type BenchOptions, type BenchResult } from './harness.ts';
import { FsBlobStore, type BlobStore } from '../src/orchestrator/blobs/blobs.ts';
import { S3BlobStore } from '../src/orchestrator/blobs/blobs-s3.ts';
import { S3RVER_CREDENTIALS, startS3 } from '../test/helpers/s3-server.ts';

const BYTES = 64 * 1024 * 1024;
const MB = BYTES / 1e6;
const REPS = 5;

/** Median put and get MB/s of `store`, each rep on a fresh blob (its first bytes changed), deleted after. */
async function measure(store: BlobStore, data: Uint8Array): Promise<{ put: number; get: number }> {
  const put: number[] = [];
  const get: number[] = [];
  for (let r = 0; r < REPS; r++) {
    randomFillSync(data, 0, 16);
    let t = performance.now();
    const id = await store.put(data);
    put.push(MB / ((performance.now() - t) / 1000));
    t = performance.now();
    const back = await store.get(id);
    get.push(MB / ((performance.now() - t) / 1000));
    if (back.length !== data.length) throw new Error(`got ${back.length} bytes of ${data.length}`);
    await store.delete(id);
  }
  return { put: median(put), get: median(get) };
}

async function s3VsFs(options: BenchOptions): Promise<BenchResult[]> {
  const data = new Uint8Array(BYTES);
  randomFillSync(data);
  const dir = await mkdtemp(join(tmpdir(), 'nimble-bench-s3-'));
  const s3 = await startS3('nimble-bench');
  try {
    const fs = await measure(await FsBlobStore.open(dir), data);
    options.log(`fs: put ${fs.put.toFixed(0)} MB/s, get ${fs.get.toFixed(0)} MB/s (64 MiB blob)`);
    const store = await S3BlobStore.open({ bucket: s3.bucket, prefix: 'bench', endpoint: s3.endpoint, region: 'us-east-1', forcePathStyle: true, credentials: S3RVER_CREDENTIALS });
    let s3Rates: { put: number; get: number };
    try {
      s3Rates = await measure(store, data);
    } finally {
      store.close();
    }
    options.log(`s3 (s3rver on loopback): put ${s3Rates.put.toFixed(0)} MB/s (${store.uploads.parts / store.uploads.multipart} parts), get ${s3Rates.get.toFixed(0)} MB/s`);
    return [
      { bench: 'scale.fs.put_mb_s', value: Math.round(fs.put), unit: 'MB/s' },
      { bench: 'scale.fs.get_mb_s', value: Math.round(fs.get), unit: 'MB/s' },
      { bench: 'scale.s3.put_mb_s', value: Math.round(s3Rates.put), unit: 'MB/s' },
      { bench: 'scale.s3.get_mb_s', value: Math.round(s3Rates.get), unit: 'MB/s' },
      { bench: 'scale.s3.put_vs_fs', value: Number((s3Rates.put / fs.put).toFixed(3)), unit: 'ratio' },
      { bench: 'scale.s3.get_vs_fs', value: Number((s3Rates.get / fs.get).toFixed(3)), unit: 'ratio' },
    ];
  } finally {
    await s3.close();
    await rm(dir, { recursive: true, force: true });
  }
}

export const s3Benches: Bench[] = [{ group: 'scale', run: s3VsFs }];
