// Serving channels (src/protocol/stage-channel.ts, src/miner/serve-channel.ts,
// src/orchestrator/serving/stage-channels.ts): the calls on a channel answer
// what the HTTP routes answer, bit for bit, errors included, and the channel
// survives a refused call; and the attacks fail: an upgrade not signed by the
// orchestrator, one replayed, one to another path; a frame with a forged MAC,
// one replayed or out of sequence, one announced too long: each closes the
// channel with nothing more run.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { Socket } from 'node:net';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Engine } from '../../src/engine/engine.ts';
import { SignedClient } from '../../src/http/client.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import type { StageInference } from '../../src/inference/stage-inference.ts';
import { MAX_INFER_FRAME_BYTES } from '../../src/miner/serve-api.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { StageChannels } from '../../src/orchestrator/serving/stage-channels.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { encodeFrame } from '../../src/protocol/frame.ts';
import { domainOf, orchestratorAddress } from '../../src/protocol/network.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner, type AuthHeaders } from '../../src/protocol/signing.ts';
import {
  CHANNEL_KEY_HEADER, CHANNEL_PATH, CHANNEL_PROTOCOL, ChannelError, channelKeyPair, channelKeys, encodeChannelFrame, FrameKind, FrameReader,
  type ChannelFrame, type ChannelKeys,
} from '../../src/protocol/stage-channel.ts';
import { startStageServer, type StageServer } from '../helpers/stage-server.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';

const config = gptConfig('gpt-micro');
const checkpoint = wholeModelBytes(3, 9);
const cuts = splitEvenly(config, 2);
const key = SessionKey.generate();
const domain = domainOf(key.publicKey);
const signer = new RequestSigner({ session: key, address: orchestratorAddress(key.publicKey) }, { domain });
const client = new SignedClient('http://127.0.0.1', signer);
let engine: Engine;
const held: StageInference[] = [];
const servers: StageServer[] = [];
const sockets: Socket[] = [];

before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  for (const s of sockets) s.destroy();
  for (const s of servers) s.kill();
  for (const s of held) s.release();
  await engine.close();
});

async function server(): Promise<StageServer> {
  const inference = inferenceFromCheckpoint(engine, checkpoint, cuts[0], { maxSessions: 4 });
  held.push(inference);
  const s = await startStageServer({ orchestratorKey: key.publicKey, domain, deploymentId: 'dep-7', stage: 0, stageCount: 2, inference, id: `0x${'7'.repeat(40)}` });
  servers.push(s);
  return s;
}

const prefill = (id: string, tokens: number[]): Uint8Array =>
  encodeFrame(Float32Array.from(tokens), [tokens.length], 'f32', { deploymentId: 'dep-7', stage: 0, sessions: [{ id, rows: tokens.length, reset: true }] });
const decode = (id: string, token: number): Uint8Array => encodeFrame(Float32Array.of(token), [1], 'f32', { deploymentId: 'dep-7', stage: 0, sessions: [{ id, rows: 1 }] });

async function refusal(p: Promise<unknown>): Promise<NimbleError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof NimbleError, String(err));
    return err;
  }
  throw new Error('expected a refusal');
}

test('calls on a channel answer what the HTTP routes answer, bit for bit, refusals included; the channel outlives a refused call', async () => {
  const overHttp = await server();
  const onChannel = await server();
  const channels = new StageChannels(signer);
  try {
    for (const [id, tokens] of [['a', [1, 2, 3, 4]], ['b', [7, 8]]] as const) {
      const h = await client.request('POST', `${overHttp.peer.url}/infer`, prefill(id, [...tokens]));
      const c = await channels.call(onChannel.peer, 'infer', prefill(id, [...tokens]));
      assert.deepEqual(c, h);
    }
    assert.equal(channels.size, 1);
    assert.deepEqual(await channels.call(onChannel.peer, 'infer', decode('a', 5)), await client.request('POST', `${overHttp.peer.url}/infer`, decode('a', 5)));
    // a session that is not on the stage: the same 409 either way, and the channel goes on
    const h = await refusal(client.request('POST', `${overHttp.peer.url}/infer`, decode('nobody', 1)));
    const c = await refusal(channels.call(onChannel.peer, 'infer', decode('nobody', 1)));
    assert.deepEqual([c.status, c.code], [h.status, h.code]);
    assert.ok(h.message.endsWith(c.message), `${h.message} / ${c.message}`);
    assert.equal(c.status, 409);
    // a token outside the vocabulary: 400 either way
    const bad = await refusal(channels.call(onChannel.peer, 'infer', prefill('c', [1, 99999])));
    assert.equal(bad.status, 400);
    assert.match(bad.message, /outside the vocabulary/);
    // ending a session, then decoding it: the 409 of a session that is gone
    await channels.call(onChannel.peer, 'end', new TextEncoder().encode(JSON.stringify({ deploymentId: 'dep-7', session: 'b' })));
    assert.equal((await refusal(channels.call(onChannel.peer, 'infer', decode('b', 9)))).status, 409);
    assert.equal(channels.size, 1, 'one channel carried every call');
    assert.equal(onChannel.calls(), overHttp.calls() + 2, 'every call reached the stage (the channel was sent two more)');
  } finally {
    channels.close();
  }
});

