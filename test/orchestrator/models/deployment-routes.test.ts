// The deployment routes, in process (fastify inject) against a real anvil
// with the contracts: only the owner of a published model deploys and
// undeploys it (a stranger gets 403, a classifier 400, an unknown model 404,
// a stored model that is not published 409); `GET /models` shows each
// model's deployment with its stages and miners; the registry's deployed flag
// follows the deployment on chain (set once it serves, cleared once
// undeployed). On an unpaid network the store's owner is the owner.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { DeploymentView } from '../../../src/api/deployments.ts';
import { StoredModelList } from '../../../src/api/models.ts';
import { modelOfSha256, publishModel } from '../../../src/chain/registry.ts';
import { createHttpServer, type HttpServer } from '../../../src/http/server.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import { chainModelRegistry, RegistrySync } from '../../../src/orchestrator/models/deployment-registry.ts';
import { MAX_JSON_BYTES } from '../../../src/orchestrator/http.ts';
import { deploymentRoutes } from '../../../src/orchestrator/routes/deployments.ts';
import { modelRoutes } from '../../../src/orchestrator/routes/models.ts';
import { BlobAccess, publicationOf } from '../../../src/orchestrator/blobs/access.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { parse } from '../../../src/protocol/messages.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { RequestSigner, RequestVerifier } from '../../../src/protocol/signing.ts';
import { startTestChain, type TestChain } from '../../chain/helpers.ts';
import { mlpModelBytes, wholeModelBytes } from '../../helpers/whole-model.ts';

