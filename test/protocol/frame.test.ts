import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { decodeFrame, encodeFrame, readFrameHeader, type FrameExpect } from '../../src/protocol/frame.ts';
import { asNimbleError, FrameError, type FrameErrorCode } from '../../src/protocol/errors.ts';
import { CODECS } from '../../src/protocol/codec.ts';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';

function sample(n: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * (1 + (i % 7)));
}

/** Builds a frame from any header object and payload bytes (checksum fixed up unless given). */
function craft(header: Record<string, unknown>, payload: Uint8Array, opts: { version?: number; sha?: string } = {}): Uint8Array {
  const h = { sha256: opts.sha ?? createHash('sha256').update(payload).digest('hex'), ...header };
  const json = Buffer.from(JSON.stringify(h));
  const out = new Uint8Array(12 + json.length + payload.length);
  out.set(Buffer.from('NIMF'), 0);
  out[4] = opts.version ?? 1;
  new DataView(out.buffer).setUint32(8, json.length, true);
  out.set(json, 12);
  out.set(payload, 12 + json.length);
  return out;
}

function f32Bytes(values: number[]): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

function expectCode(fn: () => unknown, code: FrameErrorCode): FrameError {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof FrameError, `expected FrameError ${code}, got ${String(caught)}`);
  assert.equal(caught.code, code, caught.message);
  assert.ok(caught.message.length > 10);
  return caught;
}

test('round trip of every codec keeps shape, codec, meta and values within the codec bound', () => {
  const x = sample(6 * 50);
  const meta = { run: 'run-1', stage: 2, microbatch: 17, replica: null, tags: ['a'] };
  for (const codec of CODECS) {
    const frame = encodeFrame(x, [6, 50], codec, meta);
    assert.equal((12 + new DataView(frame.buffer).getUint32(8, true)) % 8, 0, 'payload 8-aligned');
    const d = decodeFrame(frame);
    assert.deepEqual(d.shape, [6, 50]);
    assert.equal(d.codec, codec);
    assert.deepEqual(d.meta, meta);
    const worst = Math.max(...x.map((v, i) => Math.abs(v - d.data[i])));
    const bound = { f32: 0, f16: 7 * 2 ** -11, 'int8-row': 7 / 127 / 2 + 1e-6, 'int8-block': 7 / 127 / 2 + 1e-6 }[codec];
    assert.ok(worst <= bound, `${codec}: error ${worst} > ${bound}`);
  }
});

test('payload sizes: f32 4n, f16 2n, int8-row 4*rows + n, int8-block 4*blocks + n', () => {
  const x = sample(1000);
  const sizes = CODECS.map((c) => readFrameHeader(encodeFrame(x, [10, 100], c, undefined, { blockSize: 128 })).header.byteLength);
  assert.deepEqual(sizes, [4000, 2000, 40 + 1000, 8 * 4 + 1000]);
});

test('scalars, empty tensors and int8-block with error feedback', () => {
  assert.deepEqual([...decodeFrame(encodeFrame(new Float32Array([3.5]), [], 'int8-row')).data], [3.5]);
  const empty = decodeFrame(encodeFrame(new Float32Array(0), [4, 0], 'int8-row'));
  assert.deepEqual(empty.shape, [4, 0]);
  assert.equal(empty.data.length, 0);
  const ef = new ErrorFeedback(1000, 64);
  const x = sample(1000);
  const d = decodeFrame(encodeFrame(x, [1000], 'int8-block', { kind: 'pseudoGradient' }, { errorFeedback: ef }));
  assert.equal(d.blockSize, 64);
  for (let i = 0; i < x.length; i++) assert.ok(Math.abs(x[i] - d.data[i] - ef.residual[i]) < 1e-5);
});

test('decodes a frame at an unaligned offset (e.g. a slice of a bigger Buffer)', () => {
  for (const codec of CODECS) {
    const frame = encodeFrame(sample(99), [3, 33], codec);
    const big = new Uint8Array(frame.length + 3);
    big.set(frame, 1);
    const d = decodeFrame(big.subarray(1, 1 + frame.length));
    assert.deepEqual(d.data, decodeFrame(frame).data);
  }
});

