// Bad input from the network gets a clear 4xx, is counted against the sender,
// and takes no process down: signatures and replays at the orchestrator,
// malformed frames and misrouted work at a miner's peer API.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Miner } from '../../src/miner/miner.ts';
import { startOrchestrator, type RunningOrchestrator } from '../../src/orchestrator/server.ts';
import { OrchestratorClient } from '../../src/api/client.ts';
import type { RunView } from '../../src/api/schemas.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { RequestSigner } from '../../src/protocol/signing.ts';

let dir: string;
let orch: RunningOrchestrator;
const miners: Miner[] = [];
let signerA: RequestSigner;
let addressA: string;
let stage1: Miner;
let runId: string;
const B = 2, T = 16, C = 16; // gpt-micro, batch 2

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-bad-'));
  orch = await startOrchestrator({ dataDir: join(dir, 'orch'), coordinator: { minerTimeoutMs: 3000 } });
  for (const name of ['a', 'b']) miners.push(await Miner.start({ orchestrator: orch.url, dataDir: join(dir, name), name, threads: 1 }));
  const key = JSON.parse(readFileSync(join(dir, 'a', 'miner-key.json'), 'utf8')).privateKey;
  signerA = new RequestSigner(key);
  addressA = signerA.address;
  const res = await fetch(`${orch.url}/runs`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-micro', data: 'moby-dick', steps: 1_000_000, stages: 2, batchSize: B, mergeEvery: 100_000, minMiners: 2 }),
  });
  runId = ((await res.json()) as RunView).id;
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
  const stale = new RequestSigner(generatePrivateKey(), { now: () => Date.now() - 5 * 60_000 });
  const r = await signedPost(stale, `${orch.url}/miners/heartbeat`, hb);
  assert.equal(r.status, 401);
  assert.match(r.error, /old/);
  // the same signed request twice
  const u = new URL(`${orch.url}/miners/heartbeat`);
  const headers = { ...(await signerA.sign('POST', u.pathname, hb)), 'content-type': 'application/json' };
  assert.equal((await fetch(u, { method: 'POST', headers, body: hb as BodyInit })).status, 200);
  const replay = await fetch(u, { method: 'POST', headers, body: hb as BodyInit });
  assert.equal(replay.status, 401);
  assert.match(((await replay.json()) as { error: string }).error, /already used/);
});

test('the orchestrator answers malformed and unknown requests with 4xx and counts them against the miner', async () => {
  const before = await invalidCount(addressA);
  const notJson = await signedPost(signerA, `${orch.url}/miners/heartbeat`, new TextEncoder().encode('{nope'), undefined, JSON_TYPE);
  assert.equal(notJson.status, 400);
  assert.match(notJson.error, /not JSON/);
  const badSchema = await signedPost(signerA, `${orch.url}/miners/heartbeat`, json({ freeSlots: -1, queue: 0, reports: [] }), undefined, JSON_TYPE);
  assert.equal(badSchema.status, 400);
  assert.match(badSchema.error, /freeSlots/);
  const badJoin = await signedPost(signerA, `${orch.url}/miners/join`, json({ name: 'x', url: 'not a url', hardware: { gflops: 1, threads: 1, memoryBytes: 1 }, bandwidthMbps: 1 }), undefined, JSON_TYPE);
  assert.equal(badJoin.status, 400);
  const unknownRun = await signedPost(signerA, `${orch.url}/runs/run-nope/stages/0/rounds/1/pseudo-gradients/0?samples=1`, encodeFrame(new Float32Array(4), [4], 'int8-block'));
  assert.equal(unknownRun.status, 404);
  const closedRound = await signedPost(signerA, `${orch.url}/runs/${runId}/stages/0/rounds/99/merged/0`, encodeFrame(new Float32Array(4), [4], 'int8-block'));
  assert.equal(closedRound.status, 409);
  assert.ok((await invalidCount(addressA)) >= before + 4);
  assert.equal((await fetch(`${orch.url}/runs/run-nope`)).status, 404);
  const badRun = await fetch(`${orch.url}/runs`, { method: 'POST', body: JSON.stringify({ model: 'gpt-huge', data: 'moby-dick', steps: 1 }), headers: { 'content-type': 'application/json' } });
  assert.equal(badRun.status, 400);
  assert.equal((await fetch(`${orch.url}/health`)).status, 200);
});

