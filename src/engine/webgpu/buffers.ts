// Float32 arrays that live on the GPU: create, upload, and read back (the
// one slow, synchronising step: only where a test or a frame needs the values).
// A write or a read first submits the work recorded so far (recorder.ts), so
// the queue runs everything in program order.

import { recorderOf } from './recorder.ts';
import { BufferUsage, MAP_READ_MODE } from './usage.ts';

/** `length` floats in a GPU storage buffer. */
export class GpuArray {
  constructor(
    readonly buffer: GPUBuffer,
    readonly length: number,
    private readonly device: GPUDevice,
  ) {}

  /**
   * Frees the GPU memory rather than leaving it to the collector: once the
   * work recorded so far is submitted (a recorded use of a destroyed buffer
   * would fail), and once the queue has run what was submitted with it.
   */
  destroy(): void {
    recorderOf(this.device).flush();
    this.buffer.destroy();
  }
}

/** A zero-filled array of `length` floats (storage; copy source and destination). */
export function createArray(device: GPUDevice, length: number, label?: string): GpuArray {
  if (!Number.isInteger(length) || length < 0) throw new RangeError(`createArray: bad length ${length}`);
  // every array is bound as storage by some kernel: one past the adapter's limit would fail later, as a validation error far from its cause
  const limit = Math.min(device.limits.maxBufferSize, device.limits.maxStorageBufferBindingSize);
  if (length * 4 > limit) throw new RangeError(`${label ?? 'a GPU array'} needs ${length * 4} bytes; this adapter binds at most ${limit} bytes in one buffer`);
  // an empty binding is invalid: keep at least one float
  const buffer = device.createBuffer({
    label,
    size: Math.max(1, length) * 4,
    usage: BufferUsage.STORAGE | BufferUsage.COPY_SRC | BufferUsage.COPY_DST,
  });
  return new GpuArray(buffer, length, device);
}

/** A new GPU array holding a copy of `values`. */
export function uploadArray(device: GPUDevice, values: Float32Array, label?: string): GpuArray {
  const array = createArray(device, values.length, label);
  writeArray(device, array, values);
  return array;
}

/** Copies `values` into `array` from float `offset` on (queued before any later submit). */
export function writeArray(device: GPUDevice, array: GpuArray, values: Float32Array, offset = 0): void {
  if (offset < 0 || offset + values.length > array.length) {
    throw new RangeError(`writeArray: [${offset}, ${offset + values.length}) outside ${array.length} floats`);
  }
  if (values.length === 0) return;
  const recorder = recorderOf(device);
  recorder.flush();
  recorder.counts.bytesWritten += values.byteLength;
  if (!(values.buffer instanceof SharedArrayBuffer)) {
    device.queue.writeBuffer(array.buffer, offset * 4, values.buffer, values.byteOffset, values.byteLength);
    return;
  }
  // Dawn refuses a view of shared memory (the WASM engine's heap is one): copied through an unshared chunk at a time
  const chunk = new Float32Array(Math.min(values.length, SHARED_COPY_FLOATS));
  for (let i = 0; i < values.length; i += chunk.length) {
    const n = Math.min(chunk.length, values.length - i);
    chunk.set(values.subarray(i, i + n));
    device.queue.writeBuffer(array.buffer, (offset + i) * 4, chunk.buffer, 0, n * 4);
  }
}

/** Floats copied at a time from shared memory by writeArray (16 MiB). */
const SHARED_COPY_FLOATS = 4 << 20;

/** Records a copy of `length` floats from `from` (float `fromOffset` on) into `to` (float `toOffset` on), in order with the kernels: nothing crosses to the CPU. */
export function copyArray(device: GPUDevice, from: GpuArray, fromOffset: number, to: GpuArray, toOffset: number, length: number): void {
  if (fromOffset < 0 || toOffset < 0 || length < 0 || fromOffset + length > from.length || toOffset + length > to.length) {
    throw new RangeError(`copyArray: [${fromOffset}, ${fromOffset + length}) of ${from.length} floats into [${toOffset}, ${toOffset + length}) of ${to.length}`);
  }
  if (from.buffer === to.buffer && Math.abs(fromOffset - toOffset) < length) throw new RangeError('copyArray: the ranges overlap');
  if (length === 0) return;
  recorderOf(device).copy(from.buffer, fromOffset * 4, to.buffer, toOffset * 4, length * 4);
}

/** Reads `length` floats from float `offset` of `array` back, after all submitted work. */
export async function readArray(device: GPUDevice, array: GpuArray, offset = 0, length: number = array.length - offset): Promise<Float32Array> {
  if (offset < 0 || length < 0 || offset + length > array.length) {
    throw new RangeError(`readArray: [${offset}, ${offset + length}) outside ${array.length} floats`);
  }
  if (length === 0) return new Float32Array(0);
  const recorder = recorderOf(device);
  recorder.flush();
  recorder.counts.bytesRead += length * 4;
  const staging = device.createBuffer({ label: 'readback', size: length * 4, usage: BufferUsage.MAP_READ | BufferUsage.COPY_DST });
  try {
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(array.buffer, offset * 4, staging, 0, length * 4);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(MAP_READ_MODE);
    return new Float32Array(staging.getMappedRange().slice(0));
  } finally {
    staging.destroy();
  }
}
