// A device's GPU work, recorded into one command buffer until something must
// see its results. Every kernel (program.ts, gemm.ts, attention.ts) and every
// clear (gpt-buffers.ts) records here instead of submitting on its own: each
// dispatch gets a parameter block of its own (a slot of a uniform buffer that
// the batch owns), so a kernel called twice in one batch keeps both calls'
// parameters. Clears and buffer-to-buffer copies record in order between
// dispatches. The batch is submitted as one command buffer when data is
// written to the GPU or read back (buffers.ts flushes first, so queue order
// stays program order), when work must be waited for, or on `flush()`.
// Within the compute pass each dispatch sees the writes of the ones before
// it (WebGPU's usage scopes are per dispatch in a compute pass).
import { BufferUsage } from './usage.ts';

/** Parameter-block slots per uniform buffer of a batch. */
const SLOTS_PER_CHUNK = 256;

interface Chunk {
  buffer: GPUBuffer;
  /** the slots' bytes, written to `buffer` at the flush */
  bytes: Uint8Array;
  used: number;
}

/** Counts of what a recorder did, and of the bytes that crossed between CPU and GPU (buffers.ts), for tests and the bench's log. */
export interface RecorderCounts {
  dispatches: number;
  submits: number;
  /** bytes written from the CPU (writeArray, uploads) */
  bytesWritten: number;
  /** bytes read back to the CPU (readArray) */
  bytesRead: number;
}

export class Recorder {
  private encoder: GPUCommandEncoder | null = null;
  private pass: GPUComputePassEncoder | null = null;
  private chunks: Chunk[] = [];
  /** uniform buffers free for the next batches (their last batch has completed) */
  private readonly spare: GPUBuffer[] = [];
  private readonly slotBytes: number;
  readonly counts: RecorderCounts = { dispatches: 0, submits: 0, bytesWritten: 0, bytesRead: 0 };

  constructor(private readonly device: GPUDevice) {
    this.slotBytes = device.limits.minUniformBufferOffsetAlignment;
  }

  /**
   * Records a dispatch of `pipeline` over x × y workgroups: `params` (at most
   * a slot, 256 bytes on most devices) bound at 0, `buffers` at 1, 2, ...
   */
  dispatch(label: string, pipeline: GPUComputePipeline, params: ArrayBuffer, buffers: readonly GPUBuffer[], x: number, y = 1): void {
    if (params.byteLength > this.slotBytes) throw new RangeError(`${label}: a parameter block of ${params.byteLength} bytes; a slot holds ${this.slotBytes}`);
    const { chunk, offset } = this.slot();
    chunk.bytes.set(new Uint8Array(params), offset);
    const group = this.device.createBindGroup({
      label,
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: chunk.buffer, offset, size: params.byteLength } }, ...buffers.map((buffer, i) => ({ binding: i + 1, resource: { buffer } }))],
    });
    const pass = this.computePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(x, y);
    this.counts.dispatches++;
  }

  /** Records zeroes over `size` bytes of `buffer` from byte `offset` (between dispatches, in order). */
  clear(buffer: GPUBuffer, offset: number, size: number): void {
    this.endPass();
    this.commandEncoder().clearBuffer(buffer, offset, size);
  }

  /** Records a copy of `size` bytes from `src` at `srcOffset` to `dst` at `dstOffset` (between dispatches, in order). */
  copy(src: GPUBuffer, srcOffset: number, dst: GPUBuffer, dstOffset: number, size: number): void {
    this.endPass();
    this.commandEncoder().copyBufferToBuffer(src, srcOffset, dst, dstOffset, size);
  }

  /** Submits what was recorded, as one command buffer (nothing when nothing was). Nothing waits here. */
  flush(): void {
    if (!this.encoder) return;
    this.endPass();
    const chunks = this.chunks;
    for (const c of chunks) this.device.queue.writeBuffer(c.buffer, 0, c.bytes.buffer, c.bytes.byteOffset, c.used);
    this.device.queue.submit([this.encoder.finish()]);
    this.counts.submits++;
    this.encoder = null;
    this.chunks = [];
    // a uniform buffer is written again only once the batch that reads it has run
    if (chunks.length) void this.device.queue.onSubmittedWorkDone().then(() => this.spare.push(...chunks.map((c) => c.buffer)), () => {});
  }

  /** Submits what was recorded and waits for all the queue's work. */
  async drain(): Promise<void> {
    this.flush();
    await this.device.queue.onSubmittedWorkDone();
  }

  private slot(): { chunk: Chunk; offset: number } {
    let chunk = this.chunks[this.chunks.length - 1];
    if (!chunk || chunk.used + this.slotBytes > chunk.bytes.length) {
      const size = SLOTS_PER_CHUNK * this.slotBytes;
      const buffer = this.spare.pop() ?? this.device.createBuffer({ label: 'parameter blocks', size, usage: BufferUsage.UNIFORM | BufferUsage.COPY_DST });
      chunk = { buffer, bytes: new Uint8Array(size), used: 0 };
      this.chunks.push(chunk);
    }
    const offset = chunk.used;
    chunk.used += this.slotBytes;
    return { chunk, offset };
  }

  private commandEncoder(): GPUCommandEncoder {
    return (this.encoder ??= this.device.createCommandEncoder({ label: 'recorded work' }));
  }

  private computePass(): GPUComputePassEncoder {
    return (this.pass ??= this.commandEncoder().beginComputePass());
  }

  private endPass(): void {
    this.pass?.end();
    this.pass = null;
  }
}

const recorders = new WeakMap<GPUDevice, Recorder>();

/** The recorder every kernel of `device` records into. */
export function recorderOf(device: GPUDevice): Recorder {
  let r = recorders.get(device);
  if (!r) recorders.set(device, (r = new Recorder(device)));
  return r;
}
