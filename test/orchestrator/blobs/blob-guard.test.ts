// The collector's delete racing a put of the same bytes
// (src/orchestrator/blobs/blob-guard.ts): the collector checks a blob's
// references, then deletes it; a developer storing the same bytes in between
// writes its row, sees the file still there and skips the write. Here the
// delete is held at the file system until the put has returned: the blob must
// still be there afterwards, for the row that names it.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { BlobGuard } from '../../../src/orchestrator/blobs/blob-guard.ts';
import { FsBlobStore, type BlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { Collector } from '../../../src/orchestrator/blobs/gc.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';

const OWNER = '0x00000000000000000000000000000000000000aa';

/** A folder store whose deletes wait for `release()` once they have been asked (`asked` resolves then). */
function heldDeletes(inner: FsBlobStore): { store: BlobStore; asked: Promise<void>; release: () => void } {
  let onAsked!: () => void;
  let release!: () => void;
  const asked = new Promise<void>((r) => (onAsked = r));
  const gate = new Promise<void>((r) => (release = r));
  const store: BlobStore = {
    put: (b) => inner.put(b),
    putFile: (p, id) => inner.putFile(p, id),
    get: (id) => inner.get(id),
    getRange: (id, s, e) => inner.getRange(id, s, e),
    size: (id) => inner.size(id),
    has: (id) => inner.has(id),
    list: (p) => inner.list(p),
    delete: async (id) => {
      onAsked();
      await gate;
      return inner.delete(id);
    },
  };
  return { store, asked, release };
}

async function setup(t: { after: (fn: () => void) => void }) {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-blob-guard-'));
  const state = OrchestratorState.open(join(dir, 'o.sqlite'));
  const fs = await FsBlobStore.open(join(dir, 'blobs'));
  t.after(() => {
    state.close();
    rmSync(dir, { recursive: true, force: true });
  });
  let now = 1_000_000;
  const held = heldDeletes(fs);
  // the one store every part writes through, as the orchestrator has it (../../../src/orchestrator/server.ts)
  const blobs = BlobGuard.of(held.store, () => now);
  const gc = new Collector(state, blobs, { everyMs: 1e12, blobGraceMs: 1000 }, { forgetRun: () => {}, forgetMiner: () => {} }, () => now, () => {});
  return { state, fs, blobs, gc, held, clock: () => now, advance: (ms: number) => (now += ms) };
}

test('a blob the collector is deleting, stored again with the same bytes meanwhile (row first, then put), is not lost', async (t) => {
  const { state, fs, blobs, gc, held, advance } = await setup(t);
  const bytes = new TextEncoder().encode('the same bytes, uploaded twice');
  const id = await fs.put(bytes); // stored long ago, its row since collected
  state.garbage.condemn([id], 0);
  advance(120_000);
  const pass = gc.collect();
  await held.asked; // the collector found no row naming it and is deleting it
  // a developer stores the same bytes: its row first, then the put
  state.datasets.add({ sha256: id, owner: OWNER, bytes: bytes.length, retentionMs: 86_400_000 }, 1);
  const put = blobs.put(bytes);
  held.release();
  await Promise.all([pass, put]);
  assert.ok(state.datasets.referencesBlob(id), 'the new row names the blob');
  assert.equal(await fs.has(id), true, 'the blob the new row names is still in the store');
  assert.deepEqual(await fs.get(id), bytes);
});

test('a condemned blob put again before the check (its row not written yet) is not deleted; condemned after that put and named by no row, it is', async (t) => {
  const { state, fs, blobs, gc, held, clock, advance } = await setup(t);
  held.release();
  const bytes = new TextEncoder().encode('put first, row afterwards');
  const id = await fs.put(bytes);
  state.garbage.condemn([id], 0);
  advance(2_000);
  await blobs.put(bytes); // put again after it was condemned: the row naming it may be on its way
  assert.equal((await gc.collect()).blobs, 0);
  assert.equal(await fs.has(id), true, 'a blob put since it was condemned is kept');
  advance(1);
  state.garbage.condemn([id], clock()); // condemned anew, after that put
  advance(120_000);
  assert.equal((await gc.collect()).blobs, 1);
  assert.equal(await fs.has(id), false, 'an old unnamed blob is collected');
});
