import { test } from 'node:test';
import assert from 'node:assert/strict';
import { F16_MAX, decodeF16, encodeF16, f16ToF32, f32ToF16 } from '../../src/protocol/fp16.ts';
import { mulberry32 } from '../../src/model/init.ts';

const rng = mulberry32;

test('every finite half round-trips exactly through float32', () => {
  for (let h = 0; h < 65536; h++) {
    if ((h & 0x7c00) === 0x7c00) continue;
    assert.equal(f32ToF16(f16ToF32(h)), h, `half 0x${h.toString(16)}`);
  }
});

test('known values, ties to even, subnormals, specials', () => {
  const cases: [number, number][] = [
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2, 0xc000],
    [0.1, 0x2e66],
    [F16_MAX, 0x7bff],
    [2 ** -14, 0x0400], // smallest normal
    [2 ** -24, 0x0001], // smallest subnormal
    [2 ** -25, 0x0000], // tie between 0 and 2^-24: even is 0
    [3 * 2 ** -25, 0x0002], // tie between 1 and 2 ulps: even is 2
    [1 + 2 ** -11, 0x3c00], // tie: even mantissa 0
    [1 + 3 * 2 ** -11, 0x3c02], // tie: even mantissa 2
    [65519, 0x7bff], // below the overflow threshold
    [Infinity, 0x7c00],
    [-Infinity, 0xfc00],
  ];
  for (const [x, h] of cases) assert.equal(f32ToF16(x), h, `${x}`);
  assert.equal(f32ToF16(NaN) & 0x7e00, 0x7e00);
});

test('finite values beyond the half range saturate to +-65504 and are counted', () => {
  const src = new Float32Array([65520, -65520, 1e10, -3.4e38, 1, Infinity]);
  const dst = new Uint16Array(src.length);
  assert.equal(encodeF16(src, dst), 4);
  assert.deepEqual([...dst], [0x7bff, 0xfbff, 0x7bff, 0xfbff, 0x3c00, 0x7c00]);
});

test('random values: correct rounding and relative error <= 2^-11 (normals), abs error <= 2^-25 (subnormals)', () => {
  const r = rng(1);
  const n = 200_000;
  const src = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const exp = -26 + r() * 42; // 2^-26 .. 2^16 (beyond 65504 some saturate)
    src[i] = (r() < 0.5 ? -1 : 1) * Math.min(2 ** exp, F16_MAX);
  }
  const halves = new Uint16Array(n);
  encodeF16(src, halves);
  const back = new Float32Array(n);
  decodeF16(halves, back);
  let maxRel = 0;
  let maxAbsSub = 0;
  for (let i = 0; i < n; i++) {
    const x = src[i];
    const err = Math.abs(x - back[i]);
    if (Math.abs(x) >= 2 ** -14) maxRel = Math.max(maxRel, err / Math.abs(x));
    else maxAbsSub = Math.max(maxAbsSub, err);
    // nearest: neither neighbour is closer
    const h = halves[i];
    assert.equal(f32ToF16(x), h, 'array and scalar paths agree');
    for (const nb of [h - 1, h + 1]) {
      if ((nb & 0x7fff) >= 0x7c00 || (nb & 0x7fff) === 0x7fff || nb < 0 || (nb ^ h) & 0x8000) continue;
      const d = Math.abs(x - f16ToF32(nb));
      assert.ok(d > err || (d === err && (h & 1) === 0), `0x${h.toString(16)} is nearest even for ${x}`);
    }
  }
  assert.ok(maxRel <= 2 ** -11, `max relative error ${maxRel}`);
  assert.ok(maxAbsSub <= 2 ** -25, `max subnormal abs error ${maxAbsSub}`);
});

test('encodeF16 / decodeF16 refuse mismatched lengths', () => {
  assert.throws(() => encodeF16(new Float32Array(3), new Uint16Array(2)), RangeError);
  assert.throws(() => decodeF16(new Uint16Array(3), new Float32Array(2)), RangeError);
});