test('encode refuses NaN/Infinity, a shape that does not match, bad block size, big meta', () => {
  expectCode(() => encodeFrame(new Float32Array([1, NaN]), [2], 'f16'), 'non_finite');
  expectCode(() => encodeFrame(new Float32Array([1, Infinity]), [2], 'int8-row'), 'non_finite');
  expectCode(() => encodeFrame(new Float32Array(6), [2, 2], 'f32'), 'shape_mismatch');
  expectCode(() => encodeFrame(new Float32Array(6), [2, -3], 'f32'), 'bad_shape');
  expectCode(() => encodeFrame(new Float32Array(6), [6], 'int8-block', undefined, { blockSize: 0 }), 'bad_codec');
  expectCode(() => encodeFrame(new Float32Array(6), [6], 'f32', { big: 'x'.repeat(5000) }), 'too_large');
  expectCode(() => encodeFrame(new Float32Array(6), [6], 'bf16' as never), 'bad_codec');
});

test('every FrameError code from a crafted bad frame', () => {
  const good = encodeFrame(sample(12), [3, 4], 'f32', { run: 'r' });
  const header = { dtype: 'f32', codec: 'f32', shape: [2], byteLength: 8 };
  const ok = craft(header, f32Bytes([1, 2]));
  assert.deepEqual([...decodeFrame(ok).data], [1, 2], 'crafting helper makes valid frames');

  // size limits
  expectCode(() => decodeFrame(good, { maxBytes: good.length - 1 }), 'too_large');
  expectCode(() => decodeFrame(good, { maxElements: 11 }), 'too_large');
  expectCode(() => decodeFrame(craft({ ...header, meta: { x: 'y'.repeat(5000) } }, f32Bytes([1, 2]))), 'too_large');
  const hugeHeader = good.slice();
  new DataView(hugeHeader.buffer).setUint32(8, 1 << 30, true);
  expectCode(() => decodeFrame(hugeHeader), 'too_large');
  // prefix
  const magic = good.slice();
  magic[0] = 0x4f;
  expectCode(() => decodeFrame(magic), 'bad_magic');
  expectCode(() => decodeFrame(new TextEncoder().encode('{"hello":1}')), 'bad_magic');
  expectCode(() => decodeFrame(craft(header, f32Bytes([1, 2]), { version: 2 })), 'bad_version');
  // truncation at every stage
  expectCode(() => decodeFrame(good.subarray(0, 3)), 'truncated');
  expectCode(() => decodeFrame(good.subarray(0, 11)), 'truncated');
  expectCode(() => decodeFrame(good.subarray(0, 40)), 'truncated');
  expectCode(() => decodeFrame(good.subarray(0, good.length - 1)), 'truncated');
  // length
  const longer = new Uint8Array(good.length + 1);
  longer.set(good);
  expectCode(() => decodeFrame(longer), 'length_mismatch');
  expectCode(() => decodeFrame(craft({ ...header, byteLength: 12 }, f32Bytes([1, 2, 3]))), 'length_mismatch');
  // header
  const notJson = craft(header, f32Bytes([1, 2]));
  notJson[12] = 0x5b; // '[' instead of '{'
  expectCode(() => decodeFrame(notJson), 'bad_header');
  expectCode(() => decodeFrame(craft(header, f32Bytes([1, 2]), { sha: 'abc' })), 'bad_header');
  expectCode(() => decodeFrame(craft({ ...header, meta: [1, 2] }, f32Bytes([1, 2]))), 'bad_header');
  // shape
  expectCode(() => decodeFrame(craft({ ...header, shape: [1, 1, 1, 1, 1, 1, 1, 1, 2] }, f32Bytes([1, 2]))), 'bad_shape');
  expectCode(() => decodeFrame(craft({ ...header, shape: [2.5] }, f32Bytes([1, 2]))), 'bad_shape');
  expectCode(() => decodeFrame(craft({ ...header, shape: '2' }, f32Bytes([1, 2]))), 'bad_shape');
  expectCode(() => decodeFrame(good, { shape: [4, 3] }), 'shape_mismatch');
  expectCode(() => decodeFrame(good, { shape: [3, 4, 1] }), 'shape_mismatch');
  assert.deepEqual(decodeFrame(good, { shape: [-1, 4] }).shape, [3, 4], '-1 is a wildcard');
  // dtype and codec
  expectCode(() => decodeFrame(craft({ ...header, dtype: 'f64' }, f32Bytes([1, 2]))), 'bad_dtype');
  expectCode(() => decodeFrame(craft({ ...header, codec: 'zstd' }, f32Bytes([1, 2]))), 'bad_codec');
  expectCode(() => decodeFrame(good, { codecs: ['int8-row'] }), 'bad_codec');
  expectCode(() => decodeFrame(craft({ ...header, codec: 'int8-block', blockSize: 0, byteLength: 6 }, new Uint8Array(6))), 'bad_codec');
  // values
  expectCode(() => decodeFrame(craft(header, f32Bytes([1, NaN]))), 'non_finite');
  expectCode(() => decodeFrame(craft(header, f32Bytes([-Infinity, 2]))), 'non_finite');
  expectCode(() => decodeFrame(craft({ ...header, codec: 'f16', byteLength: 4 }, new Uint8Array(new Uint16Array([0x3c00, 0x7c00]).buffer))), 'non_finite');
  expectCode(() => decodeFrame(craft({ ...header, codec: 'f16', byteLength: 4 }, new Uint8Array(new Uint16Array([0x7e00, 0]).buffer))), 'non_finite');
  const int8 = (scale: number): Uint8Array => {
    const p = new Uint8Array(6);
    new DataView(p.buffer).setFloat32(0, scale, true);
    p[4] = 127;
    return craft({ ...header, codec: 'int8-row', byteLength: 6 }, p);
  };
  assert.ok(Math.abs(decodeFrame(int8(0.5)).data[0] - 63.5) < 1e-6);
  expectCode(() => decodeFrame(int8(NaN)), 'non_finite');
  expectCode(() => decodeFrame(int8(Infinity)), 'non_finite');
  expectCode(() => decodeFrame(int8(3e38)), 'non_finite'); // 127 * scale overflows float32
  expectCode(() => decodeFrame(int8(-1)), 'bad_scale');
  // checksum
  const flipped = good.slice();
  flipped[flipped.length - 1] ^= 1;
  expectCode(() => decodeFrame(flipped), 'checksum');
});

