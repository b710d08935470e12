// Datasets are paid for like models (issue 33, "Storage"), on real processes:
// an orchestrator on its local anvil with a small free store (--free-store
// 100KB, --store-limit 400KB), outsiders with throwaway keys uploading
// straight to POST /datasets, and nbcli for a developer who pays. The free
// store is the network's, shared with unpaid models, not per key: once one
// key's dataset holds it, every fresh key's dataset (a tiny one counts as 64
// KiB) and model is refused (402), and a payment that is not a real NIM
// transfer of the quote from the uploader does not help; the developer
// uploads paid (nbcli dataset upload --keep-days, a transfer of GET
// /storage/quote's price) past it, keeps the dataset longer (nbcli dataset
// keep), and a transaction pays for one keep only. An outsider can keep or
// delete only its own rows.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { DatasetClient } from '../../src/api/dataset-client.ts';
import type { DatasetView } from '../../src/api/datasets.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import { openChain } from '../../src/chain/session.ts';
import { faucet } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { packDataset } from '../../src/data/dataset.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { assertRefused } from '../helpers/refusals.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'dataset-storage-test';

test('datasets count in the network-wide free store with models: many fresh keys store no more than it for free; past it a dataset is stored paid, and kept longer paid', { timeout: 240_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--free-store', '100KB', '--store-limit', '400KB'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const devKey = generatePrivateKey();
  const dev = saveWallet(home, 'dev', devKey, PASSWORD, 'light');
  const nbcli = (...a: string[]) => cluster.nbcli([...a, '--orchestrator', cluster.url], home);
  const session = await openChain({ dataDir: home });
  try {
    await faucet(session.client, dev.address as Address, parseEther('10'));
  } finally {
    await session.close();
  }
  /** A text file of `n` bytes, its packed bytes and their sha256. */
  const text = (seed: string, n: number): { path: string; bytes: Uint8Array; sha256: string } => {
    const path = join(cluster.dir, `${seed}.txt`);
    writeFileSync(path, `${seed}: `.padEnd(n, `call me ishmael ${seed}. `).slice(0, n));
    const { bytes } = packDataset(path);
    return { path, bytes, sha256: createHash('sha256').update(bytes).digest('hex') };
  };
  const outsider = (): { datasets: DatasetClient; models: ModelClient } => {
    const api = new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() });
    return { datasets: new DatasetClient(api), models: new ModelClient(api) };
  };
  const stored = async (sha256: string, owner?: string): Promise<DatasetView | null> => {
    const res = await fetch(`${cluster.url}/datasets/${sha256}${owner ? `?owner=${owner}` : ''}`);
    return res.status === 404 ? null : ((await res.json()) as DatasetView);
  };

  // 1. one throwaway key's dataset takes the free store; ten fresh keys, each with a dataset of its own, are all refused
  const first = outsider();
  const a = text('junk-a', 40_000);
  assert.equal((await first.datasets.upload(a.bytes, a.sha256)).created, true);
  for (let i = 0; i < 10; i++) {
    const d = i === 0 ? text('tiny', 100) : text(`junk-${i}`, 30_000);
    await assertRefused(outsider().datasets.upload(d.bytes, d.sha256), 402, 'payment_required', /the network's free store \(97\.7 KiB for everyone together, --free-store\) holds 64\.0 KiB: 64\.0 KiB more are not free; pay to keep it: nbcli dataset upload PATH --keep-days N/);
    assert.equal(await stored(d.sha256), null, 'a refused upload stores nothing');
  }
  // models share the free store with datasets
  await assertRefused(outsider().models.storeFile(wholeModelBytes(71, 500), { name: 'junk-model', pricePer1kTokens: 0n }), 402, 'payment_required', /free store/);
  const list = (await (await fetch(`${cluster.url}/datasets`)).json()) as DatasetView[];
  assert.deepEqual(list.map((d) => d.sha256), [a.sha256], 'one dataset stored for free, whatever the number of keys');

  // 2. claiming to have paid does not pass: no transaction, or a transaction that is not a NIM transfer from the uploader
  const b = text('junk-b', 30_000);
  await assertRefused(outsider().datasets.upload(b.bytes, b.sha256, () => {}, { days: 1 }), 402, 'payment_required', /costs \d+ wei of NIM: transfer it to 0x[0-9a-fA-F]{40}/);
  await assertRefused(outsider().datasets.upload(b.bytes, b.sha256, () => {}, { days: 1, payment: `0x${'ab'.repeat(32)}` }), 402, 'payment_required', /is not a successful transaction/);
  assert.equal(await stored(b.sha256), null);

  // 3. the developer uploads paid past the free store: a NIM transfer of the quote, checked on chain
  const c = text('dev-c', 50_000);
  const up = await nbcli('dataset', 'upload', c.path, '--keep-days', '2', '--wallet.name', 'dev');
  assert.equal(up.code, 0, up.stderr);
  const event = up.out.find((o) => o.event === 'dataset')!;
  assert.equal(event.sha256, c.sha256);
  assert.match(String(event.payment), /^0x[0-9a-f]{64}$/);
  assert.ok(Number(event.paid) > 0, JSON.stringify(event));
  const paid = (await stored(c.sha256, dev.address))!;
  assert.ok(paid.keptUntil >= Date.now() + 2 * 86_400_000 - 60_000, `kept paid two days: ${JSON.stringify(paid)}`);
  // its transaction paid for that store once: another key cannot reuse it (not its transfer), nor can the developer for another upload
  await assertRefused(outsider().datasets.upload(b.bytes, b.sha256, () => {}, { days: 1, payment: String(event.payment) }), 402, 'payment_required', /moved 0(\.0+)? NIM from/);
  const devClient = new DatasetClient(new OrchestratorClient(cluster.url, { wallet: devKey }));
  await assertRefused(devClient.upload(b.bytes, b.sha256, () => {}, { days: 1, payment: String(event.payment) }), 409, 'conflict', /has paid for a keep already/);
  assert.equal(await stored(b.sha256), null);

  // 4. the free store still refuses fresh keys (a paid dataset is not free); the developer keeps its dataset longer, paid
  await assertRefused(outsider().datasets.upload(b.bytes, b.sha256), 402, 'payment_required', /free store/);
  const kept = await nbcli('dataset', 'keep', `sha256:${c.sha256}`, '--days', '3', '--wallet.name', 'dev');
  assert.equal(kept.code, 0, kept.stderr);
  assert.ok((await stored(c.sha256, dev.address))!.expiresAt >= paid.expiresAt + 3 * 86_400_000 - 1000, 'kept three days more');
  assert.ok(Number(kept.out.find((o) => o.event === 'kept')!.paid) > 0);

  // 5. an outsider keeps or deletes only its own rows
  await assertRefused(first.datasets.keep(c.sha256, 1), 404, 'not_found', /uploaded by/);
  await assertRefused(first.datasets.remove(c.sha256), 404, 'not_found', /uploaded by/);
  assert.ok(await stored(c.sha256, dev.address));
});
