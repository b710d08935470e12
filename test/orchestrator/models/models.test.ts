// The model store's routes, in process (fastify inject) against a real anvil
// with the contracts: a developer stores a file or one of their job's
// checkpoints (a GPT's or an MLP classifier's, the view naming which) and
// gets an attestation the ModelRegistry accepts from them
// (and from nobody else); the files download whole or resumed; stored models
// are never collected. The attacks: someone else's job checkpoint (403), a
// hash another owner stored first (409, no attestation), oversized and
// garbage uploads (4xx, nothing stored), and an orchestrator without a chain.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { Hex } from 'viem';
import { PublishTicket, StoredModelList, StoredModelView } from '../../../src/api/models.ts';
import { modelRegistryAbi } from '../../../src/chain/abis.ts';
import { signerFor } from '../../../src/chain/client.ts';
import { listModels, publishAttestationDigest, publishModel } from '../../../src/chain/registry.ts';
import { ensureGas } from '../../../src/chain/token.ts';
import { ChainTxError } from '../../../src/chain/tx.ts';
import { createHttpServer, type HttpServer } from '../../../src/http/server.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import { buildApi, MAX_JSON_BYTES } from '../../../src/orchestrator/http.ts';
import { MAX_MODEL_BYTES, MAX_MODELS_PER_OWNER } from '../../../src/orchestrator/models/models.ts';
import { modelRoutes } from '../../../src/orchestrator/routes/models.ts';
import { BlobAccess, publicationOf } from '../../../src/orchestrator/blobs/access.ts';
import { chainModelRegistry } from '../../../src/orchestrator/models/deployment-registry.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { parse } from '../../../src/protocol/messages.ts';
import { RequestSigner, RequestVerifier } from '../../../src/protocol/signing.ts';
import { startTestChain, type TestChain } from '../../chain/helpers.ts';
import { mlpModelBytes, SMALL_MLP, wholeModelBytes } from '../../helpers/whole-model.ts';

