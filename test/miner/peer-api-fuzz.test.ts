// The miner's peer API in process (fastify inject), fuzzed with the signatures
// of the neighbours the orchestrator named, so that random frames get past
// authentication and reach what a real network's fuzz cannot (a joined
// attacker is nobody's neighbour): the frame decoder, the meta schemas, the
// ticket and the held-work checks. Every answer is a 4xx in the error
// contract (or a 202), and whatever is queued is a well-formed activation or
// gradient of the stage held, with finite values in range. The seed is
// printed; NIMBLE_FUZZ_SEED replays it.
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { after, before, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { Engine } from '../../src/engine/engine.ts';
import { routesOf, type HttpServer } from '../../src/http/server.ts';
import { buildPeerApi, MAX_VALUE, type MinerStats } from '../../src/miner/peer-api.ts';
import type { Job } from '../../src/miner/pipeline.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import type { Peer, StageAssignment } from '../../src/protocol/messages.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { RequestSigner, RequestVerifier } from '../../src/protocol/signing.ts';
import { fuzzRoute, prng, type FuzzKeys } from '../helpers/fuzz-requests.ts';

const SEED = process.env.NIMBLE_FUZZ_SEED ? Number(process.env.NIMBLE_FUZZ_SEED) >>> 0 : randomInt(2 ** 31);
const REQUESTS = 2000;
const DOMAIN = 'nimble:fuzz';
const model = 'gpt-micro';
const B = 2, T = 16, C = 16;

function neighbour(): { peer: Peer; signer: RequestSigner; wallet: RequestSigner; session: SessionKey } {
  const wallet = new RequestSigner(generatePrivateKey(), { domain: DOMAIN });
  const session = SessionKey.generate();
  return { peer: { id: wallet.address, url: 'http://127.0.0.1:9', sessionKey: session.publicKey, weight: 1 }, signer: new RequestSigner({ session, address: wallet.address }, { domain: DOMAIN }), wallet, session };
}
const upstream = neighbour();
const downstream = neighbour();

let engine: Engine;
let runner: StageRunner;
let app: HttpServer;
const jobs: Job[] = [];
const stats: MinerStats = { forward: 0, backward: 0, merges: 0, bytesSent: 0, rejected: 0 };

before(async () => {
  engine = await Engine.create({ threads: 1 });
  const range = splitEvenly(gptConfig(model), 3)[1];
  const a: StageAssignment = { runId: 'run-1', stage: 1, stageCount: 3, from: range.from, to: range.to, model, data: 'moby-dick', batchSize: B, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
  runner = new StageRunner(engine, a, 2);
  const neighbours = [upstream.peer, downstream.peer];
  app = buildPeerApi({
    verifier: new RequestVerifier({ domain: DOMAIN, sessionKeyOf: (address) => neighbours.find((p) => p.id === address)?.sessionKey }),
    network: { domain: DOMAIN, orchestratorKey: SessionKey.generate().publicKey, sessionKey: SessionKey.generate(), previousStage: () => [upstream.peer], nextStage: () => [downstream.peer] },
    work: {
      runner,
      get queued() {
        return jobs.length % 8; // never full: every frame is judged on its own
      },
      // gradients of the first microbatches' first attempts are awaited from the next stage
      expectsGradient: (microbatch, attempt, sender) => microbatch <= 50 && attempt === 1 && sender === downstream.peer.id,
      push: (job) => void jobs.push(job),
    },
    stats,
    health: () => ({ ok: true, address: upstream.peer.id, stage: { runId: 'run-1', stage: 1, round: 0 }, stats }),
    log: () => {},
    maxFrameBytes: 1 << 16,
  });
  await app.ready();
});

after(async () => {
  await app.close();
  runner.dispose();
  await engine.close();
});

test(`the peer API takes ${REQUESTS} random frames signed by its own neighbours: 4xx or 202, and only well-formed work is queued`, async () => {
  console.log(`peer fuzz seed ${SEED} (NIMBLE_FUZZ_SEED=${SEED} reproduces it)`);
  const rng = prng(SEED);
  const routes = routesOf(app);
  const keysOf = (n: ReturnType<typeof neighbour>): FuzzKeys => ({
    wallet: n.wallet,
    session: n.signer,
    sessionPublicKey: n.session.publicKey,
    foreignSession: new RequestSigner({ session: n.session, address: n.wallet.address }, { domain: 'nimble:elsewhere' }),
    foreignWallet: new RequestSigner(generatePrivateKey(), { domain: 'nimble:elsewhere' }),
    staleSession: new RequestSigner({ session: n.session, address: n.wallet.address }, { domain: DOMAIN, now: () => Date.now() - 5 * 60_000 }),
    futureSession: new RequestSigner({ session: n.session, address: n.wallet.address }, { domain: DOMAIN, now: () => Date.now() + 5 * 60_000 }),
    stranger: neighbour().signer,
    apiKey: 'nk-none', // the peer API has no /v1 route
    operatorCookie: '', // nor an operator's
  });
  // a forward signed by the previous stage, a gradient by the next: valid signatures reach the frame checks
  const keys = { '/forward': keysOf(upstream), '/backward': keysOf(downstream) } as Record<string, FuzzKeys>;
  const world = { runIds: ['run-1'], addresses: [upstream.peer.id, downstream.peer.id] };
  const answers = new Map<string, number>();
  const bad: string[] = [];
  let reachedFrames = 0;
  for (let n = 0; n < REQUESTS; ) {
    // mostly the routes that take frames
    const pool = rng() < 0.8 ? routes.filter((r) => r.signed) : routes;
    const route = pool[Math.floor(rng() * pool.length)];
    for (const req of await fuzzRoute(rng, 'inject', route, keys[route.url] ?? keys['/forward'], world)) {
      n++;
      if (req.announce !== undefined) continue; // inject sends what it is given
      const res = await app.inject({ method: req.method as 'POST', url: req.path, headers: req.headers, payload: req.body ? Buffer.from(req.body) : undefined });
      answers.set(String(res.statusCode), (answers.get(String(res.statusCode)) ?? 0) + 1);
      let body: Record<string, unknown> = {};
      try {
        body = res.body ? (JSON.parse(res.body) as Record<string, unknown>) : {};
      } catch {
        // checked below
      }
      const contract = res.statusCode < 400 || req.method === 'HEAD' || (Object.keys(body).sort().join() === 'code,error' && /^[a-z_0-9]{1,64}$/.test(String(body.code)));
      if (res.statusCode >= 500 || !contract) bad.push(`${req.method} ${req.path.slice(0, 100)} [${req.kind.join(', ').slice(0, 160)}] -> ${res.statusCode} ${res.body.slice(0, 200)}`);
      if (route.signed && res.statusCode !== 401 && res.statusCode !== 404) reachedFrames++;
    }
  }
  console.log(`answers: ${[...answers].sort().map(([s, k]) => `${s} x${k}`).join(', ')}; ${jobs.length} queued`);
  assert.deepEqual(bad.slice(0, 20), [], `${bad.length} answers were 5xx or outside the error contract (seed ${SEED})`);
  assert.ok(reachedFrames > REQUESTS / 10, `only ${reachedFrames} signed requests got past authentication`);
  for (const job of jobs) {
    if (job.kind === 'start') throw new Error('the peer API queued a start');
    assert.equal(job.data.length, B * T * C, 'a queued frame has the stage\'s activation shape');
    assert.ok(job.data.every((x: number) => Number.isFinite(x) && Math.abs(x) <= MAX_VALUE), 'a queued frame holds finite values in range');
    assert.equal(job.meta.runId, 'run-1');
    assert.equal(job.meta.stage, 1);
  }
});
