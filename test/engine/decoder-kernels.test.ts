// The Llama-family kernels (assembly/decoder.ts, assembly/attention-gqa.ts):
// bitwise the same on 1 and 2 threads, and the KV-cache decode path (RoPE,
// store, attend) reproducing the full-sequence forward for every row, with
// sessions prefilled, then decoded one token at a time, interleaved.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { Tensor } from '../../src/engine/tensor.ts';
import * as D from '../../src/model/decoder-layers.ts';
import { createRopeTable, type RopeTable } from '../../src/model/rope.ts';
import { fillRandom } from '../helpers/gradcheck.ts';

let one: Engine;
let two: Engine;
const tables = new Map<Engine, RopeTable>();
before(async () => {
  one = await Engine.create({ threads: 1 });
  two = await Engine.create({ threads: 2 });
  for (const e of [one, two]) tables.set(e, createRopeTable(e, { headDim: 8, ropeTheta: 500000, ropeScaling: { kind: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalContextLength: 16 } }, 64));
});
after(async () => {
  await one.close();
  await two.close();
});

const bits = (a: Float32Array): Uint32Array => new Uint32Array(a.slice().buffer);

/** Runs `fn` on each engine with the same random inputs; returns every output it names, to compare bit for bit. */
function onBoth(fn: (e: Engine, rand: (n: number, seed: number, scale?: number) => Tensor) => Record<string, Tensor>): Record<string, Float32Array>[] {
  return [one, two].map((e) => {
    const made: Tensor[] = [];
    const rand = (n: number, seed: number, scale = 1): Tensor => {
      const t = e.tensor([n]);
      fillRandom(t.data, seed, scale);
      made.push(t);
      return t;
    };
    const outs = fn(e, rand);
    const r = Object.fromEntries(Object.entries(outs).map(([k, t]) => [k, t.data.slice()]));
    for (const t of made) e.free(t);
    return r;
  });
}

function sameBits(results: Record<string, Float32Array>[], what: string): void {
  const [a, b] = results;
  for (const key of Object.keys(a)) {
    assert.ok(a[key].every((v) => Number.isFinite(v)), `${what} ${key}: finite`);
    assert.deepEqual(bits(b[key]), bits(a[key]), `${what} ${key}: 1 and 2 threads`);
  }
}

test('rmsnorm, rope and swiglu are bitwise identical on 1 and 2 threads', () => {
  for (const [N, C] of [[1, 16], [7, 18], [33, 64]]) {
    sameBits(onBoth((e, rand) => {
      const x = rand(N * C, 1, 2), w = rand(C, 2), out = rand(N * C, 0), rstd = rand(N, 0);
      const dout = rand(N * C, 3), dx = rand(N * C, 4), dw = rand(C, 5);
      e.kernels.rmsnormForward(out.ptr, rstd.ptr, x.ptr, w.ptr, 1e-6, N, C);
      e.kernels.rmsnormBackwardInput(dx.ptr, dout.ptr, x.ptr, w.ptr, rstd.ptr, N, C);
      e.kernels.rmsnormBackwardParams(dw.ptr, dout.ptr, x.ptr, rstd.ptr, N, C);
      return { out, rstd, dx, dw };
    }), `rmsnorm ${N}×${C}`);
  }
  const s = { heads: 4, kvHeads: 2, headDim: 8 }, W = D.qkvWidth(s);
  for (const N of [1, 5, 31]) {
    sameBits(onBoth((e, rand) => {
      const qkv = rand(N * W, 6), g = rand(N * W, 7);
      const pos = e.int32(N);
      for (let r = 0; r < N; r++) pos.data[r] = (r * 7) % 64;
      const rows = { buffer: pos, offset: 0, stride: 1 };
      D.ropeForward(e.kernels, qkv, N, s, rows, tables.get(e)!);
      D.ropeBackward(e.kernels, g, N, s, rows, tables.get(e)!);
      e.free(pos);
      return { qkv, g };
    }), `rope ${N} rows`);
  }
  for (const [N, I] of [[1, 5], [3, 13], [9, 64]]) {
    sameBits(onBoth((e, rand) => {
      const inp = rand(N * 2 * I, 8, 4), out = rand(N * I, 0), dout = rand(N * I, 9), dinp = rand(N * 2 * I, 0);
      e.kernels.swigluForward(out.ptr, inp.ptr, N, I);
      e.kernels.swigluBackward(dinp.ptr, inp.ptr, dout.ptr, N, I);
      return { out, dinp };
    }), `swiglu ${N}×${I}`);
  }
});

