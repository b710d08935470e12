// A developer's private blobs of every kind on a real paid network, and the
// attempts an outsider and a throwaway-key miner make to read them over every
// route that serves blob bytes (test/network/reads.test.ts, and the bench
// figure trust.blob_reads_refused in bench/trust.bench.ts).
//
// The world: an orchestrator on its local chain and two miners; a developer
// uploads a dataset, trains a job on it on one miner, upgrades it onto one
// stage × two replicas (so its second run starts from the job's checkpoint
// and merges), and stores a model file it has not published. While the
// grouped run merges, the blobs are read from the orchestrator's state: the
// dataset, a checkpoint (the second run's initial state), the stage's merged
// state, a merge round's pseudo-gradient slice and merged partition, and the
// model. Their ids are what an attacker can learn (the public views name
// datasets, models and, before this defence, checkpoints); here the test
// reads them from the SQLite file.
import { mkdirSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { DatasetClient } from '../../src/api/dataset-client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import { findNetwork } from '../../src/api/network.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { packDataset } from '../../src/data/dataset.ts';
import { mulberry32 } from '../../src/model/init.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';
import type { Cluster } from '../network/helpers.ts';
import { wholeModelBytes } from './whole-model.ts';

/** The kinds of blob a developer's work leaves on the orchestrator. */
export type BlobKind = 'dataset' | 'checkpoint' | 'initial_state' | 'unpublished_model' | 'stage_state' | 'merge_slice' | 'merged_partition';

export interface PrivateBlob {
  kind: BlobKind;
  id: string;
}

export interface BlobWorld {
  devKey: `0x${string}`;
  dev: string;
  /** the developer's client (signs) */
  api: OrchestratorClient;
  jobs: JobClient;
  jobId: string;
  /** the checkpoint step whose blob is `checkpoint` */
  step: number;
  /** the grouped run (one stage × two replicas) and the first one */
  runId: string;
  firstRunId: string;
  modelSha: string;
  modelBytes: Uint8Array;
  blobs: PrivateBlob[];
}

/** About `bytes` of text of a small vocabulary. */
function text(bytes: number, seed: number): string {
  const words = ['the', 'whale', 'sea', 'ship', 'captain', 'harpoon', 'white', 'deep', 'sail', 'storm', 'and', 'of', 'a', 'wind'];
  const rand = mulberry32(seed);
  const out: string[] = [];
  for (let n = 0; n < bytes; ) {
    const w = words[Math.floor(rand() * words.length)] + (rand() < 0.08 ? '.\n' : ' ');
    out.push(w);
    n += w.length;
  }
  return out.join('');
}

async function until<T>(what: string, get: () => Promise<T | undefined> | T | undefined, timeoutMs: number): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    let v: T | undefined;
    try {
      v = await get();
    } catch {
      // the orchestrator is busy; asked again
    }
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`${what}: not within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The orchestrator's state file, read-only. */
function readState<T>(cluster: Cluster, read: (db: Database.Database) => T): T {
  const db = new Database(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true, fileMustExist: true });
  try {
    return read(db);
  } finally {
    db.close();
  }
}

/**
 * Builds the world on `cluster` (an orchestrator started on its chain with
 * --min-stake 0, and two miners), up to the grouped run merging, and returns
 * the ids of its blobs of every kind.
 */
export async function buildBlobWorld(cluster: Cluster, log: (line: string) => void = () => {}): Promise<BlobWorld> {
  const devKey = generatePrivateKey();
  const api = new OrchestratorClient(cluster.url, { wallet: devKey });
  const jobs = new JobClient(api);
  const project = join(cluster.dir, 'private-data');
  mkdirSync(project, { recursive: true });
  writeFileSync(join(project, 'notes.txt'), text(150_000, 7));
  const packed = packDataset(project);
  const datasetSha = packed.id.slice('sha256:'.length);
  await new DatasetClient(api).upload(packed.bytes, datasetSha);
  const modelBytes = wholeModelBytes(31, 200);
  const stored = await new ModelClient(api).storeFile(modelBytes, { name: 'private-draft', pricePer1kTokens: 0n });
  log(`dataset ${datasetSha.slice(0, 12)}, model ${stored.model.sha256.slice(0, 12)} stored (not published)`);

  const job = await jobs.submit({ name: 'private', model: 'gpt-micro', data: packed.id, training: { steps: 2000, batchSize: 8, mergeEvery: 5 }, checkpointEvery: 20 });
  const first = await until('a first checkpoint', async () => {
    const j = await jobs.get(job.id);
    return j.status === 'executing' && j.checkpoints.length >= 1 ? j : undefined;
  }, 180_000);
  log(`job ${job.id} checkpointed at step ${first.checkpoints[0].step}; upgrading it onto 1 stage × 2 replicas`);
  await jobs.upgrade(job.id, { stages: 1, replicas: 2 });
  const moved: JobView = await until('the grouped run', async () => {
    const j = await jobs.get(job.id);
    return j.runId !== first.runId && j.runId ? j : undefined;
  }, 180_000);
  const runId = moved.runId!;
  // a merge round of the grouped run with its slices, a merged state of its stage
  const found = await until(
    'a merge round with slices and merged partitions, and a merged stage state',
    () =>
      readState(cluster, (db) => {
        const state = db.prepare('SELECT state_blob AS blob FROM stages WHERE run_id = ? AND state_blob IS NOT NULL').get(runId) as { blob: string } | undefined;
        const slice = db.prepare('SELECT blob FROM merge_uploads WHERE run_id = ? ORDER BY round DESC LIMIT 1').get(runId) as { blob: string } | undefined;
        const merged = db.prepare('SELECT blob FROM merge_results WHERE run_id = ? ORDER BY round DESC LIMIT 1').get(runId) as { blob: string } | undefined;
        const init = db.prepare("SELECT json_extract(options, '$.init') AS blob FROM runs WHERE id = ?").get(runId) as { blob: string | null } | undefined;
        return state && slice && merged && init?.blob ? { state: state.blob, slice: slice.blob, merged: merged.blob, init: init.blob } : undefined;
      }),
    180_000,
  );
  const view = await jobs.get(job.id);
  const checkpoint = view.checkpoints.find((c) => c.sha256 === found.init) ?? view.checkpoints[0];
  log(`run ${runId} merging: state ${found.state.slice(0, 12)}, slice ${found.slice.slice(0, 12)}, merged ${found.merged.slice(0, 12)}`);
  return {
    devKey,
    dev: privateKeyToAccount(devKey).address,
    api,
    jobs,
    jobId: job.id,
    step: checkpoint.step,
    runId,
    firstRunId: first.runId!,
    modelSha: stored.model.sha256,
    modelBytes,
    blobs: [
      { kind: 'dataset', id: datasetSha },
      { kind: 'checkpoint', id: checkpoint.sha256 },
      { kind: 'initial_state', id: found.init },
      { kind: 'unpublished_model', id: stored.model.sha256 },
      { kind: 'stage_state', id: found.state },
      { kind: 'merge_slice', id: found.slice },
      { kind: 'merged_partition', id: found.merged },
    ],
  };
}

/** An outsider (a fresh wallet, and no key at all) and a miner that joined with a throwaway key and holds nothing. */
export interface Attackers {
  outsider: RequestSigner;
  miner: RequestSigner;
  minerAddress: string;
}

/** Makes the attackers: a fresh wallet, and a miner joined with a fresh wallet and session key, whose hardware is too small to be given work. */
export async function joinAttackers(url: string): Promise<Attackers> {
  const { domain } = await findNetwork(url);
  const key = generatePrivateKey();
  const session = SessionKey.generate();
  const wallet = new RequestSigner(key, { domain });
  const join = JSON.stringify({ name: 'thief', url: 'http://127.0.0.1:9', hardware: { gflops: 0.001, threads: 1, memoryBytes: 1 }, bandwidthMbps: 1, sessionKey: session.publicKey });
  const joined = await fetch(`${url}/miners/join`, { method: 'POST', body: join, headers: { 'content-type': 'application/json', ...(await wallet.sign('POST', '/miners/join', new TextEncoder().encode(join))) } });
  if (joined.status !== 200) throw new Error(`the throwaway miner could not join: ${joined.status} ${await joined.text()}`);
  return { outsider: new RequestSigner(generatePrivateKey(), { domain }), miner: new RequestSigner({ session, address: wallet.address }, { domain }), minerAddress: wallet.address };
}

export interface ReadAttempt {
  who: 'outsider' | 'miner';
  kind: BlobKind;
  route: string;
  status: number;
  /** bytes that came back with a 2xx */
  bytes: number;
}

/** A GET of `path`, signed by `signer` (or not), on a connection of its own: its status and the size of its body. */
export async function getStatus(url: string, path: string, signer: RequestSigner | null, headers: Record<string, string> = {}): Promise<{ status: number; bytes: number }> {
  const u = new URL(path, url);
  const signed = signer ? await signer.sign('GET', path) : {};
  return new Promise((resolve, reject) => {
    const req = request({ hostname: u.hostname, port: u.port, path, method: 'GET', headers: { ...signed, ...headers }, agent: false }, (res) => {
      let bytes = 0;
      res.on('data', (c: Buffer) => (bytes += c.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/**
 * Every read the attackers try, of every blob kind, over every route that
 * serves blob bytes: the miners' GET /blobs/:id (signed by the miner, and by
 * the outsider's wallet), a model's file (anonymous, the outsider's wallet,
 * the miner's session), a job's checkpoint by step and a run's checkpoint
 * (the outsider's wallet). A refusal is any answer but a 2xx.
 */
export async function attemptBlobReads(url: string, world: BlobWorld, a: Attackers): Promise<ReadAttempt[]> {
  const out: ReadAttempt[] = [];
  const attempt = async (who: ReadAttempt['who'], kind: BlobKind, route: string, path: string, signer: RequestSigner | null): Promise<void> => {
    const r = await getStatus(url, path, signer);
    out.push({ who, kind, route, status: r.status, bytes: r.status >= 200 && r.status < 300 ? r.bytes : 0 });
  };
  for (const b of world.blobs) {
    await attempt('miner', b.kind, 'GET /blobs/:id (miner session)', `/blobs/${b.id}`, a.miner);
    await attempt('miner', b.kind, 'GET /models/:sha256/file (miner session)', `/models/${b.id}/file`, a.miner);
    await attempt('outsider', b.kind, 'GET /blobs/:id (outsider wallet)', `/blobs/${b.id}`, a.outsider);
    await attempt('outsider', b.kind, 'GET /models/:sha256/file (anonymous)', `/models/${b.id}/file`, null);
    await attempt('outsider', b.kind, 'GET /models/:sha256/file (outsider wallet)', `/models/${b.id}/file`, a.outsider);
  }
  await attempt('outsider', 'checkpoint', 'GET /jobs/:id/checkpoints/:step (outsider wallet)', `/jobs/${world.jobId}/checkpoints/${world.step}`, a.outsider);
  for (const run of [world.firstRunId, world.runId]) await attempt('outsider', 'checkpoint', 'GET /runs/:id/checkpoint (outsider wallet)', `/runs/${run}/checkpoint`, a.outsider);
  return out;
}
