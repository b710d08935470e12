// The dataset store, in process (fastify inject, and one real socket for the
// one-upload-at-a-time rule): a developer uploads packed bytes, hashed by the
// orchestrator itself; the same bytes again are not stored twice; a stated
// sha256 that differs, an oversized or empty body, an unsigned upload, one
// past the owner's row quota and one past the network's free store (its
// bytes are not counted per key) are refused and store nothing. Runs and jobs may
// name only a dataset their owner uploaded, large enough for the model; a
// dataset is kept while a run names it, deleted by its owner or after its
// retention, and its blob is collected when no row names it any more.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { DatasetList, DatasetView, UploadedDataset } from '../../../src/api/datasets.ts';
import { MAX_DATASET_BYTES, minCorpusBytes } from '../../../src/data/dataset.ts';
import type { HttpServer } from '../../../src/http/server.ts';
import { resolveJobSpec } from '../../../src/jobs/spec.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import { DEFAULT_FREE_STORE_BYTES } from '../../../src/orchestrator/blobs/store-budget.ts';
import { checkJobData, DatasetService, MAX_DATASETS_PER_OWNER } from '../../../src/orchestrator/jobs/datasets.ts';
import { buildApi } from '../../../src/orchestrator/http.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { parse } from '../../../src/protocol/messages.ts';
import { RequestSigner } from '../../../src/protocol/signing.ts';

