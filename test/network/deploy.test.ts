// Deploying a published model end to end: a real orchestrator process on its
// local anvil, three real miner processes (one serving inference only, one
// both, one training only) signing with wallets in the orchestrator's data
// dir, whose chain they read, and nbcli processes of the model's owner. A
// gpt-micro file is published, a stranger's deploy is refused, the owner
// deploys it on 2 stages; each serving miner downloads the file from the
// model store, checks it against the ModelRegistry on chain and serves its
// stage; GET /models shows the stages and miners; the registry's deployed
// flag is set; the training-only miner is never given a stage; undeploy lets
// the miners go and clears the flag.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());

test('the owner deploys a published GPT on 2 stages: miners that serve inference download it, check it on chain and serve it; undeploy lets them go', { timeout: 90_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'deploy-test';
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const dev = saveWallet(home, 'dev', generatePrivateKey(), 'deploy-test', 'light');
  saveWallet(home, 'eve', generatePrivateKey(), 'deploy-test', 'light');
  for (const n of ['a', 'b', 't']) saveWallet(home, `w-${n}`, generatePrivateKey(), 'deploy-test', 'light');
  // the miners share the orchestrator's data dir: its chain node and deployment, which they check models against
  const [a, b, t] = await Promise.all(
    (['inference', 'both', 'training'] as const).map((serve, i) => {
      const name = ['a', 'b', 't'][i];
      return cluster.startMiner(name, ['--data-dir', home, '--wallet.name', `w-${name}`, '--serve', serve]);
    }),
  );
  const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

  const bytes = wholeModelBytes(41, 500);
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, bytes);
  const published = await nbcli('model', 'publish', '--file', file, '--name', 'moby-micro', '--wallet.name', 'dev');
  assert.equal(published.code, 0, published.stderr);

  const stranger = await nbcli('model', 'deploy', 'moby-micro', '--stages', '2', '--wallet.name', 'eve');
  assert.equal(stranger.code, 1);
  assert.match(stranger.stderr, new RegExp(`is ${dev.address}'s: only its owner may deploy it`));

  const deployed = await nbcli('model', 'deploy', 'moby-micro', '--stages', '2', '--wallet.name', 'dev', '--wait', '--timeout', '40');
  assert.equal(deployed.code, 0, deployed.stderr);
  const d = deployed.out.find((o) => o.event === 'deployed')!.deployment as DeploymentView;
  assert.equal(d.status, 'serving');

  // GET /models: the deployment, its 2 stages, one miner each, serving weights checked on chain
  const models = new ModelClient(new OrchestratorClient(cluster.url));
  const view = async (): Promise<DeploymentView> => (await models.get(sha256)).deployment!;
  let v = await view();
  for (let i = 0; i < 50 && v.registry?.deployed !== true; i++) {
    await new Promise((r) => setTimeout(r, 200));
    v = await view();
  }
  assert.equal(v.id, d.id);
  assert.deepEqual(v.stages.map((s) => s.parts), [[0, 3], [3, 4]]);
  assert.deepEqual(v.stages.map((s) => s.miners.length), [1, 1]);
  assert.deepEqual(v.stages.flatMap((s) => s.miners.map((m) => m.name)).sort(), ['a', 'b'], 'the training-only miner holds no stage');
  for (const m of v.stages.flatMap((s) => s.miners)) assert.deepEqual([m.state, m.verifiedBy, m.sha256], ['serving', 'chain', sha256]);
  assert.equal(v.registry?.deployed, true, 'the registry flag is set once it serves');
  for (const p of [a, b]) assert.ok(p.lines.some((l) => l.includes('serving stage') && l.includes('checked against ModelRegistry #0')), p.lines.slice(-10).join('\n'));
  assert.ok(!t.lines.some((l) => l.includes('deployment')), 'the training-only miner was never given a deployment');
  const miners = await cluster.api.miners();
  assert.deepEqual(miners.map((m) => [m.name, m.serve]).sort(), [['a', 'inference'], ['b', 'both'], ['t', 'training']]);

  // model show and model list show it
  const shown = await nbcli('model', 'show', 'moby-micro');
  assert.equal(shown.code, 0, shown.stderr);
  assert.equal(((shown.out[0].stored as Record<string, unknown>).deployment as DeploymentView).status, 'serving');
  const listed = await nbcli('model', 'list');
  assert.equal(listed.code, 0, listed.stderr);
  assert.equal(((listed.out[0] as unknown as Record<string, unknown>[])[0].deployment as DeploymentView).id, d.id);

  // undeploy: the miners let go, the registry flag is cleared
  const off = await nbcli('model', 'undeploy', 'moby-micro', '--wallet.name', 'dev');
  assert.equal(off.code, 0, off.stderr);
  assert.equal((off.out.find((o) => o.event === 'undeployed')!.deployment as DeploymentView).status, 'undeployed');
  for (const p of [a, b]) await p.waitFor((o) => o.event === 'log' && String(o.message).includes(`deployment ${d.id}: let go of stage`), 10_000);
  for (let i = 0; i < 50 && v.registry?.deployed !== false; i++) {
    await new Promise((r) => setTimeout(r, 200));
    v = await view();
  }
  assert.deepEqual([v.status, v.undeployReason, v.registry?.deployed], ['undeployed', 'undeployed by its owner', false]);
  assert.deepEqual(v.stages.map((s) => s.miners), [[], []]);
});