test('a miner killed with calls on its channel fails them as unreachable; the next call opens a channel again', async () => {
  const s = await server();
  const channels = new StageChannels(signer, 5_000);
  try {
    await channels.call(s.peer, 'infer', prefill('k', [1, 2]));
    s.kill();
    const e = await refusal(channels.call(s.peer, 'infer', decode('k', 3)));
    assert.equal(e.code, 'unreachable');
    const again = await server();
    await channels.call(again.peer, 'infer', prefill('k', [1, 2]));
    assert.equal(channels.size, 1);
  } finally {
    channels.close();
  }
});

/** A hand-made channel to `s`: the upgrade signed by `by` (default: the orchestrator), its 101 or its refusal. */
async function openRaw(s: StageServer, by: RequestSigner = signer, headers?: AuthHeaders, path?: string): Promise<
  { ok: true; socket: Socket; keys: ChannelKeys; frames(): Promise<ChannelFrame[]>; received: ChannelFrame[]; headers: AuthHeaders } | { ok: false; status: number; body: string; headers: AuthHeaders }
> {
  const own = channelKeyPair();
  const target = path ?? `${CHANNEL_PATH}?key=${own.publicKey}`;
  const signed = headers ?? (await by.sign('GET', target));
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(target, s.peer.url), { method: 'GET', agent: false, headers: { ...signed, connection: 'Upgrade', upgrade: CHANNEL_PROTOCOL } });
    req.on('error', reject);
    req.on('response', (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ ok: false, status: res.statusCode ?? 0, body, headers: signed }));
    });
    req.on('upgrade', (res, socket: Socket) => {
      sockets.push(socket);
      const keys = channelKeys(own, String(res.headers[CHANNEL_KEY_HEADER]), own.publicKey, String(res.headers[CHANNEL_KEY_HEADER]));
      const reader = new FrameReader(keys.answer, 1 << 20);
      const got: ChannelFrame[] = [];
      socket.on('data', (c: Buffer) => got.push(...reader.push(c)));
      const closed = new Promise<void>((r) => socket.once('close', () => r()));
      // the frames answered until the miner closes the channel (or 1 s passes)
      const frames = async (): Promise<ChannelFrame[]> => {
        await Promise.race([closed, new Promise((r) => setTimeout(r, 1_000))]);
        return got;
      };
      resolve({ ok: true, socket, keys, frames, received: got, headers: signed });
    });
    req.end();
  });
}

test('attacks on the upgrade fail: a signer other than the orchestrator, a wallet signature, no signature, a replayed upgrade, another path', async () => {
  const s = await server();
  const stranger = SessionKey.generate();
  const other = await openRaw(s, new RequestSigner({ session: stranger, address: orchestratorAddress(stranger.publicKey) }, { domain }));
  assert.equal(other.ok, false);
  assert.ok(!other.ok && other.status === 401, JSON.stringify(other));
  // a wallet signature is refused before it is recovered (it would cost 1.6 ms each)
  const wallet = await openRaw(s, new RequestSigner(generatePrivateKey(), { domain }));
  assert.ok(!wallet.ok && wallet.status === 401 && /session key, not a wallet key/.test(wallet.body), JSON.stringify(wallet));
  const unsigned = await openRaw(s, signer, {} as AuthHeaders);
  assert.ok(!unsigned.ok && unsigned.status === 401 && /missing/.test(unsigned.body), JSON.stringify(unsigned));
  // the orchestrator's upgrade, sent again by someone who saw it: its nonce is spent
  const first = await openRaw(s);
  assert.ok(first.ok);
  const own = channelKeyPair();
  const target = `${CHANNEL_PATH}?key=${own.publicKey}`;
  const signed = await signer.sign('GET', target);
  const once = await openRaw(s, signer, signed, target);
  assert.ok(once.ok);
  const replayed = await openRaw(s, signer, signed, target);
  assert.ok(!replayed.ok && replayed.status === 401 && /nonce/.test(replayed.body), JSON.stringify(replayed));
  // a key in the query that the signature does not cover
  const swapped = await openRaw(s, signer, await signer.sign('GET', target), `${CHANNEL_PATH}?key=${channelKeyPair().publicKey}`);
  assert.ok(!swapped.ok && swapped.status === 401, JSON.stringify(swapped));
  const elsewhere = await openRaw(s, signer, undefined, '/health');
  assert.ok(!elsewhere.ok && elsewhere.status === 404, JSON.stringify(elsewhere));
  assert.equal(s.calls(), 0);
});

