// The store's bounds (src/orchestrator/blobs/store-budget.ts) on a real state:
// a full disk is refused up front (507 disk_full) before any byte is written,
// the global bound counts models and datasets together, the free allowance
// only unpaid, unpublished models, and a paid store passes it.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { StoreBudget } from '../../../src/orchestrator/blobs/store-budget.ts';
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
  const budget = new StoreBudget(state, null, { storeLimitBytes: 5_000, freeStoreBytes: 2_000, diskReserveBytes: 1_000, dir }, () => 1_000, async () => disk);
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
  assert.deepEqual([q.store.used, q.free.used, q.disk.free, q.price, q.payee], [1_500, 1_500, 1_500, '0', null]);
});
