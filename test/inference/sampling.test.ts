// The sampler: deterministic given its seed, greedy at temperature 0 and at a
// tiny top_p, nucleus sampling keeps to the nucleus, frequencies follow the
// softmax; stop sequences end the output before them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { mulberry32 } from '../../src/model/init.ts';
import { argmax, Sampler, samplingOptions, stopAt, stopSequences } from '../../src/inference/sampling.ts';

function randomLogits(rows: number, V: number, seed: number, spread = 4): Float32Array[] {
  const rng = mulberry32(seed);
  return Array.from({ length: rows }, () => Float32Array.from({ length: V }, () => (rng() - 0.5) * spread));
}

test('the same seed gives the same tokens; another seed others', () => {
  const rows = randomLogits(200, 256, 1);
  const run = (seed: number, temperature = 0.9, topP = 0.95): number[] => {
    const s = new Sampler({ seed, temperature, topP });
    return rows.map((r) => s.next(r));
  };
  assert.deepEqual(run(7), run(7));
  assert.deepEqual(run(7, 1, 1), run(7, 1, 1));
  assert.notDeepEqual(run(7), run(8));
});

test('temperature 0 is greedy, and so is a tiny top_p at any temperature', () => {
  const rows = randomLogits(100, 256, 2);
  const greedy = rows.map((r) => argmax(r));
  for (const options of [{ temperature: 0 }, { temperature: 0, topP: 0.3 }, { topP: 1e-9 }, { temperature: 2, topP: 1e-9 }, { temperature: 0.5, topP: 1e-6 }]) {
    const s = new Sampler({ seed: 3, ...options });
    assert.deepEqual(rows.map((r) => s.next(r)), greedy, JSON.stringify(options));
    assert.equal(s.count, rows.length, 'one draw per token, greedy or not');
  }
  // ties go to the lower index
  assert.equal(argmax([1, 3, 3, 2]), 1);
  assert.equal(new Sampler({ topP: 1e-9 }).next([1, 3, 3, 2]), 1);
});

test('top_p samples only from the nucleus; frequencies follow the softmax', () => {
  // probabilities 0.5, 0.3, 0.15, 0.05
  const logits = [0.5, 0.3, 0.15, 0.05].map(Math.log);
  const count = (topP: number, n: number): number[] => {
    const s = new Sampler({ seed: 11, topP });
    const c = [0, 0, 0, 0];
    for (let i = 0; i < n; i++) c[s.next(logits)]++;
    return c;
  };
  const nucleus = count(0.7, 4000); // 0.5 + 0.3 reach 0.7: tokens 0 and 1, renormalised to 5/8 and 3/8
  assert.equal(nucleus[2] + nucleus[3], 0);
  assert.ok(Math.abs(nucleus[0] / 4000 - 5 / 8) < 0.03, `token 0: ${nucleus[0]}`);
  const all = count(1, 20000);
  [0.5, 0.3, 0.15, 0.05].forEach((p, i) => assert.ok(Math.abs(all[i] / 20000 - p) < 0.015, `token ${i}: ${all[i]}`));
  // temperature sharpens: at 0.25 token 0 dominates (0.5⁴ / Σp⁴ ≈ 0.87)
  const s = new Sampler({ seed: 5, temperature: 0.25 });
  let zeros = 0;
  for (let i = 0; i < 4000; i++) if (s.next(logits) === 0) zeros++;
  assert.ok(Math.abs(zeros / 4000 - 0.8655) < 0.03, `${zeros}`);
});

test('options are checked', () => {
  assert.deepEqual(samplingOptions(), { temperature: 1, topP: 1, seed: 0 });
  assert.throws(() => new Sampler({ temperature: -1 }), /temperature/);
  assert.throws(() => new Sampler({ temperature: NaN }), /temperature/);
  assert.throws(() => new Sampler({ topP: 0 }), /top_p/);
  assert.throws(() => new Sampler({ topP: 1.5 }), /top_p/);
  assert.throws(() => new Sampler({ seed: 1.5 }), /seed/);
});

test('stop sequences end the output before them', () => {
  const stops = stopSequences(['\n\n', 'END']);
  const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);
  assert.equal(stopAt(bytes('hello'), stops), -1);
  assert.equal(stopAt(bytes('hello\n\n'), stops), 5);
  assert.equal(stopAt(bytes('THE END'), stops), 4);
  assert.equal(stopAt(bytes('EN'), stops), -1);
  assert.throws(() => stopSequences(['']), /empty/);
});
