// The memory a miner offers the planner (src/miner/hardware.ts): on WASM at
// most the 4 GiB a WebAssembly memory holds, whatever the host has; on a GPU
// what it was told of the GPU's memory, held to four times the adapter's
// largest storage binding (simulated limits here). With those offers, the
// planner places a stage larger than any WASM miner can hold on the WebGPU
// miner, and finds no plan with WASM miners alone.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { WASM_MEMORY_BYTES } from '../../src/engine/engine.ts';
import { planJob, type PoolMiner } from '../../src/jobs/plan.ts';
import { resolveJobSpec, validateJobSpec } from '../../src/jobs/spec.ts';
import { offeredMemory } from '../../src/miner/hardware.ts';

const GiB = 2 ** 30;

test('a WASM miner offers at most a WebAssembly memory; a WebGPU miner its GPU, held by the adapter binding limit', () => {
  assert.equal(WASM_MEMORY_BYTES, 4 * GiB);
  assert.equal(offeredMemory('wasm', { freeBytes: 64 * GiB }), 4 * GiB);
  assert.equal(offeredMemory('wasm', { freeBytes: 64 * GiB, capBytes: 2 * GiB }), 2 * GiB);
  assert.equal(offeredMemory('wasm', { freeBytes: 1.5 * GiB }), 1.5 * GiB);
  // a 12 GiB card whose adapter binds 2 GiB at most: weights up to 2 GiB, so stages up to 8 GiB
  assert.equal(offeredMemory('webgpu', { freeBytes: 64 * GiB, gpuBytes: 12 * GiB, maxBindingBytes: 2 * GiB }), 8 * GiB);
  assert.equal(offeredMemory('webgpu', { freeBytes: 64 * GiB, gpuBytes: 6 * GiB, maxBindingBytes: 4 * GiB }), 6 * GiB);
  // not told the GPU's memory: the free host memory, within the binding limit
  assert.equal(offeredMemory('webgpu', { freeBytes: 10 * GiB, maxBindingBytes: 4 * GiB }), 10 * GiB);
  assert.equal(offeredMemory('webgpu', { freeBytes: 64 * GiB, capBytes: 3 * GiB, gpuBytes: 24 * GiB, maxBindingBytes: 4 * GiB }), 3 * GiB);
});

test('the planner places a stage larger than a WASM miner can hold on a WebGPU miner', () => {
  // blocks of 5120 channels: 315 M parameters each, about 5 GB a part with gradients and AdamW's moments
  const job = resolveJobSpec(validateJobSpec({
    name: 'wide', model: { type: 'gpt', vocabSize: 256, contextLength: 64, channels: 5120, layers: 2, heads: 40 }, data: 'moby-dick',
    training: { steps: 100, batchSize: 1 },
  }));
  const host = { freeBytes: 64 * GiB };
  const wasm = (id: string): PoolMiner => ({ id, gflops: 200, memoryBytes: offeredMemory('wasm', host), bandwidthMbps: 1000 });
  const gpu = (id: string): PoolMiner => ({ id, gflops: 20_000, memoryBytes: offeredMemory('webgpu', { ...host, gpuBytes: 24 * GiB, maxBindingBytes: 4 * GiB }), bandwidthMbps: 1000 });

  const wasmOnly = planJob(job, [wasm('w1'), wasm('w2'), wasm('w3'), wasm('w4')]);
  assert.ok(wasmOnly.minPieceMemoryBytes > 4 * GiB, `a part needs ${wasmOnly.minPieceMemoryBytes} bytes`);
  assert.equal(wasmOnly.chosen?.assignment.length ?? 0, 0, 'no WASM miner holds a part');

  const mixed = planJob(job, [wasm('w1'), wasm('w2'), gpu('g1'), gpu('g2')]);
  assert.ok(mixed.chosen && mixed.chosen.assignment.length > 0, 'a plan on the WebGPU miners');
  for (const [i, s] of mixed.chosen.assignment.entries()) {
    assert.ok(s.memoryBytes > 4 * GiB, `stage ${i} needs ${s.memoryBytes} bytes`);
    assert.ok(s.miners.length > 0 && s.miners.every((m) => m.startsWith('g')), `stage ${i} on ${s.miners.join(', ')}`);
  }
  process.stderr.write(`${mixed.chosen.assignment.length} stage(s) of ${mixed.chosen.assignment.map((s) => (s.memoryBytes / GiB).toFixed(1)).join(', ')} GiB on ${mixed.chosen.assignment.map((s) => s.miners.join('+')).join(', ')}\n`);
});
