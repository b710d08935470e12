// A real S3-protocol server for tests and benches: s3rver in a child process,
// on a random loopback port, its objects in a temp folder, with one bucket
// made. s3rver accepts the fixed credentials S3RVER / S3RVER.
//
// It runs in a child of its own because s3rver 3.7 encrypts ListObjectsV2
// continuation tokens with DES, which Node 20's OpenSSL 3 only offers with
// --openssl-legacy-provider (in this process, any listing longer than one page
// would fail with InternalError).
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { S3Client } from '@aws-sdk/client-s3';

const root = new URL('../..', import.meta.url).pathname;

/** The child: starts s3rver with the options in $S3RVER_OPTIONS and prints its port. */
const CHILD = `
const S3rver = require('s3rver');
const server = new S3rver(JSON.parse(process.env.S3RVER_OPTIONS));
server.run().then(({ port }) => console.log(JSON.stringify({ port })), (err) => { console.error(err); process.exit(1); });
process.on('SIGTERM', () => server.close().finally(() => process.exit(0)));
`;

/** how long s3rver may take to listen (about 0.5 s) before it is stopped and startS3 rejects */
const START_TIMEOUT_MS = 30_000;

/** The credentials s3rver accepts. */
export const S3RVER_CREDENTIALS = { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' } as const;

export interface TestS3 {
  /** `s3://<bucket>?endpoint=...&region=us-east-1&pathStyle=true`, for --blobs */
  url: string;
  /** http://127.0.0.1:<port> */
  endpoint: string;
  bucket: string;
  /** a client of the server, for looking at or tampering with objects */
  client: S3Client;
  /** Stops the server and removes its folder. */
  close(): Promise<void>;
}

/** Starts s3rver on 127.0.0.1 (a free port) with bucket `bucket` (default 'nimble-test'). */
export async function startS3(bucket: string = 'nimble-test'): Promise<TestS3> {
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const directory = await mkdtemp(join(tmpdir(), 'nimble-s3rver-'));
  const options = { port: 0, address: '127.0.0.1', silent: true, directory, configureBuckets: [{ name: bucket }] };
  const child = spawn(process.execPath, ['--openssl-legacy-provider', '-e', CHILD], {
    cwd: root,
    env: { ...process.env, S3RVER_OPTIONS: JSON.stringify(options) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  // a spawn error (no 'exit' follows it) ends it too
  let spawnError: Error | null = null;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => resolve());
    child.once('error', (err) => {
      spawnError = err;
      resolve();
    });
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null && !spawnError) {
      child.kill('SIGTERM');
      // s3rver's close() that never ends does not hold the tests
      const kill = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(kill);
    }
    await exited;
    await rm(directory, { recursive: true, force: true });
  };
  let port: number;
  try {
    port = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`s3rver did not listen within ${START_TIMEOUT_MS} ms: ${stderr.trim() || 'no output'}`)), START_TIMEOUT_MS);
      createInterface({ input: child.stdout! }).once('line', (line) => {
        clearTimeout(timer);
        try {
          resolve((JSON.parse(line) as { port: number }).port);
        } catch {
          reject(new Error(`s3rver printed ${JSON.stringify(line)} instead of its port: ${stderr.trim()}`));
        }
      });
      void exited.then(() => {
        clearTimeout(timer);
        reject(new Error(spawnError ? `s3rver did not start: ${spawnError.message}` : `s3rver exited before it listened: ${stderr}`));
      });
    });
  } catch (err) {
    await stop();
    throw err;
  }
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new S3Client({ endpoint, region: 'us-east-1', forcePathStyle: true, credentials: S3RVER_CREDENTIALS });
  return {
    url: `s3://${bucket}?endpoint=${encodeURIComponent(endpoint)}&region=us-east-1&pathStyle=true`,
    endpoint,
    bucket,
    client,
    async close() {
      client.destroy();
      await stop();
    },
  };
}
