// The client reads GET /miners from orchestrators of every version: one from
// before the WebGPU backend sends no backend, adapter or softwareAdapter.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Type } from '@sinclair/typebox';
import { MinerListWire, minersFromWire } from '../../src/api/client.ts';
import { MinerView } from '../../src/api/schemas.ts';
import { parse } from '../../src/protocol/messages.ts';

const older = {
  id: '0x' + '1'.repeat(40),
  name: 'alpha',
  url: 'http://127.0.0.1:4000',
  gflops: 30,
  threads: 2,
  memoryBytes: 4e9,
  bandwidthMbps: 100,
  joinedAt: 1,
  lastSeen: 2,
  alive: true,
};

test("a miner list without the backend fields (an older orchestrator's) reads as WASM miners; today's list is kept as it is", () => {
  const miners = minersFromWire(parse(MinerListWire, [older], 'miner list'));
  assert.deepEqual(miners, [{ ...older, backend: 'wasm', adapter: null, softwareAdapter: false }]);
  parse(Type.Array(MinerView), miners, 'miner list');
  const today = { ...older, backend: 'webgpu', adapter: 'swiftshader', softwareAdapter: true };
  assert.deepEqual(minersFromWire(parse(MinerListWire, [today], 'miner list')), [today]);
});

test('a miner list with a backend that is not one is still refused', () => {
  assert.throws(() => parse(MinerListWire, [{ ...older, backend: 'cuda' }], 'miner list'), /invalid miner list: \/0\/backend/);
  assert.throws(() => parse(MinerListWire, [{ ...older, gflops: 'fast' }], 'miner list'), /invalid miner list: \/0\/gflops/);
});
