// The orchestrator's serving driver against fake miners: whatever a miner
// answers /infer with (garbage, a frame of the wrong shape, non-finite
// values, an error), the request ends with a 502 or 503 in OpenAI's
// shape and the orchestrator goes on; and the request checks refuse what they
// should.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, test } from 'node:test';
import { encodeFrame } from '../../../src/protocol/frame.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { domainOf } from '../../../src/protocol/network.ts';
import { Completions, OpenAiError, parseCompletionRequest } from '../../../src/orchestrator/serving/completions.ts';
import type { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import type { DeploymentRecord } from '../../../src/orchestrator/state/deployments.ts';

const servers: Server[] = [];
after(() => servers.forEach((s) => s.close()));

async function fakeMiner(answer: (body: Buffer) => { status: number; body: Uint8Array | string }): Promise<string> {
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const a = answer(Buffer.concat(parts));
      res.writeHead(a.status, { 'content-type': typeof a.body === 'string' ? 'application/json' : 'application/octet-stream' });
      res.end(a.body);
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function fakeCoordinator(url: string): { c: Coordinator; d: DeploymentRecord } {
  const key = SessionKey.generate();
  const d = { id: 'dep-1', name: 'm', sha256: 'a'.repeat(64), model: 'gpt-micro', status: 'serving', message: null, sessions: 4 } as unknown as DeploymentRecord;
  const c = {
    identity: { key, domain: domainOf(key.publicKey) },
    state: { deployments: { stages: () => [{ stage: 0, fromPart: 0, toPart: 4 }] } },
    deployments: { servingPeers: () => [{ id: '0x' + '1'.repeat(40), url, sessionKey: key.publicKey, weight: 1 }], noteRequest: () => {} },
  } as unknown as Coordinator;
  return { c, d };
}

const request = parseCompletionRequest({ model: 'm', prompt: 'hi', max_tokens: 3 });

for (const [what, answer, status] of [
  ['garbage bytes', () => ({ status: 200, body: new Uint8Array([1, 2, 3, 4, 5]) }), 502],
  ['a frame of the wrong shape', () => ({ status: 200, body: encodeFrame(new Float32Array(10), [10], 'f32') }), 502],
  ['a frame whose payload was altered (NaN where its sha256 says otherwise)', () => {
    const f = encodeFrame(new Float32Array(256), [1, 256], 'f32');
    new DataView(f.buffer, f.byteOffset).setFloat32(f.length - 4, Number.NaN, true);
    return { status: 200, body: f };
  }, 502],
  ['an error answer', () => ({ status: 400, body: JSON.stringify({ error: 'nope', code: 'invalid' }) }), 502],
  ['an overloaded answer', () => ({ status: 503, body: JSON.stringify({ error: 'full', code: 'overloaded' }) }), 503],
] as const) {
  test(`a miner answering /infer with ${what} ends the request with a ${status}, nothing worse`, async () => {
    const url = await fakeMiner(answer);
    const { c, d } = fakeCoordinator(url);
    await assert.rejects(new Completions(c).generate(d, request), (err: unknown) => err instanceof OpenAiError && err.status === status && err.body().error.message.length > 0);
  });
}

test('a well-formed logits frame from the only stage generates', async () => {
  const logits = new Float32Array(256);
  logits[65] = 10;
  const url = await fakeMiner((body) => (body.length > 0 && body[0] === 0x7b ? { status: 200, body: '{"ok":true}' } : { status: 200, body: encodeFrame(logits, [1, 256], 'f32') }));
  const { c, d } = fakeCoordinator(url);
  const out = await new Completions(c).generate(d, parseCompletionRequest({ model: 'm', prompt: 'hi', max_tokens: 3, temperature: 0 }));
  assert.equal(new TextDecoder().decode(out.bytes), 'AAA');
  assert.equal(out.finishReason, 'length');
});

test('request checks', () => {
  const refuse = (body: unknown, param: string | null) => assert.throws(() => parseCompletionRequest(body), (e: unknown) => e instanceof OpenAiError && e.status === 400 && e.param === param);
  refuse(null, null);
  refuse({ prompt: 'x' }, 'model');
  refuse({ model: 'm', prompt: 'x'.repeat(16_385) }, 'prompt');
  refuse({ model: 'm', prompt: 'é'.repeat(9000) }, 'prompt');
  refuse({ model: 'm', prompt: 'x', max_tokens: 1.5 }, 'max_tokens');
  refuse({ model: 'm', prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop');
  refuse({ model: 'm', prompt: 'x', stop: [''] }, 'stop');
  refuse({ model: 'm', prompt: 'x', seed: 0.5 }, 'seed');
  refuse({ model: 'm', prompt: 'x', n: 2 }, 'n');
  refuse({ model: 'm', prompt: 'x', stream: 'yes' }, 'stream');
  const ok = parseCompletionRequest({ model: 'm', prompt: [104, 105], stop: 'x', stream: true, seed: -3 });
  assert.deepEqual(Array.from(ok.prompt), [104, 105]);
  assert.equal(ok.stream, true);
});
