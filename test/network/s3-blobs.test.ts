// An orchestrator with its blobs in an S3 bucket (s3rver, a real S3-protocol
// server): two miners train gpt-micro, the run completes, its checkpoint
// downloads, every blob is in the bucket and none in the data dir; a bucket
// that is not there stops `nbcli orchestrator start` with one clear line.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { ListObjectsV2Command, PutObjectCommand } from '@aws-sdk/client-s3';
import { NimbleError } from '../../src/protocol/errors.ts';
import { decodeSafetensors } from '../../src/model/safetensors.ts';
import { checkpointInfo } from '../../src/model/checkpoint.ts';
import { startS3, type TestS3 } from '../helpers/s3-server.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let s3: TestS3;
before(async () => {
  s3 = await startS3('nimble-net');
  // (startS3 quiets the SDK's Node-version warning in this process; the orchestrator must do it itself)
  delete process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED;
  // the orchestrator's credentials: the SDK's default chain reads them from its environment
  process.env.AWS_ACCESS_KEY_ID = 'S3RVER';
  process.env.AWS_SECRET_ACCESS_KEY = 'S3RVER';
});
after(async () => {
  await cluster.stop();
  await s3?.close();
});

/** Every key in the test bucket. */
async function bucketKeys(): Promise<string[]> {
  const out: string[] = [];
  let token: string | undefined;
  do {
    const page = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, ContinuationToken: token }));
    out.push(...(page.Contents ?? []).map((o) => o.Key!));
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
  return out;
}

test('a run trains with its blobs in S3: its stage states and merge uploads live in the bucket', async () => {
  await cluster.startOrchestrator(['--blobs', `s3://${s3.bucket}/orch?endpoint=${encodeURIComponent(s3.endpoint)}&region=us-east-1`]);
  const listening = cluster.orchestrator!.lines.map((l) => (l.startsWith('{') ? (JSON.parse(l) as Record<string, unknown>) : {})).find((v) => v.event === 'listening');
  assert.equal(listening?.blobs, `s3://${s3.bucket}/orch (${s3.endpoint})`);
  await Promise.all(['a', 'b'].map((n) => cluster.startMiner(n)));
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 30, stages: 1, mergeEvery: 5, batchSize: 8, minMiners: 2 });
  const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 60_000);
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.ok(done.mergesDone >= 2, `${done.mergesDone} merges`);
  const ckpt = await cluster.api.checkpoint(run.id);
  const info = checkpointInfo(decodeSafetensors(ckpt));
  assert.equal(info.from, 0);

  // the blobs are objects orch/<id[0..2]>/<id[2..]>; the data dir holds no blob folder
  const keys = await bucketKeys();
  const ids = keys.map((k) => /^orch\/([0-9a-f]{2})\/([0-9a-f]{62})$/.exec(k)?.slice(1, 3).join(''));
  assert.ok(ids.every((id) => id !== undefined), `unexpected keys: ${keys.join(', ')}`);
  assert.ok(ids.length >= 3, `${ids.length} blobs in the bucket`);
  const orchDir = join(cluster.dir, 'orch', 'orchestrator');
  assert.ok(existsSync(join(orchDir, 'orchestrator.sqlite')));
  assert.equal(existsSync(join(orchDir, 'blobs')), false, 'no blob folder in the data dir');
  const db = new Database(join(orchDir, 'orchestrator.sqlite'), { readonly: true });
  const stateBlob = (db.prepare('SELECT state_blob AS b FROM stages WHERE run_id = ?').get(run.id) as { b: string }).b;
  db.close();
  assert.ok(ids.includes(stateBlob), 'the merged stage state is in the bucket');

  // the checkpoint is read from the bucket: a tampered object is caught, not served
  await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `orch/${stateBlob.slice(0, 2)}/${stateBlob.slice(2)}`, Body: new Uint8Array(ckpt.length).fill(1) }));
  await assert.rejects(cluster.api.checkpoint(run.id), (e: unknown) => e instanceof NimbleError && e.code === 'corrupt' && e.status === 500);
  assert.ok((await bucketKeys()).some((k) => k.startsWith(`orch/corrupt/${stateBlob}.`)), 'moved aside');
  const stderr = cluster.orchestrator!.lines.filter((l) => l.startsWith('stderr: '));
  assert.ok(!stderr.some((l) => /NodeVersionSupportWarning/.test(l)), stderr.join('\n'));
});

test('a bucket that does not exist, or a --blobs value that is not a store, stops the start with one line', async () => {
  const [missing, bad] = await Promise.all([
    cluster.nbcli(['orchestrator', 'start', '--port', '0', '--no-chain', '--blobs', `s3://no-such-bucket?endpoint=${encodeURIComponent(s3.endpoint)}`], join(cluster.dir, 'orch2')),
    cluster.nbcli(['orchestrator', 'start', '--port', '0', '--no-chain', '--blobs', 'gs://bucket'], join(cluster.dir, 'orch3')),
  ]);
  assert.notEqual(missing.code, 0);
  assert.match(missing.stderr + JSON.stringify(missing.out), /S3 bucket 'no-such-bucket' does not exist at s3:\/\/no-such-bucket \(http:\/\/127\.0\.0\.1:\d+\)/);
  assert.ok(!/NodeVersionSupportWarning|at .*node_modules/.test(missing.stderr), missing.stderr);
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr + JSON.stringify(bad.out), /--blobs 'gs:\/\/bucket': unknown scheme 'gs:'/);
  assert.equal(existsSync(join(cluster.dir, 'orch3', 'orchestrator', 'orchestrator.sqlite')), false, 'refused before anything was made');
});
