// Allocator for the engine's shared WebAssembly memory: first-fit over a sorted
// free list, 64-byte aligned blocks, neighbours merged on free, memory grown on
// demand. Growing a shared memory never detaches earlier views, so tensors
// created before a grow stay valid.

const ALIGN = 64;
const PAGE = 65536;

interface Block {
  start: number;
  size: number;
}

export class Heap {
  private readonly free: Block[] = [];
  private readonly used = new Map<number, number>();
  private end: number;
  private inUse = 0;
  private peak = 0;

  constructor(
    private readonly memory: WebAssembly.Memory,
    base: number,
  ) {
    this.end = alignUp(base);
  }

  /** Reserves `bytes` (rounded up to 64) and returns the byte offset. Contents are zero. */
  alloc(bytes: number): number {
    const size = alignUp(Math.max(bytes, 1));
    for (let i = 0; i < this.free.length; i++) {
      const block = this.free[i];
      if (block.size >= size) {
        const start = block.start;
        if (block.size === size) this.free.splice(i, 1);
        else {
          block.start += size;
          block.size -= size;
        }
        new Uint8Array(this.memory.buffer, start, size).fill(0);
        return this.track(start, size);
      }
    }
    const start = this.end;
    this.ensure(start + size);
    this.end = start + size;
    new Uint8Array(this.memory.buffer, start, size).fill(0);
    return this.track(start, size);
  }

  /** Returns a block from `alloc` to the heap. */
  release(ptr: number): void {
    const size = this.used.get(ptr);
    if (size === undefined) throw new Error(`heap: release of unknown block ${ptr}`);
    this.used.delete(ptr);
    this.inUse -= size;
    let i = 0;
    while (i < this.free.length && this.free[i].start < ptr) i++;
    this.free.splice(i, 0, { start: ptr, size });
    // merge with the next, then with the previous block
    const cur = this.free[i];
    const next = this.free[i + 1];
    if (next && cur.start + cur.size === next.start) {
      cur.size += next.size;
      this.free.splice(i + 1, 1);
    }
    const prev = this.free[i - 1];
    if (prev && prev.start + prev.size === cur.start) {
      prev.size += cur.size;
      this.free.splice(i, 1);
    }
    // give the tail back to the bump pointer
    const last = this.free[this.free.length - 1];
    if (last && last.start + last.size === this.end) {
      this.end = last.start;
      this.free.pop();
    }
  }

  /** The memory's current buffer (changes when the memory grows). */
  buffer(): ArrayBufferLike {
    return this.memory.buffer;
  }

  /** Bytes currently allocated, and the most ever allocated at once. */
  stats(): { inUse: number; peak: number; memoryBytes: number } {
    return { inUse: this.inUse, peak: this.peak, memoryBytes: this.memory.buffer.byteLength };
  }

  private track(start: number, size: number): number {
    this.used.set(start, size);
    this.inUse += size;
    this.peak = Math.max(this.peak, this.inUse);
    return start;
  }

  private ensure(bytes: number): void {
    const have = this.memory.buffer.byteLength;
    if (bytes <= have) return;
    const pages = Math.ceil((bytes - have) / PAGE);
    // grow by at least 1/8 of the current size to keep grows rare
    const extra = Math.max(pages, Math.ceil(have / PAGE / 8));
    try {
      this.memory.grow(extra);
    } catch {
      this.memory.grow(pages);
    }
  }
}

function alignUp(n: number): number {
  return Math.ceil(n / ALIGN) * ALIGN;
}
