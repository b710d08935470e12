// Each stored model's ModelRegistry listing as the Models page shows it
// (src/orchestrator/dashboard/listings.ts): published or not, its id, its
// price per 1,000 tokens exact in wei and NIM, the deployed flag; read in
// the background (the ChainReadCache the stakes use), only for a sha256.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseEther } from 'viem';
import { ListingCache } from '../../../src/orchestrator/dashboard/listings.ts';

test('a published model shows its id, price and deployed flag; an unpublished one says so; a malformed key is never read; a failed read keeps the last listing', async () => {
  const reads: string[] = [];
  let fail = false;
  let now = 0;
  const published = 'ab'.repeat(32);
  const cache = new ListingCache(
    async (sha256) => {
      reads.push(sha256);
      if (fail) throw new Error('rpc down');
      return sha256 === published ? { id: 7n, pricePer1kTokens: parseEther('0.5'), deployed: true } : null;
    },
    { now: () => now, log: () => {} },
  );
  assert.equal(cache.get(published), null, 'nothing read yet: the section does not wait');
  assert.equal(cache.get('cd'.repeat(32)), null);
  assert.equal(cache.get('../etc'), null);
  await cache.idle();
  assert.deepEqual(reads.sort(), [published, 'cd'.repeat(32)].sort(), 'only sha256 keys are read');
  assert.deepEqual(cache.get(published), { published: true, modelId: '7', priceWei: '500000000000000000', price: '0.5', deployed: true });
  assert.deepEqual(cache.get('cd'.repeat(32)), { published: false });
  fail = true;
  now += 30_000;
  cache.get(published);
  await cache.idle();
  assert.equal(cache.get(published)?.published, true, 'the last listing is kept when a read fails');
  cache.close();
});
