// The orchestrator's HTTP contract, in-process (fastify inject, no sockets,
// no child processes): each route's params, body and answers against the
// schemas in src/api/schemas.ts and src/protocol/messages.ts, the error
// answers, body limits, signatures, and refusals counted against the signer.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Type, type TSchema } from '@sinclair/typebox';
import { generatePrivateKey } from 'viem/accounts';
import { EpochList, MinerView, RunView, WorkTotal } from '../../src/api/schemas.ts';
import type { HttpServer } from '../../src/http/server.ts';
import { FsBlobStore } from '../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../src/orchestrator/training/coordinator.ts';
import { buildApi } from '../../src/orchestrator/http.ts';
import { MAX_STATE_BYTES, MAX_UPLOAD_BYTES } from '../../src/orchestrator/routes/miners.ts';
import { OrchestratorState } from '../../src/orchestrator/state/index.ts';
import { HeartbeatReply, JoinReply, NetworkInfo, parse, type Hardware } from '../../src/protocol/messages.ts';
import { domainOf, verifyNetwork } from '../../src/protocol/network.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';

let dir: string;
let state: OrchestratorState;
let app: HttpServer;
const key = generatePrivateKey();
const session = SessionKey.generate();
/** the miner's wallet signer (joining) and session signer (everything after), for this network */
let wallet: RequestSigner;
let miner: RequestSigner;
let domain: string;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-http-'));
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  const coordinator = new Coordinator(state, await FsBlobStore.open(join(dir, 'blobs')), { spotChecks: { rate: 0 } });
  app = buildApi(coordinator);
  domain = coordinator.identity.domain;
  wallet = new RequestSigner(key, { domain });
  miner = new RequestSigner({ session, address: wallet.address }, { domain });
});
after(async () => {
  await app.close();
  state.close();
  rmSync(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  body: Record<string, unknown> & unknown[];
}

async function request(method: 'GET' | 'POST', url: string, opts: { json?: unknown; raw?: Uint8Array | string; contentType?: string; signer?: RequestSigner } = {}): Promise<Answer> {
  const payload = opts.json !== undefined ? JSON.stringify(opts.json) : opts.raw;
  const bytes = typeof payload === 'string' ? new TextEncoder().encode(payload) : payload;
  const headers: Record<string, string> = {};
  if (bytes !== undefined) headers['content-type'] = opts.contentType ?? (opts.json !== undefined ? 'application/json' : 'application/octet-stream');
  if (opts.signer) Object.assign(headers, await opts.signer.sign(method, url, bytes));
  const res = await app.inject({ method, url, headers, payload: bytes === undefined ? undefined : Buffer.from(bytes) });
  return { status: res.statusCode, body: res.body ? (JSON.parse(res.body) as Answer['body']) : ({} as Answer['body']) };
}

/** The answer, checked against the schema its route declares. */
function valid<T extends TSchema>(schema: T, a: Answer, status = 200): unknown {
  assert.equal(a.status, status, JSON.stringify(a.body));
  return parse(schema, a.body, 'answer');
}

const isError = (a: Answer, status: number, code: string, message?: RegExp): void => {
  assert.equal(a.status, status, JSON.stringify(a.body));
  assert.deepEqual(Object.keys(a.body).sort(), ['code', 'error']);
  assert.equal(a.body.code, code);
  if (message) assert.match(String(a.body.error), message);
};

const joinBody = { name: 'm1', url: 'http://127.0.0.1:9999', hardware: { gflops: 10, threads: 2, memoryBytes: 1 << 30 }, bandwidthMbps: 100, sessionKey: session.publicKey };

test('public reads answer their declared views', async () => {
  valid(Type.Object({ ok: Type.Literal(true) }), await request('GET', '/health'));
  valid(Type.Array(RunView), await request('GET', '/runs'));
  valid(Type.Array(MinerView), await request('GET', '/miners'));
  valid(Type.Array(WorkTotal), await request('GET', '/work'));
  const epochs = valid(EpochList, await request('GET', '/epochs')) as { paid: boolean };
  assert.equal(epochs.paid, false);
  isError(await request('GET', '/runs/run-nope'), 404, 'not_found', /unknown run run-nope/);
  isError(await request('GET', '/runs/run-nope/checkpoint'), 401, 'missing', /missing header/);
  isError(await request('GET', '/epochs/abc'), 400, 'invalid', /params/);
  isError(await request('GET', '/epochs/999'), 404, 'not_found');
  isError(await request('GET', '/nowhere'), 404, 'not_found');
  // under /v1 the OpenAI-compatible subset answers in OpenAI's error shape, unknown paths included
  const v1 = await request('POST', '/v1/embeddings', { json: { model: 'm', input: 'x' } });
  assert.equal(v1.status, 404);
  assert.deepEqual(Object.keys(v1.body.error as object).sort(), ['code', 'message', 'param', 'type']);
  assert.equal((v1.body.error as unknown as { code: string }).code, 'unknown_url');
});

test('POST /runs: signed by a developer, validated against CreateRunRequest, 201 with the run view; cancel and the checkpoint are the owner\'s', async () => {
  const dev = new RequestSigner(generatePrivateKey(), { domain });
  const other = new RequestSigner(generatePrivateKey(), { domain });
  const body = { model: 'gpt-micro', data: 'moby-dick', steps: 10, stages: 2, minMiners: 2 };
  isError(await request('POST', '/runs', { json: body }), 401, 'missing', /missing header/);
  const run = valid(RunView, await request('POST', '/runs', { json: body, signer: dev }), 201) as RunView;
  assert.equal(run.status, 'waiting');
  assert.equal(run.owner, dev.address);
  assert.match(run.message ?? '', /waiting for miners: 0 of 2/);
  assert.deepEqual((valid(RunView, await request('GET', `/runs/${run.id}`)) as RunView).id, run.id);
  const post = (json: unknown): Promise<Answer> => request('POST', '/runs', { json, signer: dev });
  isError(await post({ model: 'gpt-micro', data: 'moby-dick' }), 400, 'invalid', /steps/);
  isError(await post({ model: 'gpt-micro', data: 'moby-dick', steps: 1, batch_size: 4 }), 400, 'invalid', /batch_size/);
  isError(await post({ model: 'gpt-micro', data: 'moby-dick', steps: 1e300 }), 400, 'invalid', /steps/);
  isError(await post({ model: 'gpt-huge', data: 'moby-dick', steps: 1 }), 400, 'invalid', /gpt-huge/);
  isError(await post({ model: 'gpt-micro', data: '/etc/passwd', steps: 1 }), 400, 'invalid', /not available to miners/);
  isError(await post({ model: 'gpt-micro', data: 'moby-dick', steps: 1, stages: 99 }), 400, 'invalid', /cannot be cut into 99/);
  isError(await request('POST', '/runs', { raw: '{nope', contentType: 'application/json', signer: dev }), 400, 'invalid', /not JSON/);
  isError(await request('POST', '/runs', { raw: 'x'.repeat((1 << 20) + 10), contentType: 'application/json', signer: dev }), 413, 'too_large');
  // a developer has at most 4 runs that have not ended
  for (let i = 0; i < 3; i++) valid(RunView, await post(body), 201);
  isError(await post(body), 429, 'too_many_runs', /4 runs that have not ended/);
  // only the owner cancels, or downloads the checkpoint
  isError(await request('POST', `/runs/${run.id}/cancel`, { signer: other }), 403, 'forbidden', /is not/);
  isError(await request('GET', `/runs/${run.id}/checkpoint`, { signer: other }), 403, 'forbidden', /its owner's/);
  isError(await request('GET', `/runs/${run.id}/checkpoint`), 401, 'missing');
  const cancelled = valid(RunView, await request('POST', `/runs/${run.id}/cancel`, { signer: dev })) as RunView;
  assert.equal(cancelled.status, 'cancelled');
  isError(await request('POST', `/runs/${run.id}/cancel`, { signer: dev }), 409, 'conflict', /has ended/);
  valid(RunView, await post(body), 201);
});

test('GET /network proves the key that names the signing domain, with a signature of the caller\'s challenge', async () => {
  const challenge = 'ab'.repeat(16);
  const info = valid(NetworkInfo, await request('GET', `/network?challenge=${challenge}`)) as NetworkInfo;
  assert.equal(verifyNetwork(info, challenge), domain, 'the domain every request here is signed for');
  assert.equal(domainOf(info.publicKey), domain);
  assert.equal(verifyNetwork(info, 'cd'.repeat(16)), null, 'the signature is of this challenge only');
  isError(await request('GET', '/network'), 400, 'invalid', /querystring/);
});

test('miner routes are signed: unsigned or forged requests get 401 and count for nobody', async () => {
  isError(await request('POST', '/miners/join', { json: joinBody }), 401, 'missing');
  const other = new RequestSigner(generatePrivateKey(), { domain: 'nimble:elsewhere' });
  const headers = await other.sign('POST', '/miners/join', new TextEncoder().encode('{}'));
  const forged = await app.inject({ method: 'POST', url: '/miners/join', headers: { ...headers, 'content-type': 'application/json' }, payload: JSON.stringify(joinBody) });
  assert.equal(forged.statusCode, 401);
  isError(await request('GET', `/blobs/${'a'.repeat(64)}`), 401, 'missing');
  assert.equal(state.ledger.workTotals().length, 0);
});

test('join and heartbeat answer their protocol messages', async () => {
  // joining is signed with the wallet key, not a session key (refused before the signature is checked); after it the session key signs
  isError(await request('POST', '/miners/join', { json: joinBody, signer: miner }), 401, 'bad_signature', /wallet key/);
  isError(await request('POST', '/miners/heartbeat', { json: { freeSlots: 0, queue: 0, reports: [] }, signer: wallet }), 401, 'bad_signature', /session key/);
  const joined = valid(JoinReply, await request('POST', '/miners/join', { json: joinBody, signer: wallet })) as { minerId: string };
  assert.equal(joined.minerId, miner.address);
  const impostor = new RequestSigner({ session: SessionKey.generate(), address: wallet.address }, { domain: '' });
  isError(await request('POST', '/miners/heartbeat', { json: { freeSlots: 0, queue: 0, reports: [] }, signer: impostor }), 401, 'bad_signature');
  const reply = valid(HeartbeatReply, await request('POST', '/miners/heartbeat', { json: { freeSlots: 0, queue: 0, reports: [] }, signer: miner })) as HeartbeatReply;
  assert.equal(reply.assignment, null);
  assert.deepEqual((valid(Type.Array(MinerView), await request('GET', '/miners')) as MinerView[]).map((m) => [m.id, m.name, m.alive]), [[miner.address, 'm1', true]]);
  const probe = await request('POST', '/bandwidth', { raw: new Uint8Array(1 << 20), signer: wallet });
  assert.deepEqual(probe.body, { bytes: 1 << 20 });
});

test("GET /miners shows where each miner's GPT stages run, its GPU adapter and whether that is a software one, as of its last join; a miner that did not say is wasm", async () => {
  const gpu = new RequestSigner(generatePrivateKey(), { domain });
  const cpu = new RequestSigner(generatePrivateKey(), { domain });
  const joinAs = (signer: RequestSigner, hardware: Partial<Hardware>): Promise<Answer> =>
    request('POST', '/miners/join', { json: { ...joinBody, name: signer === gpu ? 'gpu' : 'cpu', sessionKey: SessionKey.generate().publicKey, hardware: { ...joinBody.hardware, ...hardware } }, signer });
  const shown = async (signer: RequestSigner): Promise<unknown> => {
    const m = (valid(Type.Array(MinerView), await request('GET', '/miners')) as MinerView[]).find((v) => v.id === signer.address)!;
    return { backend: m.backend, adapter: m.adapter, softwareAdapter: m.softwareAdapter };
  };
  valid(JoinReply, await joinAs(gpu, { backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true }));
  valid(JoinReply, await joinAs(cpu, {}));
  assert.deepEqual(await shown(gpu), { backend: 'webgpu', adapter: 'SwiftShader driver', softwareAdapter: true });
  assert.deepEqual(await shown(cpu), { backend: 'wasm', adapter: null, softwareAdapter: false });
  assert.equal(state.miners.get(gpu.address)!.adapter, 'SwiftShader driver', 'stored as it said');
  // a rejoin replaces them
  valid(JoinReply, await joinAs(gpu, { backend: 'webgpu', adapter: 'Apple M2 (Metal)', softwareAdapter: false }));
  assert.deepEqual(await shown(gpu), { backend: 'webgpu', adapter: 'Apple M2 (Metal)', softwareAdapter: false });
  valid(JoinReply, await joinAs(cpu, { backend: 'wasm' }));
  assert.deepEqual(await shown(cpu), { backend: 'wasm', adapter: null, softwareAdapter: false });
});

test('a signed request that breaks a contract is refused with 4xx; the malformed ones count as invalid work of their signer', async () => {
  const invalid = (): number => state.ledger.workTotals().filter((w) => w.minerId === miner.address && w.kind === 'invalid').reduce((a, w) => a + w.units, 0);
  const before = invalid();
  isError(await request('POST', '/miners/heartbeat', { raw: '{nope', contentType: 'application/json', signer: miner }), 400, 'invalid', /not JSON/);
  isError(await request('POST', '/miners/heartbeat', { json: { freeSlots: -1, queue: 0, reports: [] }, signer: miner }), 400, 'invalid', /freeSlots/);
  isError(await request('POST', '/miners/heartbeat', { json: { freeSlots: 2 ** 40, queue: 0, reports: [] }, signer: miner }), 400, 'invalid', /freeSlots/);
  isError(await request('POST', '/runs/run-x/stages/zero/rounds/1/merged/0', { raw: new Uint8Array(8), signer: miner }), 400, 'invalid', /params/);
  isError(await request('POST', '/runs/run-x/stages/0/rounds/1/pseudo-gradients/0?samples=-3', { raw: new Uint8Array(8), signer: miner }), 400, 'invalid', /querystring/);
  isError(await request('POST', '/runs/run-x/stages/0/rounds/1/pseudo-gradients/0?samples=1', { raw: new Uint8Array(8), signer: miner }), 404, 'not_found', /unknown run run-x/);
  // a blob its work does not name: refused the same whether it exists or not (src/orchestrator/blobs/access.ts)
  isError(await request('GET', `/blobs/${'a'.repeat(64)}`, { signer: miner }), 403, 'forbidden');
  isError(await request('GET', '/blobs/../../etc/passwd', { signer: miner }), 404, 'not_found');
  assert.equal(invalid(), before + 5, 'each malformed request costs its signer one invalid unit; a 403 or 404 (which an honest race can meet) costs nothing');
});

test('uploads are limited per route before they are buffered', async () => {
  const upload = (url: string, bytes: number, headers: Record<string, string>): Promise<{ statusCode: number }> =>
    app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream', 'content-length': String(bytes), ...headers }, payload: Buffer.alloc(16) });
  const state = '/runs/run-x/stages/0/rounds/1/state';
  const frame = '/runs/run-x/stages/0/rounds/1/pseudo-gradients/0?samples=1';
  // unsigned: refused from its headers (401), before its size matters
  assert.equal((await upload(state, MAX_STATE_BYTES + 1, {})).statusCode, 401);
  // signed: refused for its declared size (413) before it is read: a frame over 256 MiB, a stage state over 2 GiB (and over its own stage's size: coordinator.test.ts)
  assert.equal((await upload(frame, MAX_UPLOAD_BYTES + 1, await miner.sign('POST', frame, Buffer.alloc(16)))).statusCode, 413);
  assert.equal((await upload(state, MAX_STATE_BYTES + 1, await miner.sign('POST', state, Buffer.alloc(16)))).statusCode, 413);
  isError(await request('POST', '/miners/heartbeat', { raw: 'x'.repeat((1 << 20) + 1), contentType: 'application/json', signer: miner }), 413, 'too_large');
});

test('finite but absurd numbers get a 400 naming the field: 2^53 − 1 bytes of memory, 1e30 GFLOP/s, a queue of 1e30, epoch 2^53 − 1; a GPU adapter name of 201 characters or with a newline', async () => {
  const fresh = new RequestSigner(generatePrivateKey(), { domain });
  const joinWith = (hardware: Partial<Hardware>, extra: Record<string, unknown> = {}): Promise<Answer> =>
    request('POST', '/miners/join', { json: { ...joinBody, sessionKey: SessionKey.generate().publicKey, hardware: { ...joinBody.hardware, ...hardware }, ...extra }, signer: fresh });
  isError(await joinWith({ memoryBytes: 2 ** 53 - 1 }), 400, 'invalid', /\/hardware\/memoryBytes/);
  isError(await joinWith({ memoryBytes: 2 ** 53 }), 400, 'invalid', /\/hardware\/memoryBytes/);
  isError(await joinWith({ gflops: 1e30 }), 400, 'invalid', /\/hardware\/gflops/);
  isError(await joinWith({ threads: 2 ** 53 }), 400, 'invalid', /\/hardware\/threads/);
  isError(await joinWith({}, { bandwidthMbps: 1e30 }), 400, 'invalid', /\/bandwidthMbps/);
  // the GPU adapter's name: printable text of at most 200 characters; the backend one of the two
  isError(await joinWith({ backend: 'webgpu', adapter: 'x'.repeat(201) }), 400, 'invalid', /\/hardware\/adapter/);
  isError(await joinWith({ backend: 'webgpu', adapter: 'SwiftShader\ndriver' }), 400, 'invalid', /\/hardware\/adapter/);
  isError(await joinWith({ backend: 'cuda' as 'wasm' }), 400, 'invalid', /\/hardware\/backend/);
  assert.equal(state.miners.get(fresh.address), undefined, 'nothing of a refused join is stored');
  valid(JoinReply, await joinWith({ memoryBytes: 2 ** 50, gflops: 1e7, threads: 1024 }, { bandwidthMbps: 1e6 }));
  const beat = (json: unknown): Promise<Answer> => request('POST', '/miners/heartbeat', { json, signer: miner });
  isError(await beat({ freeSlots: 0, queue: 1e30, reports: [] }), 400, 'invalid', /\/queue/);
  isError(await beat({ freeSlots: 2 ** 53, queue: 0, reports: [] }), 400, 'invalid', /\/freeSlots/);
  isError(await request('GET', `/epochs/${2 ** 53 - 1}`), 400, 'invalid', /params/);
  isError(await request('GET', `/runs/${'a'.repeat(10)}%0A`), 400, 'invalid', /params/);
  isError(await request('POST', '/runs/run-x/stages/1e30/rounds/1/state', { raw: new Uint8Array(8), signer: miner }), 400, 'invalid', /params/);
  const dev = new RequestSigner(generatePrivateKey(), { domain });
  isError(await request('POST', '/runs', { json: { model: 'gpt-micro', data: 'moby-dick', steps: 2 ** 53 }, signer: dev }), 400, 'invalid', /\/steps/);
  isError(await request('POST', '/runs', { json: { model: 'gpt-micro', data: 'moby-dick', steps: 10, lr: 1e-30 }, signer: dev }), 400, 'invalid', /\/lr/);
});

test('an upload its signer has no part in is refused from its headers, before its body is read', async () => {
  // announced at 100 MiB, 16 bytes sent: an answer that reads the body would be about the missing bytes
  const upload = async (url: string): Promise<Answer> => {
    const res = await app.inject({ method: 'POST', url, headers: { 'content-type': 'application/octet-stream', 'content-length': String(100 << 20), ...(await miner.sign('POST', url, Buffer.alloc(16))) }, payload: Buffer.alloc(16) });
    return { status: res.statusCode, body: JSON.parse(res.body) as Answer['body'] };
  };
  isError(await upload('/runs/run-x/stages/0/rounds/1/state'), 404, 'not_found', /unknown run run-x/);
  isError(await upload('/runs/run-x/stages/0/rounds/1/pseudo-gradients/0?samples=1'), 404, 'not_found', /unknown run run-x/);
  isError(await upload('/runs/run-x/stages/0/rounds/1/merged/0'), 404, 'not_found', /unknown run run-x/);
  isError(await upload('/runs/run-x/checks/5'), 409, 'conflict', /no open spot check of microbatch 5/);
  // malformed params or query are still refused as such (and count as the signer's invalid work)
  isError(await upload('/runs/run-x/stages/x/rounds/1/state'), 400, 'invalid', /params/);
  isError(await upload('/runs/run-x/stages/0/rounds/1/pseudo-gradients/0?samples=-1'), 400, 'invalid', /querystring/);
});