test('FrameError maps to HTTP 413 for too_large and 400 otherwise', () => {
  const good = encodeFrame(sample(4), [4], 'f32');
  const big = expectCode(() => decodeFrame(good, { maxBytes: 10 }), 'too_large');
  assert.equal(big.status, 413);
  assert.equal(expectCode(() => decodeFrame(good.subarray(0, 20)), 'truncated').status, 400);
  assert.equal(asNimbleError(new Error('x')).status, 500);
});

test('fuzz: random corruptions only ever raise FrameError', () => {
  const frames = CODECS.map((c) => encodeFrame(sample(64), [8, 8], c, { stage: 1 }));
  let seed = 7;
  const rand = (n: number): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  const expect: FrameExpect = { maxBytes: 1 << 20 };
  const codes = new Set<string>();
  for (let i = 0; i < 3000; i++) {
    const base = frames[i % frames.length];
    let f = base.slice();
    const kind = rand(3);
    if (kind === 0) f[rand(f.length)] ^= 1 << rand(8);
    else if (kind === 1) f = f.subarray(0, rand(f.length));
    else for (let k = 0; k < 4; k++) f[rand(f.length)] = rand(256);
    try {
      decodeFrame(f, expect);
    } catch (e) {
      assert.ok(e instanceof FrameError, `non-FrameError: ${String(e)}`);
      codes.add(e.code);
    }
  }
  assert.ok(codes.size >= 4, [...codes].join(','));
});
