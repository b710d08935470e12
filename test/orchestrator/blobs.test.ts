import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobError, FsBlobStore, blobId, type BlobErrorCode } from '../../src/orchestrator/blobs.ts';

async function tempStore(t: { after(fn: () => Promise<void>): void }): Promise<FsBlobStore> {
  const dir = await mkdtemp(join(tmpdir(), 'nimble-blobs-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return FsBlobStore.open(dir);
}

async function rejects(p: Promise<unknown>, code: BlobErrorCode): Promise<BlobError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  assert.ok(e instanceof BlobError, `expected BlobError ${code}, got ${String(e)}`);
  assert.equal(e.code, code, e.message);
  return e;
}

async function collect(it: AsyncIterable<string>): Promise<string[]> {
  const out: string[] = [];
  for await (const x of it) out.push(x);
  return out;
}

const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);

test('put/get/has/size: content-addressed, idempotent, laid out as ab/cdef...', async (t) => {
  const store = await tempStore(t);
  const data = bytes('stage 0 weights');
  const id = await store.put(data);
  assert.equal(id, blobId(data));
  assert.match(id, /^[0-9a-f]{64}$/);
  assert.equal(await store.put(data), id, 'same bytes, same id');
  assert.deepEqual(await store.get(id), data);
  assert.equal(await store.has(id), true);
  assert.equal(await store.size(id), data.length);
  assert.ok(existsSync(join(store.dir, id.slice(0, 2), id.slice(2))));
  assert.deepEqual(await readdir(join(store.dir, 'tmp')), [], 'no temp files left');
  const empty = await store.put(new Uint8Array(0));
  assert.equal((await store.get(empty)).length, 0);
  const missing = 'f'.repeat(64);
  assert.equal(await store.has(missing), false);
  assert.equal(await store.size(missing), undefined);
  const e = await rejects(store.get(missing), 'not_found');
  assert.equal(e.status, 404);
});

test('getRange returns [start, end) clamped to the size, and refuses bad ranges', async (t) => {
  const store = await tempStore(t);
  const data = new Uint8Array(100_000).map((_, i) => i % 251);
  const id = await store.put(data);
  assert.deepEqual(await store.getRange(id, 10, 20), data.subarray(10, 20));
  assert.deepEqual(await store.getRange(id, 99_990, 200_000), data.subarray(99_990));
  assert.equal((await store.getRange(id, 100_000, 100_000)).length, 0);
  await rejects(store.getRange(id, 100_001, 100_002), 'bad_range');
  await rejects(store.getRange(id, 5, 4), 'bad_range');
  const e = await rejects(store.getRange(id, -1, 4), 'bad_range');
  assert.equal(e.status, 416);
  await rejects(store.getRange('0'.repeat(64), 0, 1), 'not_found');
});

test('list by prefix (sorted) and delete', async (t) => {
  const store = await tempStore(t);
  const ids = await Promise.all(Array.from({ length: 40 }, (_, i) => store.put(bytes(`blob ${i}`))));
  const sorted = [...new Set(ids)].sort();
  assert.deepEqual(await collect(store.list()), sorted);
  for (const prefix of [sorted[0].slice(0, 1), sorted[3].slice(0, 2), sorted[5].slice(0, 3), sorted[7]]) {
    assert.deepEqual(await collect(store.list(prefix)), sorted.filter((id) => id.startsWith(prefix)), prefix);
  }
  await assert.rejects(collect(store.list('../')), BlobError);
  assert.equal(await store.delete(sorted[0]), true);
  assert.equal(await store.delete(sorted[0]), false);
  assert.equal(await store.has(sorted[0]), false);
  assert.deepEqual(await collect(store.list()), sorted.slice(1));
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

test('ids that are not 64 lowercase hex digits are refused (no path traversal)', async (t) => {
  const store = await tempStore(t);
  const attempts = ['../../etc/passwd', '..', '', 'A'.repeat(64), 'a'.repeat(63), 'a'.repeat(65), `${'a'.repeat(62)}/.`, `ab/${'c'.repeat(61)}`, 'a'.repeat(64) + '\0'];
  for (const id of attempts) {
    const e = await rejects(store.get(id), 'bad_id');
    assert.equal(e.status, 400);
    await rejects(store.getRange(id, 0, 1), 'bad_id');
    await rejects(store.has(id), 'bad_id');
    await rejects(store.delete(id), 'bad_id');
  }
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