test('grouped-query attention forward and backward are bitwise identical on 1 and 2 threads', () => {
  for (const s of [{ heads: 4, kvHeads: 2, headDim: 8 }, { heads: 4, kvHeads: 1, headDim: 12 }, { heads: 3, kvHeads: 3, headDim: 4 }]) {
    const W = D.qkvWidth(s), OW = s.heads * s.headDim;
    for (const [B, T] of [[1, 1], [1, 9], [3, 13]]) {
      sameBits(onBoth((e, rand) => {
        const qkv = rand(B * T * W, T), dout = rand(B * T * OW, T + 1);
        const out = rand(B * T * OW, 0), att = rand(B * s.heads * T * T, 0), dqkv = rand(B * T * W, 0);
        D.gqaAttentionForward(e.kernels, out, att, qkv, B, T, s);
        D.gqaAttentionBackward(e.kernels, dqkv, dout, qkv, att, B, T, s);
        return { out, att, dqkv };
      }), `gqa ${JSON.stringify(s)} B=${B} T=${T}`);
    }
  }
});

test('multi-head attention is the case kvHeads = heads: gqa kernels give attentionForward / attentionBackward', () => {
  const B = 2, T = 7, C = 16, NH = 2, s = { heads: NH, kvHeads: NH, headDim: C / NH };
  const e = two, k = e.kernels;
  const qkv = e.tensor([B * T * 3 * C]), dout = e.tensor([B * T * C]);
  fillRandom(qkv.data, 30);
  fillRandom(dout.data, 31);
  const run = (gqa: boolean): Float32Array[] => {
    const out = e.tensor([B * T * C]), att = e.tensor([B * NH * T * T]), dqkv = e.tensor([B * T * 3 * C]);
    if (gqa) {
      D.gqaAttentionForward(k, out, att, qkv, B, T, s);
      D.gqaAttentionBackward(k, dqkv, dout, qkv, att, B, T, s);
    } else {
      k.attentionForward(out.ptr, att.ptr, qkv.ptr, B, T, C, NH);
      k.attentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, C, NH);
    }
    return [out.data, att.data, dqkv.data];
  };
  const [a, b] = [run(true), run(false)];
  assert.deepEqual(bits(a[0]), bits(b[0]), 'out');
  assert.deepEqual(bits(a[1]), bits(b[1]), 'att');
  assert.deepEqual(bits(a[2]), bits(b[2]), 'dqkv');
});

/**
 * Sessions of the given lengths, prompts of `prompt` tokens (all at once),
 * then one token per session per step, interleaved; against the training
 * path on each whole session: RoPE at positions 0..T−1, gqaAttentionForward.
 */
