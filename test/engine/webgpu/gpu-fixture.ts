// The set-up every WebGPU kernel test repeats: open SwiftShader (software
// 'only', so the test runs on machines without a GPU), skip with the reason
// when no device opens at all, and around the tests a WASM engine (2 threads)
// and the GPU kernels under test, closed afterwards so the process exits.
import { after, before } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { openGpu, type Gpu } from '../../../src/engine/webgpu/device.ts';

export interface GpuFixture<K> {
  /** false, or why there is no device (the tests' `skip` option) */
  skip: string | false;
  gpu(): Gpu;
  engine(): Engine;
  kernels(): K;
}

/** Opens the device now and registers before/after hooks; call at the top level of a test file. */
export async function gpuFixture<K extends { destroy(): void }>(name: string, create: (device: GPUDevice) => Promise<K>): Promise<GpuFixture<K>> {
  const opened = await openGpu({ software: 'only' });
  const skip = opened.gpu ? false : `no WebGPU device: ${opened.reason}`;
  if (skip) process.stderr.write(`webgpu ${name} tests skipped: ${skip}\n`);
  let engine: Engine | undefined;
  let kernels: K | undefined;
  before(async () => {
    engine = await Engine.create({ threads: 2 });
    if (opened.gpu) kernels = await create(opened.gpu.device);
  });
  after(async () => {
    await engine?.close();
    kernels?.destroy();
    await opened.gpu?.close();
  });
  return { skip, gpu: (): Gpu => opened.gpu!, engine: (): Engine => engine!, kernels: (): K => kernels! };
}
