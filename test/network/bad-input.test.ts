// Bad input from the network gets a clear 4xx, is counted against the sender,
// and takes no process down: signatures and replays at the orchestrator,
// malformed frames and misrouted work at a miner's peer API.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Miner } from '../../src/miner/miner.ts';
import { startOrchestrator, type RunningOrchestrator } from '../../src/orchestrator/server.ts';
import { OrchestratorClient } from '../../src/api/client.ts';
import type { RunView } from '../../src/api/schemas.ts';
import { findNetwork } from '../../src/api/network.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';

let dir: string;
let orch: RunningOrchestrator;
const miners: Miner[] = [];
/** an attacker that joined with its own keys: its wallet signer, and the session signer it bound */
let walletA: RequestSigner;
let signerA: RequestSigner;
let addressA: string;
let domain: string;
let stage1: Miner;
let runId: string;
const B = 2, T = 16, C = 16; // gpt-micro, batch 2

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-bad-'));
  orch = await startOrchestrator({ dataDir: join(dir, 'orch'), coordinator: { minerTimeoutMs: 3000 } });
  for (const name of ['a', 'b']) miners.push(await Miner.start({ orchestrator: orch.url, dataDir: join(dir, name), name, threads: 1 }));
  domain = (await findNetwork(orch.url)).domain;
  walletA = new RequestSigner(generatePrivateKey(), { domain });
  const session = SessionKey.generate();
  signerA = new RequestSigner({ session, address: walletA.address }, { domain });
  addressA = signerA.address;
  const joinA = { name: 'attacker', url: 'http://127.0.0.1:9', hardware: { gflops: 0.001, threads: 1, memoryBytes: 1 }, bandwidthMbps: 1, sessionKey: session.publicKey };
  assert.equal((await signedPost(walletA, `${orch.url}/miners/join`, json(joinA), undefined, 'application/json')).status, 200);
  const developer = new OrchestratorClient(orch.url, { wallet: generatePrivateKey() });
  runId = (await developer.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 1_000_000, stages: 2, batchSize: B, mergeEvery: 100_000, minMiners: 2 })).id;
  for (;;) {
    const v = (await (await fetch(`${orch.url}/runs/${runId}`)).json()) as RunView;
    if (v.microbatchesDone >= 3) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  stage1 = miners.find((m) => m.stageInfo?.stage === 1)!;
  assert.ok(stage1, 'a miner holds stage 1');
});

after(async () => {
  for (const m of miners) await m.stop();
  await orch.close();
  rmSync(dir, { recursive: true, force: true });
});

async function signedPost(signer: RequestSigner, url: string, body: Uint8Array, tweak?: (h: Record<string, string>) => void, contentType = 'application/octet-stream'): Promise<{ status: number; error: string }> {
  const u = new URL(url);
  const headers: Record<string, string> = { ...(await signer.sign('POST', u.pathname + u.search, body)), 'content-type': contentType };
  tweak?.(headers);
  const res = await fetch(u, { method: 'POST', headers, body: body as BodyInit });
  const json = (await res.json().catch(() => ({}))) as { error?: string };
  return { status: res.status, error: json.error ?? '' };
}

const json = (v: unknown): Uint8Array => new TextEncoder().encode(JSON.stringify(v));
const JSON_TYPE = 'application/json';

async function invalidCount(address: string): Promise<number> {
  const work = await new OrchestratorClient(orch.url).work();
  return work.filter((w) => w.miner === address && w.kind === 'invalid').reduce((a, w) => a + w.units, 0);
}

test('the orchestrator refuses unsigned, forged, stale and replayed requests with 401', async () => {
  const hb = json({ freeSlots: 0, queue: 0, reports: [] });
  const unsigned = await fetch(`${orch.url}/miners/heartbeat`, { method: 'POST', body: hb as BodyInit, headers: { 'content-type': 'application/json' } });
  assert.equal(unsigned.status, 401);
  assert.match(((await unsigned.json()) as { error: string }).error, /missing header/);
  // signed over a different body
  const forged = await signedPost(signerA, `${orch.url}/miners/heartbeat`, hb, (h) => (h['x-nimble-signature'] = h['x-nimble-signature'].replace(/.$/, (c) => (c === '0' ? '1' : '0'))));
  assert.equal(forged.status, 401);
  const stale = new RequestSigner(generatePrivateKey(), { domain, now: () => Date.now() - 5 * 60_000 });
  const r = await signedPost(stale, `${orch.url}/miners/heartbeat`, hb);
  assert.equal(r.status, 401);
  assert.match(r.error, /old/);
  // the same signed request twice
  const u = new URL(`${orch.url}/miners/heartbeat`);
  const headers = { ...(await signerA.sign('POST', u.pathname, hb)), 'content-type': 'application/json' };
  // another network's signature (a request captured elsewhere) is refused
  const foreign = new RequestSigner({ session: SessionKey.generate(), address: walletA.address }, { domain: 'nimble:elsewhere' });
  assert.equal((await signedPost(foreign, `${orch.url}/miners/heartbeat`, hb, undefined, 'application/json')).status, 401);
  assert.equal((await fetch(u, { method: 'POST', headers, body: hb as BodyInit })).status, 200);
  const replay = await fetch(u, { method: 'POST', headers, body: hb as BodyInit });
  assert.equal(replay.status, 401);
  assert.match(((await replay.json()) as { error: string }).error, /already used/);
});

