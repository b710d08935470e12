import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Heap } from '../../src/engine/heap.ts';

test('allocations are aligned, zeroed, reused after release and merged', () => {
  const memory = new WebAssembly.Memory({ initial: 1, maximum: 100, shared: true });
  const heap = new Heap(memory, 100);
  const a = heap.alloc(10);
  const b = heap.alloc(1000);
  const c = heap.alloc(64);
  for (const p of [a, b, c]) assert.equal(p % 64, 0);
  assert.ok(a >= 100 && b >= a + 10 && c >= b + 1000);
  new Uint8Array(memory.buffer, b, 1000).fill(7);
  heap.release(b);
  const d = heap.alloc(500); // fits in b's hole
  assert.equal(d, b);
  assert.ok(new Uint8Array(memory.buffer, d, 500).every((x) => x === 0), 'reused memory is zeroed');
  heap.release(a);
  heap.release(d);
  const e = heap.alloc(1000 + 64); // a's and b's holes merged
  assert.equal(e, a);
  assert.throws(() => heap.release(12345), /unknown block/);
});

test('the memory grows on demand and earlier views stay valid', () => {
  const memory = new WebAssembly.Memory({ initial: 1, maximum: 1000, shared: true });
  const heap = new Heap(memory, 0);
  const p = heap.alloc(1000);
  const view = new Float32Array(memory.buffer, p, 250);
  view[3] = 1.5;
  heap.alloc(5 * 65536);
  assert.ok(memory.buffer.byteLength >= 6 * 65536);
  assert.equal(view[3], 1.5);
  assert.equal(new Float32Array(memory.buffer, p, 250)[3], 1.5);
  assert.ok(heap.stats().peak >= 5 * 65536);
});
