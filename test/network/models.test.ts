// Publishing a model end to end: a real orchestrator process on its local
// anvil, and nbcli processes of a developer with a wallet. A whole-model file
// is published (stored in the model store, attested by the orchestrator,
// published on the ModelRegistry from the developer's wallet), listed, shown
// and downloaded, checked against the sha256 on chain. A file the
// orchestrator serves tampered with, or cut short, is refused and never left
// as the output; the same bytes cannot be published again by someone else.
// An MLP classifier's checkpoint is published the same way, and shown as one.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { mlpModelBytes, wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());

test('a model file is published with nbcli, listed, shown, downloaded and verified against the chain; a tampered or truncated download is refused; a classifier publishes too', { timeout: 120_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'model-test';
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  // the developer's commands share the orchestrator's data dir: its chain node and deployment, and the wallets
  const home = join(cluster.dir, 'orch');
  const devKey = generatePrivateKey();
  saveWallet(home, 'dev', devKey, 'model-test', 'light');
  saveWallet(home, 'eve', generatePrivateKey(), 'model-test', 'light');
  const dev = privateKeyToAccount(devKey).address;
  const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

  const bytes = wholeModelBytes(11, 300);
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, bytes);

  const published = await nbcli('model', 'publish', '--file', file, '--name', 'moby-micro', '--wallet.name', 'dev', '--price-per-1k-tokens', '0.5');
  assert.equal(published.code, 0, published.stderr);
  const p = published.out.find((o) => o.event === 'published')!;
  assert.equal(p.sha256, sha256);
  assert.equal(p.owner, dev);
  assert.equal(p.pricePer1kTokens, '0.5');

  const listed = await nbcli('model', 'list');
  assert.equal(listed.code, 0, listed.stderr);
  const list = listed.out[0] as unknown as Record<string, unknown>[];
  assert.deepEqual(list.map((m) => [m.id, m.name, m.owner, m.sha256, m.pricePer1kTokens]), [[p.id, 'moby-micro', dev, sha256, '0.5']]);

  const shown = await nbcli('model', 'show', 'moby-micro');
  assert.equal(shown.code, 0, shown.stderr);
  const stored = shown.out[0].stored as Record<string, unknown>;
  assert.equal(stored.bytes, bytes.length);
  assert.equal(stored.step, 300);
  assert.equal(stored.owner, dev);

  const out = join(cluster.dir, 'downloaded.safetensors');
  const downloaded = await nbcli('model', 'download', 'moby-micro', '--out', out);
  assert.equal(downloaded.code, 0, downloaded.stderr);
  assert.deepEqual(new Uint8Array(readFileSync(out)), bytes);

  // the orchestrator's copy tampered with (one byte, same size): refused against the chain's sha256, nothing left as the output
  const blob = join(home, 'orchestrator', 'blobs', sha256.slice(0, 2), sha256.slice(2));
  const tampered = Buffer.from(bytes);
  tampered[tampered.length - 3] ^= 0xff;
  writeFileSync(blob, tampered);
  const bad = join(cluster.dir, 'bad.safetensors');
  const refused = await nbcli('model', 'download', 'moby-micro', '--out', bad);
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, new RegExp(`file of model #0 'moby-micro' has sha256 [0-9a-f]{64}, not ${sha256} \\(the sha256 registered on chain\\); it was deleted`));
  assert.ok(!existsSync(bad) && !existsSync(`${bad}.part`), 'the tampered file is deleted');

  // cut short: refused (the part kept to resume), and once the orchestrator's copy is whole again the download resumes and verifies
  truncateSync(blob, 1000);
  const cut = await nbcli('model', 'download', 'moby-micro', '--out', bad);
  assert.equal(cut.code, 1);
  assert.match(cut.stderr, new RegExp(`stopped at 1000 of ${bytes.length} bytes`));
  assert.ok(!existsSync(bad), 'no output from a truncated download');
  writeFileSync(blob, bytes);
  const resumed = await nbcli('model', 'download', 'moby-micro', '--out', bad);
  assert.equal(resumed.code, 0, resumed.stderr);
  assert.equal(resumed.out.find((o) => o.event === 'downloaded')!.resumedFrom, 1000);
  assert.deepEqual(new Uint8Array(readFileSync(bad)), bytes);

  // the same bytes again, from another wallet: already published (and the store would not attest them for it)
  const copy = await nbcli('model', 'publish', '--file', file, '--name', 'mine-now', '--wallet.name', 'eve');
  assert.equal(copy.code, 1);
  assert.match(copy.stderr, /already published .* as #0 'moby-micro'/);

  // an MLP classifier's checkpoint: published, shown as a classifier, downloaded and verified against the chain
  const mlp = mlpModelBytes(5, 150);
  const mlpSha = createHash('sha256').update(mlp).digest('hex');
  const mlpFile = join(cluster.dir, 'spam.safetensors');
  writeFileSync(mlpFile, mlp);
  const pubMlp = await nbcli('model', 'publish', '--file', mlpFile, '--name', 'spam-mlp', '--wallet.name', 'dev');
  assert.equal(pubMlp.code, 0, pubMlp.stderr);
  const pm = pubMlp.out.find((o) => o.event === 'published')!;
  assert.deepEqual([pm.sha256, pm.kind, pm.model, pm.owner], [mlpSha, 'mlp', 'mlp:64-16-2', dev]);
  const showMlp = await nbcli('model', 'show', 'spam-mlp');
  assert.equal(showMlp.code, 0, showMlp.stderr);
  const sm = showMlp.out[0].stored as Record<string, unknown>;
  assert.deepEqual([sm.kind, sm.model, sm.config, sm.step], ['mlp', 'mlp:64-16-2', { inputs: 64, hidden: [16], classes: 2 }, 150]);
  const mlpOut = join(cluster.dir, 'spam-downloaded.safetensors');
  const gotMlp = await nbcli('model', 'download', 'spam-mlp', '--out', mlpOut);
  assert.equal(gotMlp.code, 0, gotMlp.stderr);
  assert.equal(gotMlp.out.find((o) => o.event === 'downloaded')!.sha256, mlpSha);
  assert.deepEqual(new Uint8Array(readFileSync(mlpOut)), mlp);
});
