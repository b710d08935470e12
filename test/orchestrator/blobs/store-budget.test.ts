// The store's bounds (src/orchestrator/blobs/store-budget.ts) on a real state:
// a full disk is refused up front (507 disk_full) before any byte is written,
// the global bound counts models and datasets together, the free allowance
// unpaid, unpublished models and unpaid datasets (each at least
// DATASET_MIN_BYTES), and a paid store passes it, on a paid network only.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DATASET_MIN_BYTES, StoreBudget, type StoragePayments } from '../../../src/orchestrator/blobs/store-budget.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

const OWNER = '0x00000000000000000000000000000000000000aa';
const refused = (code: string, status: number, re: RegExp) => (e: unknown) => e instanceof NimbleError && e.code === code && e.status === status && re.test(e.message);

test('disk, global bound and free allowance: each refused with its own error, before anything is written', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-store-budget-'));
  const state = OrchestratorState.open(join(dir, 'o.sqlite'));
  t.after(() => {
    state.close();
    rmSync(dir, { recursive: true, force: true });
  });
  let disk = 10_000;
  // the chain half, faked: a price of one wei a byte-day, any payment taken (the real check: test/network/storage.test.ts)
  const payments: StoragePayments = { payee: OWNER, price: (bytes, days) => BigInt(bytes * days), check: async () => {} };
  const budget = new StoreBudget(state, payments, { storeLimitBytes: 5_000, freeStoreBytes: 2_000, diskReserveBytes: 1_000, dir }, () => 1_000, async () => disk);
  await budget.admit(1_500, false);
  state.models.claim({ sha256: 'a'.repeat(64), owner: OWNER, name: 'a', bytes: 1_500, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: null, step: 0 }, 1);
  await assert.rejects(budget.admit(1_000, false), refused('payment_required', 402, /free store .* holds 1\.5 KiB|free store/));
  await budget.admit(1_000, true); // paid: past the free allowance
  state.datasets.add({ sha256: 'b'.repeat(64), owner: OWNER, bytes: 3_000, retentionMs: 1e9 }, 1);
  await assert.rejects(budget.admit(1_000, true), refused('store_full', 507, /--store-limit/));
  state.datasets.remove('b'.repeat(64), OWNER);
  disk = 1_500;
  await assert.rejects(budget.admit(1_000, true), refused('disk_full', 507, /reserve of .* \(--disk-reserve\)/));
  const q = await budget.quote(1_000, 2);
  assert.deepEqual([q.store.used, q.free.used, q.disk.free, q.price, q.payee], [1_500, 1_500, 1_500, '2000', OWNER]);
});

test('datasets share the free allowance with models, a tiny one counts as DATASET_MIN_BYTES, a paid one counts only in the global bound; an unpaid network takes no payment', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-store-budget-'));
  const state = OrchestratorState.open(join(dir, 'o.sqlite'));
  t.after(() => {
    state.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const free = 3 * DATASET_MIN_BYTES;
  const payments: StoragePayments = { payee: OWNER, price: (bytes, days) => BigInt(bytes * days), check: async () => {} };
  const paid = new StoreBudget(state, payments, { storeLimitBytes: 100 * DATASET_MIN_BYTES, freeStoreBytes: free }, () => 1_000);
  const unpaid = new StoreBudget(state, null, { storeLimitBytes: 100 * DATASET_MIN_BYTES, freeStoreBytes: free }, () => 1_000);
  state.models.claim({ sha256: 'a'.repeat(64), owner: OWNER, name: 'a', bytes: DATASET_MIN_BYTES, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: null, step: 0 }, 1);
  state.datasets.add({ sha256: 'b'.repeat(64), owner: OWNER, bytes: 10, retentionMs: 1e9 }, 1);
  assert.equal(paid.usage().free, 2 * DATASET_MIN_BYTES, 'the 10-byte dataset counts as DATASET_MIN_BYTES');
  await paid.admit(10, false, 'dataset');
  state.datasets.add({ sha256: 'c'.repeat(64), owner: OWNER, bytes: 10, retentionMs: 1e9 }, 1);
  await assert.rejects(paid.admit(10, false, 'dataset'), refused('payment_required', 402, /nbcli dataset upload PATH --keep-days N/));
  await assert.rejects(unpaid.admit(10, true, 'dataset'), refused('payment_required', 402, /retry once unpaid models and datasets expire/));
  await paid.admit(10, true, 'dataset');
  const until = await paid.pay(OWNER, 'dataset x', 10, 2, '0x' + '1'.repeat(64), 0);
  assert.equal(until, 1_000 + 2 * 86_400_000);
  state.datasets.keep('c'.repeat(64), OWNER, until);
  assert.equal(paid.usage().free, 2 * DATASET_MIN_BYTES, 'a paid dataset is not free');
  await assert.rejects(unpaid.pay(OWNER, 'dataset x', 10, 2, undefined, 0), refused('unpaid_network', 409, /cannot be paid for/));
});
