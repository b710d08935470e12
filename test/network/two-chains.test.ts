// Two local chains that look like one (issue 31): an orchestrator process pays
// on the anvil of its data dir A; the developer's nbcli processes run with
// another data dir B, which has an anvil of its own with the same chain id and
// the same contract addresses. With --chain-rpc of B's chain every command
// that spends for the orchestrator (job submit, wallet faucet, stake add,
// credit add, model publish) refuses with one line naming both chains, before
// anything is sent: no NIM moves on either chain, nothing is recorded. Without
// --chain-rpc they all act on the orchestrator's chain, which GET /chain names,
// and B's chain is never touched.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { CreditClient } from '../../src/api/credit-client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { ChainClient } from '../../src/chain/client.ts';
import { escrowTotalHeld } from '../../src/chain/escrow.ts';
import { listModels, modelOfSha256 } from '../../src/chain/registry.ts';
import { openChain, type ChainSession } from '../../src/chain/session.ts';
import { readStake } from '../../src/chain/staking.ts';
import { faucet, nimBalance } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
const PASSWORD = 'two-chains';
const devKey = generatePrivateKey();
const dev = privateKeyToAccount(devKey).address as Address;
const homeB = join(cluster.dir, 'dev');
let a: ChainSession; // the orchestrator's chain (its node, borrowed)
let b: ChainSession; // the developer's data dir's own chain, kept up for --chain-rpc
let aRpc = '';
const specFile = join(cluster.dir, 'job.json');
const modelFile = join(cluster.dir, 'micro.safetensors');
const modelBytes = wholeModelBytes(31, 100);
const sha256 = createHash('sha256').update(modelBytes).digest('hex');

const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], homeB);

/** What the developer holds on a chain: free NIM, stake, NIM held in escrows, models registered. */
async function holdings(c: ChainClient): Promise<[bigint, bigint, bigint, number]> {
  return [await nimBalance(c, dev), (await readStake(c, dev)).staked, await escrowTotalHeld(c), (await listModels(c)).length];
}

before(async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--check-rate', '0'], { chain: true });
  a = await openChain({ dataDir: join(cluster.dir, 'orch') });
  b = await openChain({ dataDir: homeB, persistent: true });
  saveWallet(homeB, 'dev', devKey, PASSWORD, 'light');
  await faucet(b.client, dev, parseEther('100')); // NIM on the developer's own chain
  aRpc = (await new OrchestratorClient(cluster.url).chain())!.rpcUrl!;
  writeFileSync(specFile, JSON.stringify({ name: 'two-chains', model: 'gpt-micro', data: 'moby-dick', training: { steps: 20, batchSize: 4, mergeEvery: 5 }, budget: '1' }));
  writeFileSync(modelFile, modelBytes);
});
after(async () => {
  await a?.close();
  await b?.close();
  await cluster.stopGracefully();
});

test('the chains look alike: the same chain id and JobEscrow address, another RPC', () => {
  assert.equal(a.client.chainId, b.client.chainId);
  assert.equal(a.client.deployment.jobEscrow, b.client.deployment.jobEscrow);
  assert.equal(aRpc, a.client.rpcUrl, 'GET /chain names the orchestrator\'s node');
  assert.notEqual(aRpc, b.client.rpcUrl);
});

test("with --chain-rpc of the data dir's own chain, every command that spends for the orchestrator refuses before sending anything, in one line naming both chains", { timeout: 120_000 }, async () => {
  const before = { a: await holdings(a.client), b: await holdings(b.client) };
  const bRpc = b.client.rpcUrl;
  const commands = [
    ['job', 'submit', specFile, '--wallet.name', 'dev'],
    ['wallet', 'faucet', '--wallet.name', 'dev', '--amount', '5'],
    ['stake', 'add', '--wallet.name', 'dev', '--amount', '1'],
    ['credit', 'add', '--wallet.name', 'dev', '--amount', '1'],
    ['model', 'publish', '--file', modelFile, '--name', 'two-chains', '--wallet.name', 'dev'],
  ];
  const runs = await Promise.all(commands.map((c) => nbcli(...c, '--chain-rpc', bRpc)));
  const hash = '0x[0-9a-f]{8}…[0-9a-f]{4}';
  const line = new RegExp(`^stderr: nbcli: this command's chain \\(rpc ${bRpc}, genesis ${hash}[^)]*\\) is not the orchestrator's \\(rpc ${aRpc}, genesis ${hash}[^)]*\\): pass --chain-rpc ${aRpc} or leave --chain-rpc \\(and \\$NIMBLE_CHAIN_RPC\\) out to use the orchestrator's$`);
  runs.forEach((r, i) => {
    assert.equal(r.code, 1, `${commands[i].slice(0, 2).join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, line, commands[i].slice(0, 2).join(' '));
  });
  assert.deepEqual({ a: await holdings(a.client), b: await holdings(b.client) }, before, 'no NIM moved on either chain, no model registered');
  assert.deepEqual(await new JobClient(new OrchestratorClient(cluster.url, { wallet: devKey })).list(dev), [], 'no job recorded');
  assert.equal((await new CreditClient(new OrchestratorClient(cluster.url, { wallet: devKey })).balance()).escrows.length, 0, 'no credit recorded');
});

test("without --chain-rpc, the commands of data dir B act on the orchestrator's chain: faucet, stake, credit, a job's escrow and a model, and B's chain is untouched", { timeout: 120_000 }, async () => {
  const onB = await holdings(b.client);
  const step = async (...args: string[]): Promise<void> => {
    const r = await nbcli(...args);
    assert.equal(r.code, 0, `${args.slice(0, 2).join(' ')}: ${r.stderr}`);
  };
  await step('wallet', 'faucet', '--wallet.name', 'dev', '--amount', '50');
  await step('stake', 'add', '--wallet.name', 'dev', '--amount', '5');
  await step('credit', 'add', '--wallet.name', 'dev', '--amount', '2');
  const submitted = await nbcli('job', 'submit', specFile, '--wallet.name', 'dev');
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;
  await step('model', 'publish', '--file', modelFile, '--name', 'two-chains', '--wallet.name', 'dev');

  const job = await new JobClient(new OrchestratorClient(cluster.url, { wallet: devKey })).get(id);
  assert.equal(job.payment?.budget, parseEther('1').toString(), 'the job was accepted with its escrow');
  assert.deepEqual(await holdings(a.client), [parseEther('42'), parseEther('5'), parseEther('3'), 1], "the orchestrator's chain: 50 minted, 5 staked, 2 + 1 escrowed, one model");
  assert.equal((await modelOfSha256(a.client, `0x${sha256}`))?.owner, dev);
  const balance = await nbcli('wallet', 'balance', '--wallet.name', 'dev');
  assert.equal(balance.out[0].free, '42', 'wallet balance --orchestrator reads the same chain');
  assert.deepEqual(await holdings(b.client), onB, "the data dir's own chain is untouched");
});