test('the orchestrator answers malformed and unknown requests with 4xx and counts the malformed ones against the miner', async () => {
  const before = await invalidCount(addressA);
  const notJson = await signedPost(signerA, `${orch.url}/miners/heartbeat`, new TextEncoder().encode('{nope'), undefined, JSON_TYPE);
  assert.equal(notJson.status, 400);
  assert.match(notJson.error, /not JSON/);
  const badSchema = await signedPost(signerA, `${orch.url}/miners/heartbeat`, json({ freeSlots: -1, queue: 0, reports: [] }), undefined, JSON_TYPE);
  assert.equal(badSchema.status, 400);
  assert.match(badSchema.error, /freeSlots/);
  const badJoin = await signedPost(walletA, `${orch.url}/miners/join`, json({ name: 'x', url: 'not a url', hardware: { gflops: 1, threads: 1, memoryBytes: 1 }, bandwidthMbps: 1 }), undefined, JSON_TYPE);
  assert.equal(badJoin.status, 400);
  const unknownRun = await signedPost(signerA, `${orch.url}/runs/run-nope/stages/0/rounds/1/pseudo-gradients/0?samples=1`, encodeFrame(new Float32Array(4), [4], 'int8-block'));
  assert.equal(unknownRun.status, 404);
  const closedRound = await signedPost(signerA, `${orch.url}/runs/${runId}/stages/0/rounds/99/merged/0`, encodeFrame(new Float32Array(4), [4], 'int8-block'));
  assert.equal(closedRound.status, 409);
  // the three malformed requests count against their signer; a 404 or 409 can be an honest race and does not
  assert.equal(await invalidCount(addressA), before + 3);
  assert.equal((await fetch(`${orch.url}/runs/run-nope`)).status, 404);
  const badRun = await fetch(`${orch.url}/runs`, { method: 'POST', body: JSON.stringify({ model: 'gpt-huge', data: 'moby-dick', steps: 1 }), headers: { 'content-type': 'application/json' } });
  assert.equal(badRun.status, 401, 'creating a run is signed');
  assert.equal((await fetch(`${orch.url}/health`)).status, 200);
});

test('a miner takes frames only from the neighbours the orchestrator named: a joined stranger and an unsigned sender get 401, and training goes on', async () => {
  const url = `${stage1.url}/forward`;
  const meta = { runId, microbatch: 999_999, attempt: 1, shard: 0, step: 0, stage: 1, ticket: 'A'.repeat(86) };
  const good = encodeFrame(new Float32Array(B * T * C).fill(0.5), [B * T, C], 'f16', meta);
  const rejectedBefore = stage1.stats.rejected;
  const stranger = await signedPost(signerA, url, good);
  assert.equal(stranger.status, 401, stranger.error);
  assert.match(stranger.error, /no session key here/);
  const unsigned = await fetch(url, { method: 'POST', body: good as BodyInit, headers: { 'content-type': 'application/octet-stream' } });
  assert.equal(unsigned.status, 401);
  // a wallet signature is no key a peer accepts either
  assert.equal((await signedPost(walletA, url, good)).status, 401);
  assert.equal(stage1.stats.rejected, rejectedBefore + 3);
  const before = (await (await fetch(`${orch.url}/runs/${runId}`)).json()) as RunView;
  const end = Date.now() + 20_000;
  for (;;) {
    const v = (await (await fetch(`${orch.url}/runs/${runId}`)).json()) as RunView;
    if (v.microbatchesDone > before.microbatchesDone + 3) break;
    if (Date.now() > end) throw new Error('no progress');
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal((await fetch(`${stage1.url}/health`)).status, 200);
});
