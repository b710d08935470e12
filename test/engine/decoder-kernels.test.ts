// The Llama-family kernels (assembly/decoder.ts): bitwise the same on 1 and 2 threads.
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
