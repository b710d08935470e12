// Deployments on a real Coordinator and OrchestratorState (SQLite in a temp
// dir), with a clock the test moves: a deployment is planned only onto miners
// that serve inference and hold nothing else, each miner's heartbeat brings
// its stage and takes its report (loading → serving with a checked file), the
// status follows the replicas, a miner that fails to load is let go and never
// given it again, a miner that vanishes is replaced, training leaves
// deployment miners and inference-only miners alone, and the idle collector
// undeploys a deployment with no request for its idle limit. The state
// survives a reopen. No child process, no network.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount } from '../../../src/model/parts.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import { DEFAULT_IDLE_LIMIT_MS, deploymentView } from '../../../src/orchestrator/models/deployments.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import type { ModelRecord } from '../../../src/orchestrator/state/models.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import type { DeploymentAssignment, DeploymentReport, ServeSetting } from '../../../src/protocol/messages.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { SMALL_MLP } from '../../helpers/whole-model.ts';
import { stateTarget } from '../helpers.ts';

const HOUR = 3_600_000;
const OWNER = privateKeyToAccount(generatePrivateKey()).address;
const CONFIG = gptConfig('gpt-micro');
const SHA = createHash('sha256').update('gpt-micro weights').digest('hex');

let dir: string;
let now: number;
let state: OrchestratorState;
let target: string;
let c: Coordinator;
let model: ModelRecord;

async function open(): Promise<void> {
  state = OrchestratorState.open(target);
  c = new Coordinator(state, await FsBlobStore.open(join(dir, 'blobs')), { spotChecks: { rate: 0 }, now: () => now, log: () => {} });
}

beforeEach(async () => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-deployments-'));
  target = await stateTarget(dir);
  now = 1_700_000_000_000;
  await open();
  model = state.models.claim({ sha256: SHA, owner: OWNER, name: 'micro', bytes: 30_000, kind: 'gpt', model: 'gpt-micro', config: CONFIG, jobId: null, step: 7 }, now).record;
});
afterEach(async () => {
  await c.close();
  state.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A miner joins with this setting (and plenty of memory); its id. */
function joinMiner(name: string, serve: ServeSetting, gflops = 10): string {
  const id = privateKeyToAccount(generatePrivateKey()).address;
  c.join(id, { name, url: 'http://127.0.0.1:1', hardware: { gflops, threads: 1, memoryBytes: 1 << 30 }, bandwidthMbps: 1000, sessionKey: SessionKey.generate().publicKey, serve });
  return id;
}

/** A heartbeat of an idle miner (holding no training stage), with its deployment report; the deployment it is to hold. */
function beat(id: string, deployment?: DeploymentReport): DeploymentAssignment | null {
  return c.heartbeat(id, { freeSlots: 0, queue: 0, reports: [], ...(deployment ? { deployment } : {}) }).deployment ?? null;
}

const serving = (a: DeploymentAssignment): DeploymentReport => ({ deploymentId: a.deploymentId, stage: a.stage, state: 'serving', sha256: a.sha256, verifiedBy: 'sha256' });

test('a deployment is planned onto miners that serve inference, told through heartbeats, and serves once every stage has a checked replica', () => {
  const a = joinMiner('a', 'both', 20);
  const b = joinMiner('b', 'inference', 10);
  const t = joinMiner('t', 'training', 50);
  const d = c.deployments.deploy({ model, owner: OWNER, registry: null, replicas: 1, stages: 2 });
  assert.equal(d.status, 'deploying');
  const view = deploymentView(state, d);
  assert.equal(view.stages.length, 2);
  assert.deepEqual(view.stages.map((s) => s.parts), [[0, 3], [3, 4]]);
  assert.deepEqual(view.stages.flatMap((s) => s.miners.map((m) => m.name)).sort(), ['a', 'b'], 'the training-only miner is never given a stage');
  assert.equal(beat(t), null);

  const ga = beat(a)!;
  const gb = beat(b)!;
  assert.deepEqual([ga, gb].sort((x, y) => x.stage - y.stage).map((g) => [g.from, g.to, g.stageCount, g.sha256, g.bytes, g.model, g.registry]), [
    [0, 3, 2, SHA, 30_000, 'gpt-micro', null],
    [3, 4, 2, SHA, 30_000, 'gpt-micro', null],
  ]);
  beat(a, { deploymentId: ga.deploymentId, stage: ga.stage, state: 'loading' });
  beat(a, serving(ga));
  assert.equal(state.deployments.get(d.id)!.status, 'deploying', 'one stage is not served yet');
  beat(b, serving(gb));
  const served = state.deployments.get(d.id)!;
  assert.equal(served.status, 'serving');
  assert.equal(served.servingAt, now);
  const shown = deploymentView(state, served);
  assert.ok(shown.stages.every((s) => s.miners.every((m) => m.state === 'serving' && m.verifiedBy === 'sha256' && m.sha256 === SHA)));

  // training leaves the deployment's miners alone: a run gets only the training miner
  const run = c.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 10, stages: 1, batchSize: 2 }, OWNER);
  assert.deepEqual(state.runs.assignments(run.id).map((x) => x.minerId), [t]);
  assert.deepEqual(c.idleMiners().map((m) => m.id), []);
  // and the deployment's planner leaves the training miner alone whatever its setting
  assert.equal(state.miners.get(t)!.serve, 'training');

  // one deployment of a model at a time
  assert.throws(() => c.deployments.deploy({ model, owner: OWNER, registry: null }), (e: unknown) => e instanceof NimbleError && e.status === 409 && /deployed already/.test(e.message));
});

