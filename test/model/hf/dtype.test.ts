// F16 and BF16 to and from f32 (src/model/hf/dtype.ts): reading is exact,
// writing rounds to nearest even as PyTorch does, specials are kept.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decodeFloats, encodeFloats, floatToBf16, floatToHalf, halfToFloat } from '../../../src/model/hf/dtype.ts';

const f32 = (v: number): number => Math.fround(v);

test('every F16 bit pattern reads to its value and writes back to itself', () => {
  for (let h = 0; h < 0x10000; h++) {
    const v = halfToFloat(h);
    if (Number.isNaN(v)) {
      assert.equal((h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0, true);
      continue;
    }
    assert.equal(floatToHalf(v), h, `0x${h.toString(16)}`);
  }
});

test('F16: rounding to nearest even, overflow to infinity, subnormals', () => {
  assert.equal(floatToHalf(1 + 2 ** -11), 0x3c00); // a tie: to the even 1.0
  assert.equal(floatToHalf(1 + 3 * 2 ** -11), 0x3c02); // a tie: to the even 1 + 2^-9
  assert.equal(floatToHalf(1 + 2 ** -11 + 2 ** -20), 0x3c01); // past the tie: up
  assert.equal(floatToHalf(65504), 0x7bff);
  assert.equal(floatToHalf(65520), 0x7c00); // rounds past the largest half
  assert.equal(floatToHalf(-1e9), 0xfc00);
  assert.equal(floatToHalf(2 ** -24), 0x0001);
  assert.equal(floatToHalf(2 ** -26), 0x0000);
  assert.equal(floatToHalf(-0), 0x8000);
  assert.ok(Number.isNaN(halfToFloat(floatToHalf(NaN))));
});

test('BF16: the upper half of an f32, rounded to nearest even', () => {
  assert.equal(floatToBf16(1), 0x3f80);
  assert.equal(floatToBf16(f32(1 + 2 ** -8)), 0x3f80); // a tie: to even
  assert.equal(floatToBf16(f32(1 + 3 * 2 ** -8)), 0x3f82); // a tie: to even
  assert.equal(floatToBf16(f32(1 + 2 ** -8 + 2 ** -12)), 0x3f81);
  assert.equal(floatToBf16(-2.5), 0xc020);
  assert.equal(floatToBf16(Infinity), 0x7f80);
  assert.equal(floatToBf16(3.4e38), 0x7f80); // rounds past the largest bf16
  assert.ok((floatToBf16(NaN) & 0x7f80) === 0x7f80 && (floatToBf16(NaN) & 0x7f) !== 0);
});

test('encode then decode is exact for values the type holds, and within half an ulp otherwise', () => {
  const values = new Float32Array([0, -0, 1, -2.5, 0.1, 3.14159, 1e-3, -65504, 1e-7]);
  for (const dtype of ['F32', 'F16', 'BF16'] as const) {
    const out = new Float32Array(values.length);
    decodeFloats(encodeFloats(values, dtype), dtype, out);
    const rel = dtype === 'F32' ? 0 : dtype === 'F16' ? 2 ** -11 : 2 ** -8;
    values.forEach((v, i) => assert.ok(Math.abs(out[i] - v) <= Math.abs(v) * rel + (dtype === 'F16' ? 2 ** -25 : 0), `${dtype} ${v} -> ${out[i]}`));
    const again = new Float32Array(values.length);
    decodeFloats(encodeFloats(out, dtype), dtype, again);
    assert.deepEqual(again, out);
  }
  assert.throws(() => decodeFloats(new Uint8Array(5), 'F16', new Float32Array(3)), /5 bytes are not 3 F16 values/);
});
