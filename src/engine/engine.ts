// The engine: one shared WebAssembly memory, the kernel module instantiated on
// it in this thread and in every worker, an allocator, and typed kernel calls.
// It knows nothing of networks or files beyond its own kernel binaries.
//
// The backend: 'wasm' runs every kernel here; 'webgpu' also opens a GPU
// (./webgpu/device.ts), on which a stage's forward and backward run
// (src/miner/stage-model-gpu.ts) while the flat parameters, the optimizer and
// everything else stay in this memory. 'auto' takes a hardware GPU when there
// is one and WASM otherwise; 'webgpu' also takes a software adapter
// (SwiftShader: right answers, CPU speed), which is what tests run on.
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { setFlagsFromString } from 'node:v8';
import { Heap } from './heap.ts';
import { openGpu, type Gpu } from './webgpu/device.ts';
import { Kernels, KERNEL_NAMES, type KernelSizes } from './kernels.ts';
import { ThreadPool, type KernelFn } from './pool.ts';
import { Tensor, numel } from './tensor.ts';

const RELAXED_FLAG = '--experimental-wasm-relaxed-simd';
const MAX_PAGES = 65536; // 4 GiB of address space; only touched pages use memory
/** The most a WASM engine's memory can hold (32-bit WebAssembly): every stage on WASM lives in it. */
export const WASM_MEMORY_BYTES = MAX_PAGES * 65536;

export interface EngineOptions {
  /** Worker threads including this one; defaults to every core. */
  threads?: number;
  /** 'auto' uses relaxed SIMD (FMA) when the runtime has it. */
  simd?: SimdChoice;
  /** where a GPT stage runs (default 'wasm'); 'webgpu' fails when no adapter opens */
  backend?: BackendChoice;
}

/** The two WASM kernel builds: relaxed SIMD (fused multiply-add) or plain SIMD; 'auto' takes relaxed where the runtime has it. */
export type SimdChoice = 'auto' | 'relaxed' | 'plain';
export const SIMD_CHOICES: readonly SimdChoice[] = ['auto', 'relaxed', 'plain'];

export type Backend = 'wasm' | 'webgpu';
export type BackendChoice = Backend | 'auto';
export const BACKEND_CHOICES: readonly BackendChoice[] = ['wasm', 'webgpu', 'auto'];

export class Engine {
  private constructor(
    readonly threads: number,
    readonly relaxedSimd: boolean,
    readonly memory: WebAssembly.Memory,
    readonly heap: Heap,
    readonly kernels: Kernels,
    private readonly pool: ThreadPool,
    /** the GPU a GPT stage runs on ('webgpu'), or null ('wasm') */
    readonly gpu: Gpu | null,
    /** why 'auto' chose WASM, when it did */
    readonly backendNote: string | null,
  ) {}

  get backend(): Backend {
    return this.gpu ? 'webgpu' : 'wasm';
  }

  static async create(options: EngineOptions = {}): Promise<Engine> {
    const choice = options.backend ?? 'wasm';
    if (!BACKEND_CHOICES.includes(choice)) throw new Error(`engine: backend must be one of ${BACKEND_CHOICES.join(', ')}, got '${String(choice)}'`);
    let gpu: Gpu | null = null;
    let note: string | null = null;
    if (choice !== 'wasm') {
      const opened = await openGpu({ software: choice === 'webgpu' ? 'allow' : 'never' });
      if (opened.gpu) gpu = opened.gpu;
      else if (choice === 'webgpu') throw new Error(`engine: the webgpu backend has no adapter: ${opened.reason}`);
      else note = `no hardware WebGPU adapter (${opened.reason}): running on WASM`;
    }
    const threads = Math.max(1, Math.floor(options.threads || availableParallelism()));
    const { module, relaxed, flags } = await compileKernels(options.simd ?? 'auto');
    const memory = new WebAssembly.Memory({ initial: 256, maximum: MAX_PAGES, shared: true });
    const instance = await WebAssembly.instantiate(module, { env: { memory, abort: kernelAbort } });
    const fns = KERNEL_NAMES.map((name): KernelFn => exportedFunction(instance.exports, name));
    const heap = new Heap(memory, exportedFunction(instance.exports, 'heapBase')());
    const sizes = kernelSizes(instance.exports);
    const pool = await ThreadPool.start({ threads, module, memory, names: KERNEL_NAMES, fns, flags });
    const kernels = new Kernels(pool, heap, threads, sizes);
    return new Engine(threads, relaxed, memory, heap, kernels, pool, gpu, note);
  }

