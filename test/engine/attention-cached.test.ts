// The KV-cache attention kernels (assembly/attention-cached.ts): storing the
// rows' keys and values, then attending over the cache, gives attentionForward's
// output bit for bit, for any row order, sessions interleaved, odd lengths, a
// context longer than the rows, and 1 or 2 threads.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { fillRandom } from '../helpers/gradcheck.ts';

let one: Engine;
let two: Engine;
before(async () => {
  one = await Engine.create({ threads: 1 });
  two = await Engine.create({ threads: 2 });
});
after(async () => {
  await one.close();
  await two.close();
});

const C = 16, NH = 2;

function pad4(n: number): number {
  return (n + 3) & ~3;
}

/**
 * Sessions of the given lengths: attentionForward on each alone, and the
 * cached kernels on all their rows interleaved (row r of session s at
 * position r) in one call, against caches of context `ctx`.
 */
function compare(engine: Engine, lengths: number[], ctx: number): void {
  const layerFloats = C * pad4(ctx) + ctx * C;
  const sessions = lengths.map((T, s) => {
    const qkv = engine.tensor([T * 3 * C]);
    fillRandom(qkv.data, 100 + s);
    const out = engine.tensor([T * C]);
    const att = engine.tensor([NH * T * T]);
    engine.kernels.attentionForward(out.ptr, att.ptr, qkv.ptr, 1, T, C, NH);
    const cache = engine.tensor([2 * layerFloats]);
    return { T, qkv, out, cache };
  });
  // rows interleaved: position 0 of every session, then position 1, …
  const order: [number, number][] = [];
  for (let t = 0; t < Math.max(...lengths); t++) sessions.forEach((s, i) => t < s.T && order.push([i, t]));
  const rows = order.length;
  const qkv = engine.tensor([rows * 3 * C]);
  const out = engine.tensor([rows * C]);
  const table = engine.int32(2 * rows);
  order.forEach(([i, t], r) => {
    const s = sessions[i];
    qkv.data.set(s.qkv.data.subarray(t * 3 * C, (t + 1) * 3 * C), r * 3 * C);
    table.data[2 * r] = s.cache.ptr;
    table.data[2 * r + 1] = t;
  });
  // the second layer of each cache, to check the offsets
  const keys = layerFloats * 4, values = keys + C * pad4(ctx) * 4;
  engine.kernels.kvCacheStore(qkv.ptr, table.ptr, rows, keys, values, C, ctx);
  engine.kernels.attentionCached(out.ptr, qkv.ptr, table.ptr, rows, keys, values, C, NH, ctx);
  order.forEach(([i, t], r) => {
    const want = sessions[i].out.data.subarray(t * C, (t + 1) * C);
    const got = out.data.subarray(r * C, (r + 1) * C);
    assert.deepEqual(new Uint32Array(got.slice().buffer), new Uint32Array(want.slice().buffer), `threads ${engine.threads}, session ${i} position ${t}`);
  });
  // the cache holds the keys (channel-major) and values of every position
  const s0 = sessions[0];
  const cache = s0.cache.data;
  for (let t = 0; t < s0.T; t++) {
    for (let c = 0; c < C; c++) {
      assert.equal(cache[layerFloats + c * pad4(ctx) + t], s0.qkv.data[t * 3 * C + C + c]);
      assert.equal(cache[layerFloats + C * pad4(ctx) + t * C + c], s0.qkv.data[t * 3 * C + 2 * C + c]);
    }
  }
  assert.deepEqual(Array.from(cache.subarray(0, layerFloats)).filter((v) => v !== 0), [], 'the first layer is untouched');
}

test('cached attention is attentionForward bit for bit, sessions interleaved, 1 and 2 threads', () => {
  for (const engine of [one, two]) {
    compare(engine, [1], 1);
    compare(engine, [5], 8);
    compare(engine, [13, 4, 30], 30);
    compare(engine, [7, 7], 33);
  }
});
