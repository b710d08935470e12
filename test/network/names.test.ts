// A model's name is its first publisher's (issue 33, "Names and models"), on
// real processes: an orchestrator on its local anvil, two miners serving
// inference, nbcli for the owner and an attacker. The owner publishes and
// deploys `popular`; the attacker's publish of its own weights under that
// name is refused by the orchestrator (and, tried on chain with the
// orchestrator's key, by the ModelRegistry: NameTaken), so no deployment of
// the attacker's ever carries it. The owner publishes a second version under
// the name and deploys it too: `/v1/completions` with `model: popular` is
// served by the owner's newest live deployment (the same text as asking by
// its sha256, not the first version's).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { nameOwnerOf, publishModel } from '../../src/chain/registry.ts';
import { signerFor } from '../../src/chain/client.ts';
import { localOperatorAccount, openChain } from '../../src/chain/session.ts';
import { ChainTxError } from '../../src/chain/tx.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'names-test';

test("a name is its first publisher's: the attacker's model under it is refused, and /v1 serves the owner's newest deployment of it", { timeout: 180_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--check-rate', '0', '--inference-check-rate', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const dev = saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const eve = saveWallet(home, 'eve', generatePrivateKey(), PASSWORD, 'light');
  for (const n of ['a', 'b']) saveWallet(home, `w-${n}`, generatePrivateKey(), PASSWORD, 'light');
  const nbcli = (...a: string[]) => cluster.nbcli([...a, '--orchestrator', cluster.url], home);
  const file = (name: string, seed: number): { path: string; sha256: string } => {
    const bytes = wholeModelBytes(seed, 500);
    const path = join(cluster.dir, `${name}.safetensors`);
    writeFileSync(path, bytes);
    return { path, sha256: createHash('sha256').update(bytes).digest('hex') };
  };
  const v1 = file('v1', 51);
  const v2 = file('v2', 52);
  const evil = file('evil', 53);
  await Promise.all([
    ...['a', 'b'].map((n) => cluster.startMiner(n, ['--data-dir', home, '--wallet.name', `w-${n}`, '--serve', 'inference'])),
    nbcli('model', 'publish', '--file', v1.path, '--name', 'popular', '--wallet.name', 'dev').then((r) => assert.equal(r.code, 0, r.stderr)),
  ]);
  const first = await nbcli('model', 'deploy', v1.sha256, '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '40');
  assert.equal(first.code, 0, first.stderr);

  // the attacker: its own weights under the owner's name, at a price of its own
  const squat = await nbcli('model', 'publish', '--file', evil.path, '--name', 'popular', '--price-per-1k-tokens', '5', '--wallet.name', 'eve');
  assert.notEqual(squat.code, 0, 'the attacker cannot store a model under a taken name');
  assert.match(squat.stderr, new RegExp(`the model name 'popular' is ${dev.address}'s \\(the first to store a model under a name owns it\\): choose another name`));
  assert.ok(!((await (await fetch(`${cluster.url}/models`)).json()) as { sha256: string }[]).some((m) => m.sha256 === evil.sha256), 'nothing of the attacker was stored');
  // on chain, even with the orchestrator's own key, the registry refuses another owner under the name
  const session = await openChain({ dataDir: home });
  try {
    assert.equal((await nameOwnerOf(session.client, 'popular'))?.toLowerCase(), dev.address.toLowerCase());
    await assert.rejects(
      publishModel(session.client, signerFor(session.client, localOperatorAccount()), { checkpointSha256: `0x${evil.sha256}`, name: 'popular', metadataURI: '', owner: eve.address, pricePer1kTokens: 5n }),
      (err: unknown) => err instanceof ChainTxError && err.errorName === 'NameTaken',
    );
  } finally {
    await session.close();
  }

  // the owner's second version under the same name, deployed beside the first
  const again = await nbcli('model', 'publish', '--file', v2.path, '--name', 'popular', '--wallet.name', 'dev');
  assert.equal(again.code, 0, again.stderr);
  const second = await nbcli('model', 'deploy', v2.sha256, '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '40');
  assert.equal(second.code, 0, second.stderr);
  const live = ((await (await fetch(`${cluster.url}/deployments`)).json()) as DeploymentView[]).filter((d) => d.status !== 'undeployed');
  assert.deepEqual(live.map((d) => [d.name, d.owner.toLowerCase()]), [['popular', dev.address.toLowerCase()], ['popular', dev.address.toLowerCase()]]);

  const key = await nbcli('api-key', 'create', '--name', 'caller', '--wallet.name', 'dev');
  assert.equal(key.code, 0, key.stderr);
  const complete = async (model: string): Promise<string> => {
    const res = await fetch(`${cluster.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key.out[0].key as string}` },
      body: JSON.stringify({ model, prompt: 'Call me Ishmael. ', max_tokens: 24, temperature: 0, seed: 1 }),
    });
    const body = (await res.json()) as { choices?: { text: string }[] };
    assert.equal(res.status, 200, JSON.stringify(body));
    return body.choices![0].text;
  };
  const byName = await complete('popular');
  const newest = await complete(v2.sha256);
  const oldest = await complete(v1.sha256);
  assert.notEqual(newest, oldest, 'the two versions write different text');
  assert.equal(byName, newest, "the name is served by its owner's newest live deployment");
});
