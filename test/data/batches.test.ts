import assert from 'node:assert/strict';
import { test } from 'node:test';
import { batchForShard } from '../../src/data/batches.ts';
import { HELDOUT_FRACTION, loadCorpus, mobyDickBytes, splitCorpus } from '../../src/data/corpus.ts';

test('Moby Dick loads from its npm package as bytes, last 10% held out', () => {
  const bytes = mobyDickBytes();
  assert.ok(bytes.length > 1_100_000, `${bytes.length} bytes`);
  const c = loadCorpus('moby-dick');
  assert.equal(c.train.length + c.heldout.length, bytes.length);
  assert.equal(c.train.length, Math.floor(bytes.length * (1 - HELDOUT_FRACTION)));
  assert.deepEqual(c.heldout.subarray(-20), bytes.subarray(-20));
  assert.match(new TextDecoder().decode(c.train), /Call me Ishmael/);
});

test('a batch is a function of (seed, shard): same inputs give the same batch', () => {
  const c = splitCorpus('t', new TextEncoder().encode('abcdefghijklmnopqrstuvwxyz'.repeat(50)));
  const a = batchForShard(c.train, 1, 7, 4, 16);
  const b = batchForShard(c.train, 1, 7, 4, 16);
  assert.deepEqual(a, b);
  assert.notDeepEqual(batchForShard(c.train, 1, 8, 4, 16).inputs, a.inputs);
  assert.notDeepEqual(batchForShard(c.train, 2, 7, 4, 16).inputs, a.inputs);
  // targets are the inputs shifted by one byte
  for (let r = 0; r < 4; r++) for (let t = 0; t + 1 < 16; t++) assert.equal(a.targets[r * 16 + t], a.inputs[r * 16 + t + 1]);
  assert.throws(() => batchForShard(c.train, 1, -1, 4, 16), /non-negative/);
  assert.throws(() => batchForShard(new Uint8Array(5), 1, 0, 1, 16), /shorter/);
});

test('an unknown data set name is refused', () => {
  assert.throws(() => loadCorpus('no-such-corpus'), /unknown data set/);
});
