// A miner learns its chain from the orchestrator it joins (GET /chain, signed
// with the network's key): real orchestrator, miner and nbcli processes, each
// with a data dir of its own, so the miner has no chain of its own. On a paid
// network its deployment stage is checked against the ModelRegistry of the
// orchestrator's chain and served. An orchestrator that names a chain its
// published RPC is not (--public-chain-rpc of another node) is refused by the
// miner with one line, at start and for the stage it is given, and
// `model deploy --wait` prints the miner's reason while it waits.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { localNodePaths } from '../../src/chain/node.ts';
import { openChain, type ChainSession } from '../../src/chain/session.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const PASSWORD = 'miner-chain';
const honest = new Cluster();
const liar = new Cluster();
let elsewhere: ChainSession | undefined;
after(async () => {
  await elsewhere?.close();
  await honest.stopGracefully();
  await liar.stopGracefully();
});

/** A developer with a wallet in a data dir of its own, and a model file to publish. */
function developer(cluster: Cluster, seed: number): { home: string; file: string; sha256: string } {
  const home = join(cluster.dir, 'dev');
  saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const bytes = wholeModelBytes(seed, 100);
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, bytes);
  return { home, file, sha256: createHash('sha256').update(bytes).digest('hex') };
}

test("a miner with a data dir of its own checks a deployed model on the orchestrator's chain and serves it", { timeout: 120_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await honest.startOrchestrator(['--min-stake', '0', '--check-rate', '0'], { chain: true });
  const rpc = (await new OrchestratorClient(honest.url).chain())!.rpcUrl!;
  const miner = await honest.startMiner('m', ['--serve', 'inference']);
  const { home, file, sha256 } = developer(honest, 51);
  const nbcli = (...args: string[]) => honest.nbcli([...args, '--orchestrator', honest.url], home);
  const published = await nbcli('model', 'publish', '--file', file, '--name', 'micro', '--wallet.name', 'dev');
  assert.equal(published.code, 0, published.stderr);
  const deployed = await nbcli('model', 'deploy', 'micro', '--wallet.name', 'dev', '--wait', '--timeout', '60');
  assert.equal(deployed.code, 0, deployed.stderr);
  assert.equal((deployed.out.find((o) => o.event === 'deployed')!.deployment as DeploymentView).status, 'serving');
  const d = (await new ModelClient(new OrchestratorClient(honest.url)).get(sha256)).deployment!;
  assert.deepEqual(d.stages.flatMap((s) => s.miners.map((m) => [m.name, m.state, m.verifiedBy])), [['m', 'serving', 'chain']]);
  const said = miner.lines.map((l) => (l.startsWith('{') ? String(JSON.parse(l).message) : l));
  assert.ok(said.some((l) => l.startsWith(`chain: deployed models are checked on the orchestrator's chain (rpc ${rpc}, chain 31337, genesis 0x`)), said.slice(-10).join('\n'));
  await honest.stopGracefully(); // its processes off the two cores before the next network starts
});

test("an orchestrator naming a chain its published RPC is not is refused by the miner, and model deploy --wait says the miner's reason", { timeout: 120_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  // another local node, with the same chain id and contract addresses: what the orchestrator publishes as its chain's RPC
  elsewhere = await openChain({ dataDir: join(liar.dir, 'elsewhere'), persistent: true });
  const lie = elsewhere.client.rpcUrl;
  await liar.startOrchestrator(['--min-stake', '0', '--check-rate', '0', '--public-chain-rpc', lie], { chain: true });
  const real = (JSON.parse(readFileSync(localNodePaths(join(liar.dir, 'orch')).node, 'utf8')) as { rpcUrl: string }).rpcUrl;
  const miner = await liar.startMiner('m', ['--serve', 'inference']);
  const refusal = `refused the orchestrator's chain: the orchestrator says it pays on rpc ${lie}, genesis 0x`;
  await miner.waitFor((o) => o.event === 'log' && String(o.message).startsWith(`chain: ${refusal}`), 20_000);

  const { home, file } = developer(liar, 52);
  const nbcli = (...args: string[]) => liar.nbcli([...args, '--orchestrator', liar.url], home);
  // a developer's command refuses it too, and goes on with --chain-rpc of the real node (the same chain as named)
  const refused = await nbcli('model', 'publish', '--file', file, '--name', 'micro', '--wallet.name', 'dev');
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, new RegExp(`the orchestrator says it pays on rpc ${lie}, genesis 0x[0-9a-f]{8}…[0-9a-f]{4}(, contracts' block 0x[0-9a-f]{8}…[0-9a-f]{4})?, and that RPC is another chain \\(genesis 0x`));
  // (two nodes started in the same second share a genesis; then the contracts' block tells them apart: src/chain/identity.ts)
  const published = await nbcli('model', 'publish', '--file', file, '--name', 'micro', '--wallet.name', 'dev', '--chain-rpc', real);
  assert.equal(published.code, 0, published.stderr);

  const deploy = await nbcli('model', 'deploy', 'micro', '--wallet.name', 'dev', '--wait', '--timeout', '10', '--chain-rpc', real);
  assert.equal(deploy.code, 1);
  const address = JSON.parse(miner.lines.find((l) => l.includes('"started"'))!).address as string;
  assert.ok(deploy.out.some((o) => o.event === 'deploying' && String(o.line).startsWith(`  refused by ${address}: ${refusal}`)), JSON.stringify(deploy.out));
  assert.match(deploy.stderr, /is not serving after 10 s: .*; refused by 0x[0-9a-fA-F]{40}: refused the orchestrator's chain/);
});