let dir: string;
let state: OrchestratorState;
let coordinator: Coordinator;
let chain: TestChain;
/** the model and deployment routes of an orchestrator paid on the chain */
let app: HttpServer;
/** the same of an unpaid one (no chain) */
let unpaid: HttpServer;
let sync: RegistrySync;
let dev: RequestSigner;
let eve: RequestSigner;
const devKey = generatePrivateKey();
const gpt = wholeModelBytes(21, 100);
const mlp = mlpModelBytes(22, 100);
const unpublished = wholeModelBytes(23, 100);
const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-deploy-routes-'));
  chain = await startTestChain();
  state = OrchestratorState.open(join(dir, 'o.sqlite'));
  coordinator = new Coordinator(state, await FsBlobStore.open(join(dir, 'blobs')), { spotChecks: { rate: 0 }, log: () => {} });
  const { domain } = coordinator.identity;
  const server = (): HttpServer => createHttpServer({ bodyLimit: MAX_JSON_BYTES, verifier: new RequestVerifier({ domain, notBefore: Date.now(), sessionKeyOf: () => undefined }) });
  const access = chainModelRegistry({ client: chain.client, signer: chain.operator });
  app = server();
  modelRoutes(app, coordinator, { client: chain.client, signer: chain.operator }, new BlobAccess(state, publicationOf(access)));
  deploymentRoutes(app, coordinator, access);
  unpaid = server();
  modelRoutes(unpaid, coordinator, null, new BlobAccess(state, null));
  deploymentRoutes(unpaid, coordinator, null);
  sync = new RegistrySync(state, access);
  dev = new RequestSigner(devKey, { domain });
  eve = new RequestSigner(generatePrivateKey(), { domain });
  // the developer stores three models; the GPT and the classifier are published for it (by the orchestrator, which may)
  for (const [bytes, name] of [[gpt, 'micro'], [mlp, 'spam'], [unpublished, 'draft']] as const) {
    const r = await send(app, 'POST', `/models/file?name=${name}&pricePer1kTokens=0`, { bytes, signer: dev });
    assert.equal(r.status, 200, JSON.stringify(r.body));
  }
  for (const [bytes, name] of [[gpt, 'micro'], [mlp, 'spam']] as const) {
    await publishModel(chain.client, chain.operator, { checkpointSha256: `0x${sha(bytes)}`, name, metadataURI: `nimble-model:${sha(bytes)}`, owner: dev.address as Hex, pricePer1kTokens: 0n });
  }
});
after(async () => {
  await sync?.settled();
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
}

async function send(server: HttpServer, method: 'GET' | 'POST', url: string, opts: { json?: unknown; bytes?: Uint8Array; signer?: RequestSigner } = {}): Promise<Answer> {
  const body = opts.json !== undefined ? new TextEncoder().encode(JSON.stringify(opts.json)) : opts.bytes;
  const headers: Record<string, string> = {};
  if (body) headers['content-type'] = opts.json !== undefined ? 'application/json' : 'application/octet-stream';
  if (opts.signer) Object.assign(headers, await opts.signer.sign(method, url, body));
  const res = await server.inject({ method, url, headers, payload: body ? Buffer.from(body) : undefined });
  return { status: res.statusCode, body: JSON.parse(res.body || '{}') as Record<string, unknown> };
}

function isError(a: Answer, status: number, code: string, message?: RegExp): void {
  assert.equal(a.status, status, JSON.stringify(a.body));
  assert.equal(a.body.code, code, JSON.stringify(a.body));
  if (message) assert.match(String(a.body.error), message);
}

const deploy = (server: HttpServer, bytes: Uint8Array | string, signer: RequestSigner, json: unknown = {}): Promise<Answer> =>
  send(server, 'POST', `/models/${typeof bytes === 'string' ? bytes : sha(bytes)}/deploy`, { json, signer });
const undeploy = (server: HttpServer, bytes: Uint8Array, signer: RequestSigner): Promise<Answer> => send(server, 'POST', `/models/${sha(bytes)}/undeploy`, { json: {}, signer });

function joinMiner(name: string): string {
  const id = privateKeyToAccount(generatePrivateKey()).address;
  coordinator.join(id, { name, url: 'http://127.0.0.1:1', hardware: { gflops: 10, threads: 1, memoryBytes: 1 << 30 }, bandwidthMbps: 100, sessionKey: SessionKey.generate().publicKey, serve: 'both' });
  return id;
}

test('only the owner of a published GPT deploys it: a stranger 403, a classifier 400, an unknown model 404, an unpublished one 409', async () => {
  isError(await deploy(app, '0'.repeat(64), dev), 404, 'not_found', /no stored model/);
  isError(await deploy(app, mlp, dev), 400, 'invalid', /MLP classifier .*cannot be deployed for generation/);
  isError(await deploy(app, unpublished, dev), 409, 'not_published', /stored but not published on chain 31337/);
  isError(await deploy(app, gpt, eve), 403, 'forbidden', new RegExp(`model #0 'micro' on chain 31337 is ${dev.address}'s: only its owner may deploy it`));
  isError(await deploy(app, gpt, dev, { replicas: 0 }), 400, 'invalid');
  isError(await deploy(app, gpt, dev, { stages: 9 }), 400, 'invalid', /has 4 parts; it cannot be cut into 9 stages/);
  isError(await send(app, 'POST', `/models/${sha(gpt)}/deploy`, { json: {} }), 401, 'missing', /auth missing/);
  assert.equal(state.deployments.list().length, 0, 'nothing refused was recorded');
});

test('the owner deploys; GET /models shows its stages and miners; the registry flag is set once it serves and cleared once the owner undeploys', async () => {
  const r = await deploy(app, gpt, dev, { replicas: 1, stages: 2 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const d = parse(DeploymentView, r.body, 'deployment');
  assert.equal(d.status, 'deploying');
  assert.equal(d.owner, dev.address);
  assert.deepEqual(d.registry, { chainId: 31337, address: chain.client.deployment.modelRegistry, modelId: 0, deployed: null });
  assert.match(d.message!, /waiting for miners that serve inference/);
  isError(await deploy(app, gpt, dev), 409, 'conflict', /deployed already/);

  const miners = [joinMiner('a'), joinMiner('b')];
  coordinator.tick();
  const listed = parse(StoredModelList, (await send(app, 'GET', '/models')).body, 'list');
  const shown = listed.find((m) => m.sha256 === sha(gpt))!.deployment!;
  assert.equal(shown.id, d.id);
  assert.deepEqual(shown.stages.map((s) => [s.stage, s.parts]), [[0, [0, 3]], [1, [3, 4]]]);
  assert.deepEqual(shown.stages.flatMap((s) => s.miners.map((m) => m.name)).sort(), ['a', 'b']);
  assert.equal(listed.find((m) => m.sha256 === sha(mlp))!.deployment, null);

  await sync.step();
  assert.equal((await modelOfSha256(chain.client, `0x${sha(gpt)}`))!.deployed, false, 'not set while no miner serves');
  for (const id of miners) {
    const a = coordinator.heartbeat(id, { freeSlots: 0, queue: 0, reports: [] }).deployment!;
    coordinator.heartbeat(id, { freeSlots: 0, queue: 0, reports: [], deployment: { deploymentId: a.deploymentId, stage: a.stage, state: 'serving', sha256: a.sha256, verifiedBy: 'chain' } });
  }
  const serving = parse(DeploymentView, (await send(app, 'GET', `/models/${sha(gpt)}`)).body.deployment, 'deployment');
  assert.equal(serving.status, 'serving');
  assert.ok(serving.stages.every((s) => s.miners.every((m) => m.state === 'serving' && m.verifiedBy === 'chain')));
  await sync.step();
  assert.equal((await modelOfSha256(chain.client, `0x${sha(gpt)}`))!.deployed, true);
  assert.equal(parse(DeploymentView, (await send(app, 'GET', `/models/${sha(gpt)}`)).body.deployment, 'deployment').registry!.deployed, true);

  isError(await undeploy(app, gpt, eve), 403, 'forbidden', /only its owner may undeploy it/);
  const off = await undeploy(app, gpt, dev);
  assert.equal(off.status, 200, JSON.stringify(off.body));
  const gone = parse(DeploymentView, off.body, 'deployment');
  assert.deepEqual([gone.status, gone.undeployReason], ['undeployed', 'undeployed by its owner']);
  assert.deepEqual(gone.stages.map((s) => s.miners), [[], []], 'its miners are let go');
  for (const id of miners) assert.equal(coordinator.heartbeat(id, { freeSlots: 0, queue: 0, reports: [] }).deployment, null);
  isError(await undeploy(app, gpt, dev), 409, 'conflict', /is not deployed/);
  await sync.step();
  assert.equal((await modelOfSha256(chain.client, `0x${sha(gpt)}`))!.deployed, false);
  assert.equal(state.deployments.get(d.id)!.registryDeployed, false);
});

test('on an unpaid network the address that stored the model owns it, and no registry is named', async () => {
  const bytes = wholeModelBytes(24, 5);
  state.models.claim({ sha256: sha(bytes), owner: dev.address, name: 'local', bytes: bytes.length, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: null, step: 5 }, Date.now());
  isError(await deploy(unpaid, bytes, eve), 403, 'forbidden', new RegExp(`model 'local' is ${dev.address}'s`));
  const r = await deploy(unpaid, bytes, dev);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(parse(DeploymentView, r.body, 'deployment').registry, null);
});