  /** A new zero-filled tensor. Give it back with `free` when done. */
  tensor(shape: readonly number[]): Tensor {
    const ptr = this.heap.alloc(numel(shape) * 4);
    return new Tensor(ptr, shape, this.memory.buffer);
  }

  /** A tensor holding a copy of `values`. */
  tensorFrom(shape: readonly number[], values: ArrayLike<number>): Tensor {
    const t = this.tensor(shape);
    if (values.length !== t.size) throw new RangeError(`tensorFrom: ${values.length} values for shape [${shape}]`);
    t.data.set(values);
    return t;
  }

  /** Int32 storage (token ids, targets) in the shared memory. */
  int32(count: number): { ptr: number; data: Int32Array } {
    const ptr = this.heap.alloc(count * 4);
    return { ptr, data: new Int32Array(this.memory.buffer, ptr, count) };
  }

  free(t: Tensor | { ptr: number }): void {
    this.heap.release(t.ptr);
  }

  async close(): Promise<void> {
    await this.pool.close();
    await this.gpu?.close();
  }
}

/**
 * The scratch sizes the kernel module exports (assembly/index.ts): the
 * exported `const` SGEMM_WORK_BYTES (a WebAssembly.Global) and the function
 * attentionScratchFloats. The one place that reads them.
 */
export function kernelSizes(exports: WebAssembly.Exports): KernelSizes {
  return {
    sgemmWorkBytes: exportedI32(exports, 'SGEMM_WORK_BYTES'),
    attentionScratchFloats: exportedFunction(exports, 'attentionScratchFloats'),
  };
}

function exportedFunction(exports: WebAssembly.Exports, name: string): (...args: number[]) => number {
  const fn = exports[name];
  if (typeof fn !== 'function') throw new Error(`engine: kernel module lacks the function ${name}`);
  return fn as (...args: number[]) => number;
}

function exportedI32(exports: WebAssembly.Exports, name: string): number {
  const g = exports[name];
  if (!(g instanceof WebAssembly.Global) || !Number.isInteger(g.value)) throw new Error(`engine: kernel module lacks the i32 global ${name}`);
  return g.value as number;
}

function kernelAbort(): never {
  throw new Error('engine: kernel aborted');
}

let compiled: Promise<{ module: WebAssembly.Module; relaxed: boolean; flags: string[] }> | undefined;
let compiledMode: string | undefined;

async function compileKernels(mode: SimdChoice) {
  if (compiled && compiledMode === mode) return compiled;
  compiledMode = mode;
  compiled = (async () => {
    const dir = new URL('../../build/', import.meta.url);
    if (mode !== 'plain') {
      setFlagsFromString(RELAXED_FLAG);
      const bytes = readKernelFile(new URL('kernels-relaxed.wasm', dir));
      if (WebAssembly.validate(bytes)) {
        return { module: await WebAssembly.compile(bytes), relaxed: true, flags: [RELAXED_FLAG] };
      }
      if (mode === 'relaxed') throw new Error('engine: this runtime has no relaxed SIMD');
    }
    const bytes = readKernelFile(new URL('kernels-simd.wasm', dir));
    return { module: await WebAssembly.compile(bytes), relaxed: false, flags: [] };
  })();
  return compiled;
}

function readKernelFile(url: URL): Uint8Array<ArrayBuffer> {
  try {
    return new Uint8Array(readFileSync(url));
  } catch {
    throw new Error(`engine: ${url.pathname} is missing; run \`npm run build:kernels\` (npm install does it)`);
  }
}
