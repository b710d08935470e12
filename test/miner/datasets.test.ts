// A miner's uploaded datasets (src/miner/datasets.ts): downloaded once in the
// background, checked against their id, cached and checked again when read;
// bytes that do not match are never kept. And a miner never reads a path an
// assignment names: its stage refuses anything but a named corpus or a
// dataset it was given.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { datasetId } from '../../src/data/dataset.ts';
import { Engine } from '../../src/engine/engine.ts';
import { DatasetCache, needsDataset } from '../../src/miner/datasets.ts';
import { StageRunner } from '../../src/miner/stage-runner.ts';
import { gptConfig } from '../../src/model/config.ts';
import { splitEvenly } from '../../src/model/parts.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import type { StageAssignment } from '../../src/protocol/messages.ts';

let engine: Engine;
const dir = mkdtempSync(join(tmpdir(), 'nimble-miner-datasets-'));
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
  rmSync(dir, { recursive: true, force: true });
});

const bytes = new TextEncoder().encode('Call me Ishmael. '.repeat(100));
const id = datasetId(bytes);
const hex = id.slice(7);

function assignment(data: string, stage: number, stageCount: number): StageAssignment {
  const range = splitEvenly(gptConfig('gpt-micro'), stageCount)[stage];
  return { runId: 'r1', stage, stageCount, from: range.from, to: range.to, model: 'gpt-micro', data, batchSize: 2, seed: 7, round: 0, stateBlob: null, codec: 'f16', lr: 1e-2 };
}

test('a dataset is downloaded once in the background, checked, cached, and read back from the cache (checked again)', async () => {
  const fetched: string[] = [];
  const cache = new DatasetCache(join(dir, 'a'), async (h) => (fetched.push(h), bytes));
  assert.equal(cache.prepare(id), null, 'not ready at first: the download runs in the background');
  assert.equal(cache.prepare(id), null, 'one download at a time');
  await cache.settled();
  const corpus = cache.prepare(id)!;
  assert.ok(corpus);
  assert.equal(corpus.train.length + corpus.heldout.length, bytes.length);
  assert.deepEqual(fetched, [hex]);
  assert.deepEqual(new Uint8Array(readFileSync(cache.pathOf(id))), bytes);

  // another miner process on the same data dir: from the cache, no download
  const again = new DatasetCache(join(dir, 'a'), async () => assert.fail('no download: it is cached'));
  assert.equal((await again.load(id)).train.length, corpus.train.length);

  // a cache file that no longer matches is deleted and downloaded anew
  writeFileSync(cache.pathOf(id), 'tampered');
  const lines: string[] = [];
  const repaired = new DatasetCache(join(dir, 'a'), async () => bytes, (l) => lines.push(l));
  await repaired.load(id);
  assert.ok(lines.some((l) => /does not match its sha256; downloading it again/.test(l)), lines.join('\n'));
  assert.deepEqual(new Uint8Array(readFileSync(cache.pathOf(id))), bytes);
});

test('downloaded bytes that do not match the id are refused and not cached; a failed download is tried again later', async () => {
  const lines: string[] = [];
  let now = 0;
  let calls = 0;
  const cache = new DatasetCache(join(dir, 'b'), async () => (calls++, new TextEncoder().encode('something else')), (l) => lines.push(l), () => now);
  await assert.rejects(cache.load(id), (e: unknown) => e instanceof NimbleError && /hashes to sha256:.*; it was not kept/.test(e.message));
  assert.ok(!existsSync(cache.pathOf(id)));
  assert.equal(cache.prepare(id), null);
  await cache.settled();
  assert.equal(cache.prepare(id), null, 'not retried at once');
  await cache.settled();
  assert.equal(calls, 2);
  now += 10_000;
  cache.prepare(id);
  await cache.settled();
  assert.equal(calls, 3, 'retried after a pause');
  assert.ok(lines.some((l) => l.includes('was not kept')));
});

test('a miner never reads a path an assignment names (/etc/passwd): refused by the dataset cache and by the stage', () => {
  const cache = new DatasetCache(join(dir, 'c'), async () => assert.fail('nothing is fetched'));
  assert.throws(() => cache.prepare('/etc/passwd'), /not a dataset id: a miner loads named data sets or uploaded datasets \(sha256:…\), never a path/);
  assert.throws(() => cache.prepare('sha256:../../etc/passwd'), /not a dataset id/);
  assert.equal(needsDataset(assignment('/etc/passwd', 0, 1)), false);

  for (const data of ['/etc/passwd', 'moby-dick/../../etc/passwd', 'README.md']) {
    assert.throws(() => new StageRunner(engine, assignment(data, 0, 2), 2), (e: unknown) => e instanceof NimbleError && /never a path/.test(e.message), data);
    assert.throws(() => new StageRunner(engine, assignment(data, 1, 2), 2), /never a path/, `${data} (last stage)`);
  }
  // a dataset's stage needs its bytes, downloaded by the miner; a middle stage needs no data
  assert.throws(() => new StageRunner(engine, assignment(id, 0, 3), 2), /loaded from its downloaded bytes/);
  assert.ok(needsDataset(assignment(id, 0, 3)) && needsDataset(assignment(id, 2, 3)) && !needsDataset(assignment(id, 1, 3)));
  new StageRunner(engine, assignment(id, 1, 3), 2).dispose();
});

test('an edge stage given a downloaded dataset trains on it', async () => {
  const cache = new DatasetCache(join(dir, 'd'), async () => bytes);
  const corpus = await cache.load(id);
  const runner = new StageRunner(engine, assignment(id, 0, 1), 2, corpus);
  const { loss } = await runner.forwardBackwardLast(1, 0, null);
  assert.ok(Number.isFinite(loss) && loss > 0);
  runner.dispose();
  assert.equal(createHash('sha256').update(readFileSync(cache.pathOf(id))).digest('hex'), hex);
});
