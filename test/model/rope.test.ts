// The rotary embeddings' frequencies and cos/sin table against PyTorch's,
// computed the way Hugging Face transformers computes them for the default,
// linear and llama3 rope types (test/model/fixtures/rope-tables.json, written
// by scripts/reference/rope_tables.py with torch 1.13).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { RopeScaling } from '../../src/model/arch.ts';
import { createRopeTable, ropeCosSin, ropeInvFreq } from '../../src/model/rope.ts';

interface Case {
  name: string;
  headDim: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  invFreq: number[];
  positions: number[];
  cos: number[][];
  sin: number[][];
}
const fixture = JSON.parse(readFileSync(new URL('./fixtures/rope-tables.json', import.meta.url), 'utf8')) as { cases: Case[] };

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

test('inverse frequencies equal PyTorch float32 bit for bit: default, linear and llama3', () => {
  assert.deepEqual(fixture.cases.map((c) => c.ropeScaling?.kind ?? 'default'), ['default', 'default', 'default', 'linear', 'llama3', 'llama3']);
  for (const c of fixture.cases) {
    const inv = ropeInvFreq(c);
    assert.equal(inv.length, c.headDim / 2, c.name);
    assert.deepEqual(Array.from(inv), c.invFreq, c.name);
  }
});

test('llama3 scaling keeps short wavelengths, slows long ones by the factor, blends between', () => {
  const c = fixture.cases.find((x) => x.name === 'llama3.1')!;
  const plain = ropeInvFreq({ ...c, ropeScaling: null });
  const scaled = ropeInvFreq(c);
  const s = c.ropeScaling as Extract<RopeScaling, { kind: 'llama3' }>;
  let kept = 0, slowed = 0, blended = 0;
  plain.forEach((x, i) => {
    const wavelen = (2 * Math.PI) / x;
    if (wavelen < s.originalContextLength / s.highFreqFactor) {
      assert.equal(scaled[i], x);
      kept++;
    } else if (wavelen > s.originalContextLength / s.lowFreqFactor) {
      assert.equal(scaled[i], Math.fround(x / s.factor));
      slowed++;
    } else {
      assert.ok(scaled[i] < x && scaled[i] > x / s.factor, `pair ${i} blends`);
      blended++;
    }
  });
  assert.ok(kept > 0 && slowed > 0 && blended > 0, `${kept} kept, ${slowed} slowed, ${blended} blended`);
});

test('cos and sin of the float32 angles are within one float32 rounding of PyTorch', () => {
  for (const c of fixture.cases) {
    const D = c.headDim, half = D / 2;
    const table = ropeCosSin(ropeInvFreq(c), Math.max(...c.positions) + 1);
    c.positions.forEach((p, k) => {
      for (let i = 0; i < half; i++) {
        assert.ok(Math.abs(table[p * D + i] - c.cos[k][i]) <= 6e-8, `${c.name}: cos at position ${p}, pair ${i}`);
        assert.ok(Math.abs(table[p * D + half + i] - c.sin[k][i]) <= 6e-8, `${c.name}: sin at position ${p}, pair ${i}`);
      }
    });
  }
});

test('the engine table holds positions × headDim floats; bad shapes are refused', () => {
  const params = { headDim: 8, ropeTheta: 10000, ropeScaling: null };
  const t = createRopeTable(engine, params, 5);
  assert.deepEqual(t.tensor.shape, [5, 8]);
  assert.deepEqual(Array.from(t.tensor.data), Array.from(ropeCosSin(ropeInvFreq(params), 5)));
  assert.deepEqual(Array.from(t.tensor.data.subarray(0, 8)), [1, 1, 1, 1, 0, 0, 0, 0], 'position 0 does not turn');
  engine.free(t.tensor);
  assert.throws(() => ropeInvFreq({ ...params, headDim: 7 }), /even/);
  assert.throws(() => ropeInvFreq({ ...params, ropeTheta: 0 }), /ropeTheta/);
  assert.throws(() => createRopeTable(engine, params, 0), /positions/);
});