function compareCached(e: Engine, s: D.HeadShape, lengths: number[], prompt: number, ctx: number): void {
  const k = e.kernels, rope = tables.get(e)!;
  const W = D.qkvWidth(s), OW = s.heads * s.headDim;
  const layers = 2, layer = D.gqaKvLayerOffsets(s, ctx, 1); // the second layer of each cache
  const sessions = lengths.map((T, i) => {
    const raw = e.tensor([T * W]);
    fillRandom(raw.data, 40 + i);
    const qkv = e.tensorFrom([T * W], raw.data);
    const positions = e.int32(T);
    D.ropeForward(k, qkv, T, s, D.sequencePositions(positions, 1, T), rope);
    e.free(positions);
    const out = e.tensor([T * OW]), att = e.tensor([s.heads * T * T]);
    D.gqaAttentionForward(k, out, att, qkv, 1, T, s);
    const cache = e.tensor([layers * D.gqaKvLayerFloats(s, ctx)]);
    return { T, raw, qkv, out, cache };
  });
  // calls: first every session's prompt, then one position of each session per call
  const calls: [number, number][][] = [lengths.flatMap((T, i) => Array.from({ length: Math.min(T, prompt) }, (_, t): [number, number] => [i, t]))];
  for (let t = prompt; t < Math.max(...lengths); t++) calls.push(lengths.flatMap((T, i): [number, number][] => (t < T ? [[i, t]] : [])));
  for (const call of calls) {
    const rows = call.length;
    const qkv = e.tensor([rows * W]), out = e.tensor([rows * OW]), table = e.int32(2 * rows);
    call.forEach(([i, t], r) => {
      qkv.data.set(sessions[i].raw.data.subarray(t * W, (t + 1) * W), r * W);
      table.data[2 * r] = sessions[i].cache.ptr;
      table.data[2 * r + 1] = t;
    });
    D.gqaAttentionCached(k, out, qkv, table, rows, layer, s, ctx, rope);
    call.forEach(([i, t], r) => {
      const want = sessions[i].out.data.subarray(t * OW, (t + 1) * OW), got = out.data.subarray(r * OW, (r + 1) * OW);
      for (let c = 0; c < OW; c++) assert.ok(Math.abs(got[c] - want[c]) <= 1e-6, `session ${i} position ${t}: within 1e-6`);
      assert.deepEqual(bits(got), bits(want), `threads ${e.threads}, ${JSON.stringify(s)}, session ${i} position ${t}: bit for bit`);
    });
    for (const x of [qkv, out, table]) e.free(x);
  }
  // the cache holds the RoPE'd keys channel-major and the values row-major, for kvHeads heads only
  const s0 = sessions[0], KD = s.kvHeads * s.headDim, Tp = (ctx + 3) & ~3, cache = s0.cache.data, base = layer.keys / 4;
  for (let t = 0; t < s0.T; t++) {
    for (let c = 0; c < KD; c++) {
      assert.equal(cache[base + c * Tp + t], s0.qkv.data[t * W + s.heads * s.headDim + c]);
      assert.equal(cache[layer.values / 4 + t * KD + c], s0.qkv.data[t * W + s.heads * s.headDim + KD + c]);
    }
  }
  assert.ok(cache.subarray(0, base).every((v) => v === 0), 'the first layer is untouched');
  for (const x of sessions) for (const t of [x.raw, x.qkv, x.out, x.cache]) e.free(t);
}

test('the cached decode path (RoPE, store, attend) equals the full-sequence forward, GQA kvHeads 2 and 1, 1 and 2 threads', () => {
  for (const e of [one, two]) {
    for (const s of [{ heads: 4, kvHeads: 2, headDim: 8 }, { heads: 4, kvHeads: 1, headDim: 8 }]) {
      compareCached(e, s, [1], 1, 1);
      compareCached(e, s, [9], 4, 12);
      compareCached(e, s, [13, 5, 30], 6, 33);
    }
  }
});

test('the cached path refuses positions outside the cache', () => {
  const e = one, s = { heads: 4, kvHeads: 2, headDim: 8 };
  const qkv = e.tensor([D.qkvWidth(s)]), out = e.tensor([s.heads * s.headDim]), cache = e.tensor([D.gqaKvLayerFloats(s, 8)]);
  const table = e.int32(2);
  table.data.set([cache.ptr, 8]);
  assert.throws(() => D.gqaAttentionCached(e.kernels, out, qkv, table, 1, D.gqaKvLayerOffsets(s, 8, 0), s, 8, tables.get(e)!), /position 8, outside the cache's 0\.\.7/);
});