test('attacks on the frames fail: a forged MAC, a replayed frame, one out of sequence, one announced too long: the channel closes, nothing more runs', async () => {
  const s = await server();
  const forged = await openRaw(s);
  assert.ok(forged.ok);
  forged.socket.write(encodeChannelFrame(Buffer.alloc(32, 1), 1, FrameKind.INFER, prefill('f', [1, 2])));
  assert.deepEqual(await forged.frames(), []);
  assert.equal(s.calls(), 0, 'a forged frame runs nothing');

  const replay = await openRaw(s);
  assert.ok(replay.ok);
  const frame = encodeChannelFrame(replay.keys.request, 1, FrameKind.INFER, prefill('r', [1, 2]));
  replay.socket.write(frame);
  for (let i = 0; i < 200 && replay.received.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
  replay.socket.write(frame);
  const answers = await replay.frames();
  assert.deepEqual(answers.map((f) => [f.seq, f.kind]), [[1, FrameKind.OK]], 'the first ran, its replay closed the channel');
  assert.equal(s.calls(), 1);

  const skip = await openRaw(s);
  assert.ok(skip.ok);
  skip.socket.write(encodeChannelFrame(skip.keys.request, 2, FrameKind.INFER, prefill('s', [1])));
  assert.deepEqual(await skip.frames(), []);

  const unknown = await openRaw(s);
  assert.ok(unknown.ok);
  unknown.socket.write(encodeChannelFrame(unknown.keys.request, 1, 9 as FrameKind, prefill('u', [1])));
  assert.deepEqual(await unknown.frames(), []);

  const long = await openRaw(s);
  assert.ok(long.ok);
  const head = Buffer.alloc(8);
  head.writeUInt32LE(MAX_INFER_FRAME_BYTES + 1_000, 0);
  long.socket.write(head);
  assert.deepEqual(await long.frames(), []);
  assert.ok(long.socket.destroyed || long.socket.readableEnded, 'closed before the body was sent');
  assert.equal(s.calls(), 1, 'nothing else ran');
});

test('FrameReader: frames cut anywhere across chunks come out whole and in order; a changed byte fails the MAC; both ends derive the same keys', () => {
  const a = channelKeyPair();
  const b = channelKeyPair();
  const ka = channelKeys(a, b.publicKey, a.publicKey, b.publicKey);
  const kb = channelKeys(b, a.publicKey, a.publicKey, b.publicKey);
  assert.deepEqual(ka, kb);
  assert.notDeepEqual(ka.request, ka.answer);
  const payloads = [new Uint8Array(0), Uint8Array.from({ length: 3000 }, (_, i) => i & 255), Uint8Array.of(42)];
  const stream = Buffer.concat(payloads.map((p, i) => encodeChannelFrame(ka.request, i + 1, FrameKind.INFER, p)));
  for (const cut of [1, 3, 7, 41, 1000, stream.byteLength]) {
    const reader = new FrameReader(kb.request, 1 << 16);
    const got: ChannelFrame[] = [];
    for (let at = 0; at < stream.byteLength; at += cut) got.push(...reader.push(stream.subarray(at, at + cut)));
    assert.deepEqual(got.map((f) => [f.seq, f.kind, Buffer.from(f.payload).toString('hex')]), payloads.map((p, i) => [i + 1, FrameKind.INFER, Buffer.from(p).toString('hex')]), `cut ${cut}`);
  }
  const changed = Buffer.from(stream);
  changed[60] ^= 1;
  assert.throws(() => new FrameReader(kb.request, 1 << 16).push(changed), ChannelError);
  assert.throws(() => new FrameReader(kb.answer, 1 << 16).push(stream), ChannelError, 'the other direction\'s key does not verify');
  // too long: refused from its length alone, before its bytes are here
  assert.throws(() => new FrameReader(kb.request, 100).push(encodeChannelFrame(ka.request, 1, FrameKind.INFER, new Uint8Array(200)).subarray(0, 4)), ChannelError);
});