test('a miner that fails to load its stage is let go, never given it again, and replaced; a vanished miner is replaced', () => {
  const a = joinMiner('a', 'inference', 30);
  const d = c.deployments.deploy({ model, owner: OWNER, registry: null, replicas: 1, stages: 1 });
  const got = beat(a)!;
  assert.equal(got.stage, 0);
  assert.deepEqual([got.from, got.to], [0, partCount(CONFIG)]);
  // a file that did not verify
  assert.equal(beat(a, { deploymentId: d.id, stage: 0, state: 'failed', detail: 'the model file has sha256 abc…, not …' }), null);
  let view = deploymentView(state, state.deployments.get(d.id)!);
  assert.deepEqual(view.refused.map((r) => [r.id, r.detail]), [[a, 'the model file has sha256 abc…, not …']]);
  c.tick();
  assert.equal(beat(a), null, 'the refusing miner is not given it again');
  assert.match(state.deployments.get(d.id)!.message!, /waiting for miners: stage 0 has 0 of 1 replicas/);

  // a miner claiming to serve another file is refused too
  const b = joinMiner('b', 'both', 10);
  c.tick();
  const gb = beat(b)!;
  assert.equal(beat(b, { ...serving(gb), sha256: '0'.repeat(64) }), null);
  assert.ok(state.deployments.refusals(d.id).some((r) => r.minerId === b && /not [0-9a-f]{64}/.test(r.detail)));

  const e = joinMiner('e', 'inference', 10);
  c.tick();
  const ge = beat(e)!;
  beat(e, serving(ge));
  assert.equal(state.deployments.get(d.id)!.status, 'serving');
  // e vanishes: the deployment goes back to deploying and a newcomer takes its stage
  now += 10_000;
  beat(a);
  beat(b);
  c.tick();
  view = deploymentView(state, state.deployments.get(d.id)!);
  assert.equal(view.status, 'deploying');
  assert.deepEqual(view.stages[0].miners, []);
  const f = joinMiner('f', 'inference', 10);
  c.tick();
  beat(f, serving(beat(f)!));
  assert.equal(state.deployments.get(d.id)!.status, 'serving');
  assert.deepEqual(deploymentView(state, state.deployments.get(d.id)!).stages[0].miners.map((m) => m.name), ['f']);
});

