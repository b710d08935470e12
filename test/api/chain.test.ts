// OrchestratorClient.chain(): the chain an orchestrator names (GET /chain) is
// taken only with the network's signature of the caller's fresh challenge: an
// answer signed by another key, or changed after signing, is refused; an
// unpaid network names none (null); an orchestrator from before GET /chain
// says nothing (undefined). A real HTTP server on loopback plays the
// orchestrator.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { OrchestratorClient } from '../../src/api/client.ts';
import { chainMessage } from '../../src/api/network.ts';
import type { ChainView } from '../../src/api/schemas.ts';
import { challengeMessage } from '../../src/protocol/network.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';

const network = SessionKey.generate();
const other = SessionKey.generate();
const address = (n: string): `0x${string}` => `0x${n.repeat(40)}`;
const view: ChainView = {
  chainId: 31337,
  rpcUrl: 'http://127.0.0.1:8545',
  local: true,
  genesisHash: `0x${'ab'.repeat(32)}`,
  deployBlockHash: `0x${'cd'.repeat(32)}`,
  contracts: {
    chainId: 31337,
    nim: address('1'),
    staking: address('2'),
    rewardDistributor: address('3'),
    modelRegistry: address('4'),
    jobEscrow: address('5'),
    deployer: address('6'),
    orchestrator: address('6'),
    faucet: address('6'),
    deployBlock: '1',
    unstakeCooldownSeconds: 0,
    deployedAt: '2026-01-01T00:00:00.000Z',
  },
};

/** How the fake orchestrator answers GET /chain. */
let mode: 'genuine' | 'unpaid' | 'other-key' | 'changed' | 'unsigned' | 'absent' = 'genuine';
let server: Server;
let url = '';

before(async () => {
  server = createServer((req, res) => {
    const u = new URL(req.url ?? '/', 'http://x');
    const challenge = u.searchParams.get('challenge') ?? '';
    const json = (status: number, body: unknown): void => {
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    };
    if (u.pathname === '/network') return json(200, { publicKey: network.publicKey, signature: network.sign(challengeMessage(challenge)) });
    if (u.pathname !== '/chain' || mode === 'absent') return json(404, { error: { code: 'not_found', message: `Route GET:${u.pathname} not found` } });
    const chain = mode === 'unpaid' ? null : view;
    const signer = mode === 'other-key' ? other : network;
    const signature = mode === 'unsigned' ? null : signer.sign(chainMessage(challenge, chain));
    // changed after signing: another RPC (a node the sender controls)
    const sent = mode === 'changed' ? { ...view, rpcUrl: 'http://127.0.0.1:9999' } : chain;
    return json(200, { chain: sent, signature });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => new Promise<void>((r) => server.close(() => r())));

test("the network's signed answer is taken; unpaid is null; an orchestrator without GET /chain is undefined", async () => {
  mode = 'genuine';
  assert.deepEqual(await new OrchestratorClient(url).chain(), view);
  mode = 'unpaid';
  assert.equal(await new OrchestratorClient(url).chain(), null);
  mode = 'absent';
  assert.equal(await new OrchestratorClient(url).chain(), undefined);
});

test('an answer signed by another key, changed after signing, or not signed is refused', async () => {
  for (const m of ['other-key', 'changed', 'unsigned'] as const) {
    mode = m;
    await assert.rejects(new OrchestratorClient(url).chain(), new RegExp(`${url} named its chain without its network's signature: refused`), m);
  }
});
