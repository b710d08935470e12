// The model store is not free to flood (issue 33, "Storage"), on real
// processes: an orchestrator on its local anvil with a small store
// (--free-store 100KB, --store-limit 200KB, --model-retention 25s), outsiders
// with throwaway keys uploading straight to POST /models/file, and nbcli for
// a developer who pays. The free allowance is the network's, not per key: a
// second fresh key's upload is refused (402) while the first's model is
// kept; the developer stores paid (--keep-days, a NIM transfer of GET
// /storage/quote's price) past it, until the global bound refuses a store
// (507, and nbcli refuses before paying); the outsider's unpublished model is
// collected after its retention, after which the free allowance takes the
// second key's upload; the owner keeps a model longer (nbcli model keep) and
// deletes one (nbcli model rm), an outsider may do neither.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { ModelClient } from '../../src/api/model-client.ts';
import type { StorageQuoteView, StoredModelView } from '../../src/api/models.ts';
import { openChain } from '../../src/chain/session.ts';
import { faucet } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { assertRefused } from '../helpers/refusals.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'storage-test';

test('storing costs what does not multiply with keys: a free allowance per network, a global bound, a price per GB-day, retention, deletion', { timeout: 180_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--free-store', '100KB', '--store-limit', '200KB', '--model-retention', '25s'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const dev = saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const nbcli = (...a: string[]) => cluster.nbcli([...a, '--orchestrator', cluster.url], home);
  const session = await openChain({ dataDir: home });
  try {
    await faucet(session.client, dev.address as Address, parseEther('10'));
  } finally {
    await session.close();
  }
  const model = (seed: number): { bytes: Uint8Array; sha256: string; path: string } => {
    const bytes = wholeModelBytes(seed, 500);
    const path = join(cluster.dir, `m${seed}.safetensors`);
    writeFileSync(path, bytes);
    return { bytes, sha256: createHash('sha256').update(bytes).digest('hex'), path };
  };
  const [a, b, c, d, e] = [61, 62, 63, 64, 65].map(model);
  const outsider = () => new ModelClient(new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() }));
  const terms = (name: string) => ({ name, pricePer1kTokens: 0n });
  const stored = async (sha256: string): Promise<StoredModelView | null> => {
    const res = await fetch(`${cluster.url}/models/${sha256}`);
    return res.status === 404 ? null : ((await res.json()) as StoredModelView);
  };

  // 1. the free allowance is the network's: one throwaway key fills it, the next one's upload is refused
  const first = await outsider().storeFile(a.bytes, terms('junk-a'));
  assert.equal(first.model.sha256, a.sha256);
  const second = outsider();
  await assertRefused(second.storeFile(b.bytes, terms('junk-b')), 402, 'payment_required', /the network's free store \(100\.0 KiB|free store \([0-9.]+ (KiB|MiB) for everyone together, --free-store\) holds/);

  // 2. the quote: the price per GB-day, the payee, how full the store is
  const quote = (await (await fetch(`${cluster.url}/storage/quote?bytes=${c.bytes.length}&days=2`)).json()) as StorageQuoteView;
  assert.equal(quote.nimPerGbDay, 0.1);
  assert.ok(BigInt(quote.price) > 0n && quote.payee, JSON.stringify(quote));
  assert.deepEqual([quote.free.limit, quote.free.used, quote.store.limit], [100_000, a.bytes.length, 200_000]);
  await assertRefused(new ModelClient(new OrchestratorClient(cluster.url)).quote(0, 1), 400, 'invalid', /bytes/);

  // 3. the developer stores paid past the free allowance, until the global bound
  for (const [m, name] of [[c, 'dev-c'], [d, 'dev-d']] as const) {
    const r = await nbcli('model', 'publish', '--file', m.path, '--name', name, '--keep-days', '2', '--wallet.name', 'dev');
    assert.equal(r.code, 0, r.stderr);
  }
  const full = await nbcli('model', 'publish', '--file', e.path, '--name', 'dev-e', '--keep-days', '1', '--wallet.name', 'dev');
  assert.notEqual(full.code, 0);
  assert.match(full.stderr, /model and dataset store holds \d+ of its 200000 bytes: \d+ more do not fit \(nothing was paid\)/);
  await assertRefused(outsider().storeFile(e.bytes, terms('junk-e'), { days: 1, payment: `0x${'ab'.repeat(32)}` }), 507, 'store_full', /holds .* of its .* \(--store-limit\)/);

  // 4. the outsider's unpublished model is collected after its retention; then the free allowance takes the next upload
  const until = Date.now() + 60_000;
  while ((await stored(a.sha256)) && Date.now() < until) await new Promise((r) => setTimeout(r, 500));
  assert.equal(await stored(a.sha256), null, 'an unpublished, unpaid model is collected after --model-retention');
  assert.equal((await second.storeFile(b.bytes, terms('junk-b'))).model.sha256, b.sha256);
  assert.ok(await stored(c.sha256), 'a paid model stays');

  // 5. its owner keeps a model longer and deletes another; an outsider may do neither
  const before = (await stored(c.sha256))!.expiresAt!;
  const kept = await nbcli('model', 'keep', 'dev-c', '--days', '3', '--wallet.name', 'dev');
  assert.equal(kept.code, 0, kept.stderr);
  assert.ok((await stored(c.sha256))!.expiresAt! >= before + 3 * 86_400_000 - 1000, 'kept three days more');
  await assertRefused(second.keep(d.sha256, 1), 403, 'forbidden', /only its owner may keep it/);
  await assertRefused(second.remove(d.sha256), 403, 'forbidden', /only its owner may delete it/);
  const rm = await nbcli('model', 'rm', 'dev-d', '--wallet.name', 'dev');
  assert.equal(rm.code, 0, rm.stderr);
  assert.equal(await stored(d.sha256), null);
});