test('a deployment waits for miners, saying why, and is planned once they come', () => {
  joinMiner('t', 'training');
  const d = c.deployments.deploy({ model, owner: OWNER, registry: null, replicas: 2, stages: 2 });
  assert.match(d.message!, /waiting for miners that serve inference: no miner serving inference is free/);
  for (const n of ['a', 'b', 'c']) joinMiner(n, 'inference');
  c.tick();
  assert.match(state.deployments.get(d.id)!.message!, /2 stages with 2 replicas each need at least 4 miners; 3 available/);
  joinMiner('d', 'both');
  c.tick();
  const planned = deploymentView(state, state.deployments.get(d.id)!);
  assert.equal(planned.message, null);
  assert.deepEqual(planned.stages.map((s) => s.miners.length), [2, 2]);
});

test('the idle collector undeploys a deployment with no request for its idle limit (24 h by default), with an injected clock', () => {
  const a = joinMiner('a', 'both');
  const d = c.deployments.deploy({ model, owner: OWNER, registry: null });
  assert.equal(d.idleLimitMs, DEFAULT_IDLE_LIMIT_MS);
  const report = serving(beat(a)!);
  beat(a, report);
  now += 23 * HOUR;
  beat(a, report);
  c.tick();
  assert.equal(state.deployments.get(d.id)!.status, 'serving');
  c.deployments.noteRequest(d.id); // a request at 23 h: the limit counts from it
  now += 23 * HOUR;
  beat(a, report);
  c.tick();
  assert.equal(state.deployments.get(d.id)!.status, 'serving');
  now += HOUR;
  beat(a, report);
  c.tick();
  const gone = state.deployments.get(d.id)!;
  assert.equal(gone.status, 'undeployed');
  assert.equal(gone.undeployReason, 'idle: no request for 24 h');
  assert.equal(gone.undeployedAt, now);
  assert.equal(beat(a), null, 'its miner lets go of the stage');
  assert.deepEqual(c.idleMiners().map((m) => m.id), [a], 'and is free to train again');
  // a shorter limit asked for at deploy
  const again = c.deployments.deploy({ model, owner: OWNER, registry: null, idleLimitMs: 2 * 60_000 });
  now += 2 * 60_000;
  assert.deepEqual(c.deployments.collectIdle().map((x) => [x.id, x.undeployReason]), [[again.id, 'idle: no request for 2 min']]);
  assert.deepEqual(state.deployments.list().map((x) => x.status), ['undeployed', 'undeployed']);
});

test('only a GPT deploys, cut into at most its parts', () => {
  const mlp = state.models.claim({ sha256: 'a'.repeat(64), owner: OWNER, name: 'spam', bytes: 4000, kind: 'mlp', model: 'mlp:64-16-2', config: SMALL_MLP, jobId: null, step: 1 }, now).record;
  assert.throws(() => c.deployments.deploy({ model: mlp, owner: OWNER, registry: null }), (e: unknown) => e instanceof NimbleError && e.status === 400 && /MLP classifier .*never generates text/.test(e.message));
  assert.throws(() => c.deployments.deploy({ model, owner: OWNER, registry: null, stages: 5 }), (e: unknown) => e instanceof NimbleError && e.status === 400 && /has 4 parts; it cannot be cut into 5 stages/.test(e.message));
  assert.equal(state.deployments.list().length, 0);
});

test('deployments and miners’ settings survive a reopen of the state file', async () => {
  const a = joinMiner('a', 'inference');
  const d = c.deployments.deploy({ model, owner: OWNER, registry: { chainId: 31337, address: '0x' + '1'.repeat(40), modelId: 3 }, replicas: 1 });
  beat(a, serving(beat(a)!));
  state.deployments.setRegistryDeployed(d.id, true);
  await c.close();
  state.close();
  await open();
  assert.equal(state.db.versions().deployments, 1);
  const back = state.deployments.get(d.id)!;
  assert.deepEqual([back.status, back.registry, back.registryDeployed], ['serving', { chainId: 31337, address: '0x' + '1'.repeat(40), modelId: 3 }, true]);
  assert.equal(state.miners.get(a)!.serve, 'inference');
  assert.equal(beat(a)!.deploymentId, d.id);
  assert.deepEqual(beat(a)!.registry, { chainId: 31337, address: '0x' + '1'.repeat(40), modelId: 3 });
});