let dir: string;
let state: OrchestratorState;
let blobs: FsBlobStore;
let coordinator: Coordinator;
let chain: TestChain;
/** the model routes with the chain (as an orchestrator started with one) */
let app: HttpServer;
/** the whole API of an orchestrator started with --no-chain */
let unpaid: HttpServer;
const devKey = generatePrivateKey();
const otherKey = generatePrivateKey();
let dev: RequestSigner;
let other: RequestSigner;
const DAY = 86_400_000;
const JOB = 'job-00000000000000a1';

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-models-'));
  chain = await startTestChain();
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  blobs = await FsBlobStore.open(join(dir, 'blobs'));
  coordinator = new Coordinator(state, blobs, { spotChecks: { rate: 0 }, gc: { blobGraceMs: 0 } });
  const { domain } = coordinator.identity;
  app = createHttpServer({ bodyLimit: MAX_JSON_BYTES, verifier: new RequestVerifier({ domain, notBefore: Date.now(), sessionKeyOf: () => undefined }) });
  modelRoutes(app, coordinator, { client: chain.client, signer: chain.operator }, new BlobAccess(state, publicationOf(chainModelRegistry({ client: chain.client, signer: chain.operator }))));
  unpaid = buildApi(coordinator);
  dev = new RequestSigner(devKey, { domain });
  other = new RequestSigner(otherKey, { domain });
});
after(async () => {
  await app?.close();
  await unpaid?.close();
  await coordinator?.close();
  state?.close();
  await chain?.stop();
  rmSync(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  body: Record<string, unknown>;
  raw: Buffer;
  headers: Record<string, unknown>;
}

async function send(server: HttpServer, method: 'GET' | 'POST', url: string, opts: { json?: unknown; bytes?: Uint8Array; signer?: RequestSigner; headers?: Record<string, string> } = {}): Promise<Answer> {
  const body = opts.json !== undefined ? new TextEncoder().encode(JSON.stringify(opts.json)) : opts.bytes;
  const headers: Record<string, string> = { ...opts.headers };
  if (body) headers['content-type'] = opts.json !== undefined ? 'application/json' : 'application/octet-stream';
  if (opts.signer) Object.assign(headers, await opts.signer.sign(method, url, body));
  const res = await server.inject({ method, url, headers, payload: body ? Buffer.from(body) : undefined });
  let parsed: Record<string, unknown> = {};
  try {
    parsed = JSON.parse(res.body) as Record<string, unknown>;
  } catch {
    // binary
  }
  return { status: res.statusCode, body: parsed, raw: res.rawPayload, headers: res.headers };
}

const upload = (bytes: Uint8Array, signer: RequestSigner, query = 'name=micro&pricePer1kTokens=1000', server = app): Promise<Answer> => send(server, 'POST', `/models/file?${query}`, { bytes, signer });
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

function isError(a: Answer, status: number, code: string, message?: RegExp): void {
  assert.equal(a.status, status, JSON.stringify(a.body));
  assert.equal(a.body.code, code, JSON.stringify(a.body));
  if (message) assert.match(String(a.body.error), message);
}

function ticketOf(a: Answer): PublishTicket {
  assert.equal(a.status, 200, JSON.stringify(a.body));
  return parse(PublishTicket, a.body, 'ticket');
}

/** Sends the ticket's publish from `key`'s wallet, claiming `owner`. */
async function publishWith(key: Hex, t: PublishTicket, owner = t.attestation.owner as Hex): Promise<bigint> {
  const account = privateKeyToAccount(key);
  await ensureGas(chain.client, account.address);
  const a = t.attestation;
  const { id } = await publishModel(chain.client, signerFor(chain.client, account), {
    checkpointSha256: a.checkpointSha256 as Hex,
    name: a.name,
    metadataURI: a.metadataURI,
    owner,
    pricePer1kTokens: BigInt(a.pricePer1kTokens),
    attestation: { deadline: BigInt(a.deadline), signature: a.signature as Hex },
  });
  return id;
}

const storedCount = (): number => state.models.list().length;

async function blobCount(): Promise<number> {
  let n = 0;
  for await (const _ of blobs.list()) n++;
  return n;
}

test('an uploaded file is stored with an attestation for its uploader, which the registry takes from the uploader only; the file downloads whole and resumed', async () => {
  const bytes = wholeModelBytes(1, 7);
  const t = ticketOf(await upload(bytes, dev));
  assert.equal(t.model.sha256, sha(bytes));
  assert.equal(t.model.owner, dev.address);
  assert.equal(t.model.bytes, bytes.length);
  assert.equal(t.model.jobId, null);
  assert.equal(t.model.step, 7);
  assert.deepEqual([t.model.kind, t.model.model], ['gpt', 'gpt-micro']);
  const a = t.attestation;
  assert.equal(a.owner, dev.address);
  assert.equal(a.signer, chain.operator.account.address);
  assert.equal(a.checkpointSha256, `0x${sha(bytes)}`);
  assert.equal(a.pricePer1kTokens, '1000');
  assert.match(a.metadataURI, new RegExp(`/models/${sha(bytes)}$`));
  assert.equal(a.registry, chain.client.deployment.modelRegistry);
  // the digest the contract checks is the one signed
  assert.equal(
    await chain.client.public.readContract({
      address: chain.client.deployment.modelRegistry,
      abi: modelRegistryAbi,
      functionName: 'publishAttestationDigest',
      args: [a.checkpointSha256 as Hex, a.owner as Hex, a.name, a.metadataURI, BigInt(a.pricePer1kTokens), BigInt(a.deadline)],
    }),
    publishAttestationDigest(chain.client, { checkpointSha256: a.checkpointSha256 as Hex, owner: a.owner as Hex, name: a.name, metadataURI: a.metadataURI, pricePer1kTokens: BigInt(a.pricePer1kTokens), deadline: BigInt(a.deadline) }),
  );

  // a front-runner replaying it: from its own address with the developer as owner, or as the owner itself, fails
  await assert.rejects(publishWith(otherKey, t), (e: unknown) => e instanceof ChainTxError && e.errorName === 'NotAllowed');
  await assert.rejects(publishWith(otherKey, t, other.address), (e: unknown) => e instanceof ChainTxError && e.errorName === 'InvalidAttestation');
  const id = await publishWith(devKey, t);
  const onChain = (await listModels(chain.client)).find((m) => m.id === id)!;
  assert.equal(onChain.checkpointSha256, `0x${sha(bytes)}`);
  assert.equal(onChain.owner, dev.address);

  // listed and shown; the file is public and resumes from a range
  const list = parse(StoredModelList, (await send(app, 'GET', '/models')).body, 'list');
  assert.ok(list.some((m) => m.sha256 === sha(bytes)));
  assert.equal(parse(StoredModelList, (await send(app, 'GET', `/models?owner=${other.address}`)).body, 'list').length, 0);
  assert.equal(parse(StoredModelView, (await send(app, 'GET', `/models/${sha(bytes)}`)).body, 'model').name, 'micro');
  const whole = await send(app, 'GET', `/models/${sha(bytes)}/file`);
  assert.equal(whole.status, 200);
  assert.deepEqual(new Uint8Array(whole.raw), bytes);
  assert.equal(whole.headers['x-content-sha256'], sha(bytes));
  const rest = await send(app, 'GET', `/models/${sha(bytes)}/file`, { headers: { range: 'bytes=1000-' } });
  assert.equal(rest.status, 206);
  assert.equal(rest.headers['content-range'], `bytes 1000-${bytes.length - 1}/${bytes.length}`);
  assert.deepEqual(new Uint8Array(rest.raw), bytes.subarray(1000));
  isError(await send(app, 'GET', `/models/${sha(bytes)}/file`, { headers: { range: `bytes=${bytes.length}-` } }), 416, 'range_not_satisfiable');
  isError(await send(app, 'GET', `/models/${'0'.repeat(64)}/file`), 404, 'not_found', /no stored model/);
  isError(await send(app, 'GET', '/models/nope/file'), 400, 'invalid', /params/);

  // its owner storing it again gets a fresh attestation (new name); the first row stays
  const again = ticketOf(await upload(bytes, dev, 'name=micro-v2&pricePer1kTokens=0'));
  assert.equal(again.attestation.name, 'micro-v2');
  assert.equal(again.model.createdAt, t.model.createdAt);
});

test("an MLP classifier's checkpoint, uploaded or a job's, is stored and attested as a GPT's is, its view naming its kind and reference", async () => {
  const bytes = mlpModelBytes(1, 150);
  const t = ticketOf(await upload(bytes, dev, 'name=spam-mlp&pricePer1kTokens=7'));
  assert.deepEqual({ kind: t.model.kind, model: t.model.model, config: t.model.config, step: t.model.step }, { kind: 'mlp', model: 'mlp:64-16-2', config: SMALL_MLP, step: 150 });
  assert.equal(t.attestation.checkpointSha256, `0x${sha(bytes)}`);
  assert.match(t.attestation.metadataURI, new RegExp(`/models/${sha(bytes)}$`));
  const id = await publishWith(devKey, t);
  assert.equal((await listModels(chain.client)).find((m) => m.id === id)!.checkpointSha256, `0x${sha(bytes)}`);
  const view = parse(StoredModelView, (await send(app, 'GET', `/models/${sha(bytes)}`)).body, 'model');
  assert.equal(view.kind, 'mlp');

  // a classifier job's checkpoint, stored by its owner
  const job = 'job-00000000000000b2';
  const cp = mlpModelBytes(2, 40);
  const blob = await blobs.put(cp);
  state.jobs.insert({ id: job, owner: dev.address, spec: { name: 'spam', model: { type: 'mlp', ...SMALL_MLP }, data: 'spam-assassin', training: { steps: 40 } }, steps: 40, timeoutMs: DAY, idleTimeoutMs: DAY, checkpointEvery: 40, retentionMs: DAY }, 1000);
  assert.ok(state.jobs.addCheckpoint({ jobId: job, step: 40, tokens: 40, loss: 0.1, blob, bytes: cp.length }, 1100));
  const fromJob = ticketOf(await send(app, 'POST', '/models', { json: { job, name: 'spam-job', pricePer1kTokens: '0' }, signer: dev }));
  assert.deepEqual({ kind: fromJob.model.kind, model: fromJob.model.model, jobId: fromJob.model.jobId, step: fromJob.model.step }, { kind: 'mlp', model: 'mlp:64-16-2', jobId: job, step: 40 });
});

test('a hash stored first by another owner gets no attestation (409): the first to store a checkpoint owns it', async () => {
  const bytes = wholeModelBytes(2);
  ticketOf(await upload(bytes, dev));
  const before = storedCount();
  isError(await upload(bytes, other, 'name=mine&pricePer1kTokens=0'), 409, 'conflict', new RegExp(`stored first by ${dev.address}`));
  assert.equal(storedCount(), before);
  assert.equal(state.models.get(sha(bytes))!.owner, dev.address);
});

test("a job's checkpoint is its owner's: another developer can neither store it nor upload its bytes (403); its owner stores it, and it outlives the job's retention", async () => {
  const bytes = wholeModelBytes(3, 20);
  const blob = await blobs.put(bytes);
  state.jobs.insert({ id: JOB, owner: dev.address, spec: { name: 'j', model: 'gpt-micro', data: 'moby-dick', training: { steps: 20 } }, steps: 20, timeoutMs: DAY, idleTimeoutMs: DAY, checkpointEvery: 20, retentionMs: DAY }, 1000);
  assert.ok(state.jobs.addCheckpoint({ jobId: JOB, step: 20, tokens: 100, loss: 2, blob, bytes: bytes.length }, 1100));
  const before = storedCount();
  isError(await send(app, 'POST', '/models', { json: { job: JOB, name: 'stolen', pricePer1kTokens: '0' }, signer: other }), 403, 'forbidden', /its owner's/);
  isError(await upload(bytes, other, 'name=stolen&pricePer1kTokens=0'), 403, 'forbidden', /checkpoint of a job of/);
  assert.equal(storedCount(), before, 'nothing stored for the thief');
  isError(await send(app, 'POST', '/models', { json: { job: 'job-00000000000000ff', name: 'x', pricePer1kTokens: '0' }, signer: dev }), 404, 'not_found', /unknown job/);
  isError(await send(app, 'POST', '/models', { json: { job: JOB, step: 5, name: 'x', pricePer1kTokens: '0' }, signer: dev }), 404, 'not_found', /no checkpoint at step 5 \(it has: 20\)/);
  isError(await send(app, 'POST', '/models', { json: { job: JOB, name: 'x', pricePer1kTokens: '-1' }, signer: dev }), 400, 'invalid', /pricePer1kTokens/);

  const t = ticketOf(await send(app, 'POST', '/models', { json: { job: JOB, name: 'from-job', pricePer1kTokens: '5' }, signer: dev }));
  assert.equal(t.model.sha256, blob);
  assert.equal(t.model.jobId, JOB);
  assert.equal(t.model.step, 20);
  await publishWith(devKey, t);

  // the job ends, its checkpoints expire and are collected: the stored model's blob stays
  state.jobs.move(JOB, 'completed', 'done', 2000);
  const expired = state.jobs.deleteExpiredCheckpoints(2000 + DAY + 1, 100);
  assert.deepEqual(expired, [blob]);
  state.garbage.condemn(expired, 0);
  await coordinator.gc.collect();
  assert.ok(await blobs.has(blob), 'a stored model is never collected');
  assert.equal(state.garbage.count(), 0);
});

test('oversized, garbage, partial and malformed uploads are refused with a 4xx and store nothing', async () => {
  const before = { rows: storedCount(), blobs: await blobCount() };
  // announced past the limit: refused from its headers, before the body is read
  const url = '/models/file?name=big&pricePer1kTokens=0';
  const big = await app.inject({
    method: 'POST',
    url,
    headers: { 'content-type': 'application/octet-stream', 'content-length': String(MAX_MODEL_BYTES + 1), ...(await dev.sign('POST', url, Buffer.alloc(16))) },
    payload: Buffer.alloc(16),
  });
  assert.equal(big.statusCode, 413, big.body);
  isError(await upload(new TextEncoder().encode('not a checkpoint at all'), dev), 400, 'bad_checkpoint', /header/);
  const bytes = wholeModelBytes(4);
  isError(await upload(bytes.subarray(0, bytes.length - 8), dev), 400, 'bad_checkpoint', /truncated|corrupt/);
  isError(await upload(new Uint8Array(0), dev), 400, 'bad_checkpoint');
  isError(await upload(bytes, dev, 'name=bad%20name&pricePer1kTokens=0'), 400, 'invalid', /querystring/);
  isError(await upload(bytes, dev, 'name=ok&pricePer1kTokens=1e5'), 400, 'invalid', /querystring/);
  isError(await upload(bytes, dev, 'name=ok'), 400, 'invalid', /querystring/);
  // unsigned, or signed by a key of another network
  const unsigned = await app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream' }, payload: Buffer.from(bytes) });
  assert.equal(unsigned.statusCode, 401);
  isError(await upload(bytes, new RequestSigner(devKey, { domain: 'nimble:elsewhere' })), 401, 'bad_signature');
  assert.deepEqual({ rows: storedCount(), blobs: await blobCount() }, before);
});

test('one model upload at a time: a second one while the first is being received is refused from its headers (429), then goes through', async () => {
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const first = wholeModelBytes(6);
  const url = '/models/file?name=slow&pricePer1kTokens=0';
  // the first upload sends half of its body and waits
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
  const second = wholeModelBytes(7);
  const url2 = '/models/file?name=slow-too&pricePer1kTokens=0'; // another owner's name: 'slow' is dev's
  const post = async (bytes: Uint8Array): Promise<Answer> => {
    const res = await fetch(`http://127.0.0.1:${port}${url2}`, { method: 'POST', body: Buffer.from(bytes), headers: { 'content-type': 'application/octet-stream', ...(await other.sign('POST', url2, bytes)) } });
    return { status: res.status, body: (await res.json()) as Record<string, unknown>, raw: Buffer.alloc(0), headers: {} };
  };
  isError(await post(second), 429, 'rate_limited', /another model upload is under way/);
  slow.end(first.subarray(first.length >> 1));
  assert.equal(await answered, 200);
  assert.equal(ticketOf(await post(second)).model.sha256, sha(second));
});

test(`one address keeps at most ${MAX_MODELS_PER_OWNER} models: past that an upload is refused from its headers (429)`, async () => {
  const hoarder = new RequestSigner(generatePrivateKey(), { domain: coordinator.identity.domain });
  for (let i = 0; i < MAX_MODELS_PER_OWNER; i++) {
    state.models.claim({ sha256: sha(new TextEncoder().encode(`hoard ${i}`)), owner: hoarder.address, name: 'h', bytes: 1, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: null, step: 0 }, 1);
  }
  isError(await upload(wholeModelBytes(8), hoarder), 429, 'too_many_models', new RegExp(`keeps ${MAX_MODELS_PER_OWNER} models`));
});

test('without a chain (--no-chain) storing is refused with a clear 409 before anything is read; listing works', async () => {
  const before = storedCount();
  isError(await upload(wholeModelBytes(5), dev, undefined, unpaid), 409, 'no_chain', /without a chain \(--no-chain\)/);
  isError(await send(unpaid, 'POST', '/models', { json: { job: JOB, name: 'x', pricePer1kTokens: '0' }, signer: dev }), 409, 'no_chain');
  assert.equal(storedCount(), before);
  assert.equal((await send(unpaid, 'GET', '/models')).status, 200);
});
