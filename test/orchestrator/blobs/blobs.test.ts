// FsBlobStore: the BlobStore contract (./blob-store-cases.ts), and what is
// particular to a folder: the layout, temp files, corruption on disk.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { blobStoreContract, bytes, rejects, type TestContext } from './blob-store-cases.ts';

async function tempStore(t: TestContext): Promise<FsBlobStore> {
  const dir = await mkdtemp(join(tmpdir(), 'nimble-blobs-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return FsBlobStore.open(dir);
}

blobStoreContract('FsBlobStore', tempStore);

test('laid out as ab/cdef..., written through tmp/ and leaving nothing there', async (t) => {
  const store = await tempStore(t);
  const data = bytes('stage 0 weights');
  const id = await store.put(data);
  assert.ok(existsSync(join(store.dir, id.slice(0, 2), id.slice(2))));
  assert.deepEqual(await readdir(join(store.dir, 'tmp')), [], 'no temp files left');
  const empty = await store.put(new Uint8Array(0));
  assert.equal((await store.getRange(empty, 0, 10)).length, 0, 'a range of an empty blob is empty');
});

test('a corrupt file is detected on get, quarantined, and repaired by the next put', async (t) => {
  const store = await tempStore(t);
  const data = bytes('merged partition 3');
  const id = await store.put(data);
  const path = store.pathOf(id);
  const bad = await readFile(path);
  bad[0] ^= 0xff; // same size, flipped bits
  await writeFile(path, bad);
  const e = await rejects(store.get(id), 'corrupt');
  assert.equal(e.status, 500);
  assert.equal(await store.has(id), false, 'quarantined');
  assert.equal((await readdir(join(store.dir, 'corrupt'))).length, 1);
  await store.put(data);
  assert.deepEqual(await store.get(id), data);
});

test('open removes stale temp files but keeps fresh ones', async (t) => {
  const store = await tempStore(t);
  const { utimes } = await import('node:fs/promises');
  await writeFile(join(store.dir, 'tmp', 'old'), 'x');
  await writeFile(join(store.dir, 'tmp', 'new'), 'y');
  const old = new Date(Date.now() - 2 * 3600_000);
  await utimes(join(store.dir, 'tmp', 'old'), old, old);
  await FsBlobStore.open(store.dir);
  assert.deepEqual(await readdir(join(store.dir, 'tmp')), ['new']);
});
