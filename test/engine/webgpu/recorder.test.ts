// The device's recorder (src/engine/webgpu/recorder.ts): kernels record into
// one command buffer, each dispatch with a parameter block of its own, and
// writes, reads and destroys keep program order. On SwiftShader.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createArray, readArray, uploadArray, writeArray } from '../../../src/engine/webgpu/buffers.ts';
import { GpuKernel, use } from '../../../src/engine/webgpu/program.ts';
import { recorderOf } from '../../../src/engine/webgpu/recorder.ts';
import { gpuFixture } from './gpu-fixture.ts';

interface Kernels {
  /** out[i] = value for i < n */
  fill: GpuKernel;
  /** out[i] = inp[i] · scale for i < n */
  scale: GpuKernel;
  destroy(): void;
}

const fx = await gpuFixture<Kernels>('recorder', async (device) => {
  const fill = await GpuKernel.create(device, {
    label: 'test fill',
    workgroupSize: 64,
    uints: ['n'],
    floats: ['value'],
    arrays: [{ name: 'out', write: true }],
    body: '  if (gid < p.n) { set_out(gid, p.value); }',
  });
  const scale = await GpuKernel.create(device, {
    label: 'test scale',
    workgroupSize: 64,
    uints: ['n'],
    floats: ['scale'],
    arrays: [{ name: 'inp' }, { name: 'out', write: true }],
    body: '  if (gid < p.n) { set_out(gid, inp(gid) * p.scale); }',
  });
  return { fill, scale, destroy: (): void => [fill, scale].forEach((k) => k.destroy()) };
});

test('one kernel called 300 times in one batch keeps each call\'s parameters (more calls than a uniform buffer of blocks holds), in one submission', { skip: fx.skip }, async () => {
  const device = fx.gpu().device;
  const { fill } = fx.kernels();
  const recorder = recorderOf(device);
  const out = createArray(device, 300 * 4);
  recorder.flush();
  const before = { ...recorder.counts };
  for (let k = 0; k < 300; k++) fill.run({ uints: { n: 4 }, floats: { value: k + 0.5 }, arrays: { out: use({ array: out, offset: 4 * k }, 4) }, groups: 1 });
  assert.deepEqual([recorder.counts.dispatches - before.dispatches, recorder.counts.submits - before.submits], [300, 0], 'recorded, not submitted');
  const got = await readArray(device, out);
  assert.equal(recorder.counts.submits - before.submits, 1, 'submitted once, by the readback');
  for (let k = 0; k < 300; k++) assert.deepEqual([...got.subarray(4 * k, 4 * k + 4)], [k + 0.5, k + 0.5, k + 0.5, k + 0.5], `call ${k}`);
  out.destroy();
  assert.deepEqual(fx.gpu().takeErrors(), []);
});

test('a write between two recorded kernels is seen by the second only; an array destroyed after a recorded use is used first', { skip: fx.skip }, async () => {
  const device = fx.gpu().device;
  const { scale } = fx.kernels();
  const n = 100;
  const x = uploadArray(device, new Float32Array(n).fill(1));
  const y = createArray(device, n), z = createArray(device, n);
  scale.run({ uints: { n }, floats: { scale: 2 }, arrays: { inp: use(x, n), out: use(y, n) }, groups: 2 });
  writeArray(device, x, new Float32Array(n).fill(10));
  scale.run({ uints: { n }, floats: { scale: 3 }, arrays: { inp: use(x, n), out: use(z, n) }, groups: 2 });
  // x goes while the second product is only recorded: the recorder submits it first
  x.destroy();
  assert.deepEqual([...new Set(await readArray(device, y))], [2], 'y from x before the write');
  assert.deepEqual([...new Set(await readArray(device, z))], [30], 'z from x after the write');
  for (const a of [y, z]) a.destroy();
  assert.deepEqual(fx.gpu().takeErrors(), []);
});