const DAY = 86_400_000;
let dir: string;
let state: OrchestratorState;
let blobs: FsBlobStore;
let coordinator: Coordinator;
let datasets: DatasetService;
let app: HttpServer;
let dev: RequestSigner;
let other: RequestSigner;
/** the orchestrator's clock (the coordinator's collector and the dataset store read it) */
let clock = Date.now();

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-datasets-'));
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  blobs = await FsBlobStore.open(join(dir, 'blobs'));
  coordinator = new Coordinator(state, blobs, { spotChecks: { rate: 0 }, gc: { blobGraceMs: 0 }, now: () => clock });
  datasets = new DatasetService(state, blobs, { retentionMs: DAY }, () => clock);
  app = buildApi(coordinator, null, null, datasets);
  const { domain } = coordinator.identity;
  dev = new RequestSigner(generatePrivateKey(), { domain });
  other = new RequestSigner(generatePrivateKey(), { domain });
});
after(async () => {
  await app?.close();
  await coordinator?.close();
  state?.close();
  rmSync(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

async function send(method: 'GET' | 'POST' | 'DELETE', url: string, opts: { bytes?: Uint8Array; signer?: RequestSigner; headers?: Record<string, string> } = {}): Promise<Answer> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.bytes) headers['content-type'] = 'application/octet-stream';
  if (opts.signer) Object.assign(headers, await opts.signer.sign(method, url, opts.bytes));
  const res = await app.inject({ method, url, headers, payload: opts.bytes ? Buffer.from(opts.bytes) : undefined });
  return { status: res.statusCode, body: res.body ? (JSON.parse(res.body) as Record<string, unknown>) : {} };
}

const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');
const upload = (bytes: Uint8Array, signer: RequestSigner, stated: string | null = sha(bytes)): Promise<Answer> =>
  send('POST', stated === null ? '/datasets' : `/datasets?sha256=${stated}`, { bytes, signer });
/** Text of `n` bytes, different for each `seed`. */
const corpus = (n: number, seed: string): Uint8Array => new TextEncoder().encode(`${seed}: `.padEnd(n, `the whale ${seed} `).slice(0, n));

function isError(a: Answer, status: number, code: string, message?: RegExp): void {
  assert.equal(a.status, status, JSON.stringify(a.body));
  assert.equal(a.body.code, code, JSON.stringify(a.body));
  if (message) assert.match(String(a.body.error), message);
}

async function blobCount(): Promise<number> {
  let n = 0;
  for await (const _ of blobs.list()) n++;
  return n;
}

const stored = async (): Promise<{ rows: number; blobs: number }> => ({ rows: state.datasets.list().length, blobs: await blobCount() });

test('an upload is hashed by the orchestrator and stored once; its owner uploading it again stores nothing new; another owner gets a row of their own over the same blob', async () => {
  const bytes = corpus(4000, 'first');
  const a = await upload(bytes, dev);
  assert.equal(a.status, 201, JSON.stringify(a.body));
  const { dataset, created } = parse(UploadedDataset, a.body, 'upload');
  assert.ok(created);
  assert.deepEqual({ id: dataset.id, sha256: dataset.sha256, owner: dataset.owner, bytes: dataset.bytes }, { id: `sha256:${sha(bytes)}`, sha256: sha(bytes), owner: dev.address, bytes: bytes.length });
  assert.equal(dataset.expiresAt, dataset.usedAt + DAY);
  assert.deepEqual(await blobs.get(sha(bytes)), bytes);
  const before = await stored();

  // the CLI asks before it uploads: public metadata, by owner
  assert.equal(parse(DatasetView, (await send('GET', `/datasets/${sha(bytes)}?owner=${dev.address}`)).body, 'view').owner, dev.address);
  assert.equal(parse(DatasetView, (await send('GET', `/datasets/${sha(bytes)}`)).body, 'view').bytes, bytes.length);
  isError(await send('GET', `/datasets/${sha(bytes)}?owner=${other.address}`), 404, 'not_found', new RegExp(`uploaded by ${other.address}`));
  isError(await send('GET', `/datasets/${'0'.repeat(64)}`), 404, 'not_found');
  isError(await send('GET', '/datasets/sha256:abc'), 400, 'invalid', /params/);

  // uploaded again (with or without the stated sha256): 200, nothing new stored, its use time moves
  clock += 1000;
  const again = await upload(bytes, dev, null);
  assert.equal(again.status, 200, JSON.stringify(again.body));
  const second = parse(UploadedDataset, again.body, 'upload');
  assert.equal(second.created, false);
  assert.equal(second.dataset.createdAt, dataset.createdAt);
  assert.equal(second.dataset.usedAt, dataset.usedAt + 1000);
  assert.deepEqual(await stored(), before);

  // another developer with the same bytes: their own row, the same blob
  assert.equal((await upload(bytes, other)).status, 201);
  assert.deepEqual(await stored(), { rows: before.rows + 1, blobs: before.blobs });
  const mine = parse(DatasetList, (await send('GET', `/datasets?owner=${dev.address}`)).body, 'list');
  assert.deepEqual(mine.map((d) => d.sha256), [sha(bytes)]);
});

test('a stated sha256 that differs, an oversized, empty, unsigned or foreign-signed upload is refused and stores nothing', async () => {
  const before = await stored();
  const bytes = corpus(3000, 'refused');
  isError(await upload(bytes, dev, sha(corpus(3000, 'something else'))), 400, 'sha_mismatch', new RegExp(`the body has sha256 ${sha(bytes)}, not .*; nothing was stored`));
  isError(await upload(bytes, dev, 'ABC'), 400, 'invalid', /querystring/);
  isError(await upload(new Uint8Array(0), dev, null), 400, 'invalid', /empty/);
  // announced past the limit: refused from its headers, before the body is read
  const url = '/datasets';
  const big = await app.inject({
    method: 'POST',
    url,
    headers: { 'content-type': 'application/octet-stream', 'content-length': String(MAX_DATASET_BYTES + 1), ...(await dev.sign('POST', url, Buffer.alloc(16))) },
    payload: Buffer.alloc(16),
  });
  assert.equal(big.statusCode, 413, big.body);
  assert.match(big.body, /at most 268435456 bytes/);
  const unsigned = await app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream' }, payload: Buffer.from(bytes) });
  assert.equal(unsigned.statusCode, 401);
  isError(await upload(bytes, new RequestSigner(generatePrivateKey(), { domain: 'nimble:elsewhere' })), 401, 'bad_signature');
  // a body that is not the one signed
  const forged = await app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream', ...(await dev.sign('POST', url, bytes)) }, payload: Buffer.from(corpus(3000, 'forged')) });
  assert.equal(forged.statusCode, 401, forged.body);
  assert.deepEqual(await stored(), before);
});

test(`the quota: at most ${MAX_DATASETS_PER_OWNER} datasets per address (403, from the headers); the bytes are the network's free store, not per key (402); the same bytes again take nothing`, async () => {
  const hoarder = new RequestSigner(generatePrivateKey(), { domain: coordinator.identity.domain });
  const kept = corpus(2000, 'kept');
  assert.equal((await upload(kept, hoarder)).status, 201);
  for (let i = 1; i < MAX_DATASETS_PER_OWNER; i++) state.datasets.add({ sha256: sha(corpus(100, `hoard ${i}`)), owner: hoarder.address, bytes: 100, retentionMs: DAY }, clock);
  const before = await stored();
  isError(await upload(corpus(2000, 'one more'), hoarder), 403, 'quota_exceeded', new RegExp(`keeps ${MAX_DATASETS_PER_OWNER} datasets, the most one address may; delete one`));
  assert.equal((await upload(kept, hoarder)).status, 200, 'its own dataset again is taken');
  assert.deepEqual(await stored(), before);

  // one key holds the network's free store: a fresh key's upload is refused, whoever it is; the same bytes again from their owner pass
  const big = new RequestSigner(generatePrivateKey(), { domain: coordinator.identity.domain });
  const hog = sha(corpus(100, 'big'));
  state.datasets.add({ sha256: hog, owner: big.address, bytes: DEFAULT_FREE_STORE_BYTES - 100_000, retentionMs: DAY }, clock);
  const fresh = new RequestSigner(generatePrivateKey(), { domain: coordinator.identity.domain });
  isError(await upload(corpus(2000, 'too much'), fresh), 402, 'payment_required', /the network's free store \(1\.00 GiB for everyone together, --free-store\) holds .*: 64\.0 KiB more are not free/);
  isError(await upload(corpus(2000, 'too much'), big), 402, 'payment_required', /free store/);
  // claiming to pay on an unpaid network is no way past it
  isError(await send('POST', `/datasets?sha256=${sha(corpus(2000, 'too much'))}&keepDays=3`, { bytes: corpus(2000, 'too much'), signer: fresh }), 402, 'payment_required', /retry once unpaid models and datasets expire/);
  state.datasets.remove(hog, big.address);
  assert.equal((await upload(corpus(900, 'fits'), fresh)).status, 201);
});

test('one dataset upload is received at a time: a second one meanwhile is refused from its headers (429), then goes through', async () => {
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const first = corpus(200_000, 'slow');
  const url = `/datasets?sha256=${sha(first)}`;
  const slow = request({ host: '127.0.0.1', port, method: 'POST', path: url, headers: { 'content-type': 'application/octet-stream', 'content-length': String(first.length), ...(await dev.sign('POST', url, first)) } });
  const answered = new Promise<number>((resolve, reject) => {
    slow.on('response', (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    slow.on('error', reject);
  });
  slow.write(first.subarray(0, first.length >> 1));
  await new Promise((r) => setTimeout(r, 200));
  const second = corpus(5000, 'second');
  const post = async (): Promise<Answer> => {
    const res = await fetch(`http://127.0.0.1:${port}/datasets`, { method: 'POST', body: Buffer.from(second), headers: { 'content-type': 'application/octet-stream', ...(await other.sign('POST', '/datasets', second)) } });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  isError(await post(), 429, 'rate_limited', /another dataset upload is under way/);
  slow.end(first.subarray(first.length >> 1));
  assert.equal(await answered, 201);
  assert.equal((await post()).status, 201);
});

test("runs and jobs name only a dataset their owner uploaded, large enough for the model's context; a path is refused", async () => {
  const small = corpus(minCorpusBytes(16) - 1, 'small');
  const enough = corpus(minCorpusBytes(16), 'enough');
  assert.equal((await upload(small, dev)).status, 201);
  assert.equal((await upload(enough, dev)).status, 201);
  const run = (data: string, owner = dev.address) => coordinator.createRun({ model: 'gpt-micro', data, steps: 10 }, owner);
  const refused = (fn: () => unknown, message: RegExp) => assert.throws(fn, (e: unknown) => e instanceof NimbleError && e.status === 400 && message.test(e.message));
  refused(() => run(`sha256:${'ab'.repeat(32)}`), /no dataset sha256:(ab)+ is stored on this orchestrator: upload it first/);
  refused(() => run(`sha256:${sha(enough)}`, other.address), new RegExp(`was not uploaded by ${other.address}: a job trains only on data its owner uploaded`));
  refused(() => run(`sha256:${sha(small)}`), new RegExp(`dataset sha256:${sha(small)} has ${small.length} bytes; a model of context 16 needs at least ${enough.length}`));
  refused(() => run('/etc/passwd'), /is not available to miners/);
  const ok = run(`sha256:${sha(enough)}`);
  assert.equal(ok.data, `sha256:${sha(enough)}`);
  coordinator.cancelRun(ok.id, dev.address);

  const job = (data: string) => resolveJobSpec({ name: 'j', model: 'gpt-micro', data, training: { steps: 10 } });
  checkJobData(state, job(`sha256:${sha(enough)}`), dev.address);
  checkJobData(state, job('moby-dick'), dev.address);
  refused(() => checkJobData(state, job('/etc/passwd'), dev.address), /'\/etc\/passwd' is not data the network's miners load: .* nbcli job submit uploads a spec's local file or folder/);
  refused(() => checkJobData(state, job(`sha256:${sha(enough)}`), other.address), /was not uploaded by/);
  refused(() => checkJobData(state, job(`sha256:${sha(small)}`), dev.address), /needs at least/);
});

test('a dataset is kept while a run of its owner names it; then its owner deletes it, or it expires; its blob goes when no row names it', async () => {
  const a = corpus(minCorpusBytes(16) + 10, 'kept while used');
  const b = corpus(minCorpusBytes(16) + 20, 'expires');
  assert.equal((await upload(a, dev)).status, 201);
  assert.equal((await upload(b, dev)).status, 201);
  const run = coordinator.createRun({ model: 'gpt-micro', data: `sha256:${sha(a)}`, steps: 10 }, dev.address);

  // in use: not deleted by its owner, nor expired however long it runs
  isError(await send('DELETE', `/datasets/${sha(a)}`, { signer: dev }), 409, 'conflict', new RegExp(`in use by run ${run.id}`));
  isError(await send('DELETE', `/datasets/${sha(a)}`), 401, 'missing');
  isError(await send('DELETE', `/datasets/${sha(a)}`, { signer: other }), 404, 'not_found');
  clock += 2 * DAY;
  assert.equal((await upload(b, other)).status, 201); // the same bytes, another owner's row, used later
  clock += DAY / 2;
  assert.ok(datasets.collect(clock) >= 1);
  assert.ok(state.datasets.heldBy(sha(a), dev.address), 'a dataset in use is kept');
  assert.ok(!state.datasets.heldBy(sha(b), dev.address), 'an unused one expired');
  assert.ok(state.datasets.heldBy(sha(b), other.address), "another owner's row of the same bytes expires on its own");
  clock += 1;
  await coordinator.gc.collect();
  assert.ok(await blobs.has(sha(b)), 'a blob another row names is kept');
  clock += DAY;
  assert.ok(datasets.collect(clock) >= 1);
  clock += 1;
  await coordinator.gc.collect();
  assert.ok(await blobs.has(sha(a)));
  assert.ok(!(await blobs.has(sha(b))), 'the blob no row names any more is collected');

  // the run ends: the dataset is kept for the retention after its last use, or until its owner deletes it
  coordinator.cancelRun(run.id, dev.address);
  clock += DAY - 60_000;
  datasets.collect(clock);
  assert.ok(state.datasets.heldBy(sha(a), dev.address), 'kept for the retention period after the run ended');
  const deleted = await send('DELETE', `/datasets/${sha(a)}`, { signer: dev });
  assert.equal(parse(DatasetView, deleted.body, 'deleted').sha256, sha(a));
  assert.ok(!state.datasets.heldBy(sha(a), dev.address));
  clock += 1;
  await coordinator.gc.collect();
  assert.ok(!(await blobs.has(sha(a))), 'deleted by its owner: its blob is collected');
});