test('a miner refuses malformed frames and misrouted work with 4xx, reports the sender, and keeps training', async () => {
  const url = `${stage1.url}/forward`;
  const meta = { runId, microbatch: 999_999, shard: 0, step: 0, stage: 1, route: [{ id: addressA, url: miners[0].url }] };
  const good = encodeFrame(new Float32Array(B * T * C).fill(0.5), [B * T, C], 'f16', meta);
  const f32Frame = encodeFrame(new Float32Array(B * T * C), [B * T, C], 'f32', meta);
  const payloadAt = 12 + new DataView(f32Frame.buffer).getUint32(8, true);
  /** an f32 frame with one value replaced after encoding (the encoder refuses non-finite values) */
  const withValue = (v: number): Uint8Array => {
    const f = f32Frame.slice();
    new DataView(f.buffer).setFloat32(payloadAt + 8, v, true);
    return refreshSha(f);
  };
  const cases: [string, Uint8Array, number, RegExp][] = [
    ['truncated', good.subarray(0, good.length - 7), 400, /length|truncated/],
    ['wrong shape', encodeFrame(new Float32Array(8 * C), [8, C], 'f16', meta), 400, /shape/],
    ['NaN', withValue(NaN), 400, /finite|NaN/i],
    ['Inf', withValue(Infinity), 400, /finite|Inf/i],
    ['wrong sha256', (() => { const f = good.slice(); f[f.length - 1] ^= 0xff; return f; })(), 400, /sha256|checksum/i],
    ['garbage', new TextEncoder().encode('NIMF garbage'), 400, /./],
    ['wrong dtype', (() => { const f = good.slice(); const at = Buffer.from(f).indexOf('"f32"'); f.set(new TextEncoder().encode('"f64"'), at); return f; })(), 400, /dtype/],
    ['stage not held', encodeFrame(new Float32Array(B * T * C), [B * T, C], 'f16', { ...meta, stage: 0, route: [] }), 409, /holds stage 1/],
    ['unknown run', encodeFrame(new Float32Array(B * T * C), [B * T, C], 'f16', { ...meta, runId: 'run-other' }), 409, /run-other/],
  ];
  const rejectedBefore = stage1.stats.rejected;
  for (const [label, body, status, pattern] of cases) {
    const r = await signedPost(signerA, url, body);
    assert.equal(r.status, status, `${label}: ${r.error}`);
    assert.match(r.error, pattern, label);
  }
  // a gradient for a microbatch the miner does not hold
  const back = await signedPost(signerA, `${stage1.url}/backward`, encodeFrame(new Float32Array(B * T * C), [B * T, C], 'f16', { runId, microbatch: 424242, stage: 1 }));
  assert.equal(back.status, 409);
  // oversized
  const huge = await signedPost(signerA, url, new Uint8Array((64 << 20) + 1));
  assert.equal(huge.status, 413);
  // unsigned
  const unsigned = await fetch(url, { method: 'POST', body: good as BodyInit, headers: { 'content-type': 'application/octet-stream' } });
  assert.equal(unsigned.status, 401);
  assert.ok(stage1.stats.rejected >= rejectedBefore + cases.length + 2);
  // the refusals reach the orchestrator's work log against the sender, and training goes on
  const before = (await (await fetch(`${orch.url}/runs/${runId}`)).json()) as RunView;
  const end = Date.now() + 20_000;
  for (;;) {
    const v = (await (await fetch(`${orch.url}/runs/${runId}`)).json()) as RunView;
    const invalid = await invalidCount(addressA);
    if (v.microbatchesDone > before.microbatchesDone + 3 && invalid >= cases.length) break;
    if (Date.now() > end) throw new Error(`no progress or no invalid count: ${invalid}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal((await fetch(`${stage1.url}/health`)).status, 200);
});

/** Recomputes the sha256 of a frame whose payload was edited by hand. */
function refreshSha(frame: Uint8Array): Uint8Array {
  const headerLen = new DataView(frame.buffer, frame.byteOffset).getUint32(8, true);
  const header = new TextDecoder().decode(frame.subarray(12, 12 + headerLen));
  const sha = createHash('sha256').update(frame.subarray(12 + headerLen)).digest('hex');
  const fixed = header.replace(/"sha256":"[0-9a-f]{64}"/, `"sha256":"${sha}"`);
  const out = frame.slice();
  out.set(new TextEncoder().encode(fixed), 12);
  return out;
}
