// Worker threads that run kernels on the engine's shared memory. The calling
// thread is thread 0 and does its share too; the others wait on a generation
// counter, run the same kernel with their own (tid, nt), then count down.
import { Worker } from 'node:worker_threads';

/** Slots of the control block (Int32Array over a SharedArrayBuffer). */
const GEN = 0;
const PENDING = 1;
const OP = 2;
const NARGS = 3;
const FAILED = 4;
const CTRL_SLOTS = 8;
export const MAX_ARGS = 32;
export const OP_EXIT = -1;
/** Iterations of busy-waiting before sleeping on Atomics.wait. */
const SPIN = 20000;

export type KernelFn = (...args: number[]) => void;

export interface PoolInit {
  module: WebAssembly.Module;
  memory: WebAssembly.Memory;
  ctrl: SharedArrayBuffer;
  args: SharedArrayBuffer;
  names: readonly string[];
  tid: number;
  nt: number;
  flags: string[];
}

export class ThreadPool {
  readonly threads: number;
  /** Threads a kernel runs on when the call does not say: all of them, or 1 (Kernels.serial). */
  defaultThreads: number;
  private readonly ctrl: Int32Array;
  private readonly args: Float64Array;
  private readonly workers: Worker[] = [];
  private closed = false;

  private constructor(
    threads: number,
    private readonly fns: readonly KernelFn[],
    ctrl: SharedArrayBuffer,
    args: SharedArrayBuffer,
  ) {
    this.threads = threads;
    this.defaultThreads = threads;
    this.ctrl = new Int32Array(ctrl);
    this.args = new Float64Array(args);
  }

  static async start(options: {
    threads: number;
    module: WebAssembly.Module;
    memory: WebAssembly.Memory;
    names: readonly string[];
    fns: readonly KernelFn[];
    flags: string[];
  }): Promise<ThreadPool> {
    const ctrl = new SharedArrayBuffer(CTRL_SLOTS * 4);
    const args = new SharedArrayBuffer(MAX_ARGS * 8);
    const pool = new ThreadPool(options.threads, options.fns, ctrl, args);
    const ready: Promise<void>[] = [];
    for (let tid = 1; tid < options.threads; tid++) {
      const init: PoolInit = {
        module: options.module,
        memory: options.memory,
        ctrl,
        args,
        names: options.names,
        tid,
        nt: options.threads,
        flags: options.flags,
      };
      const worker = spawnWorker(init);
      pool.workers.push(worker);
      ready.push(
        new Promise<void>((resolve, reject) => {
          worker.once('message', () => resolve());
          worker.once('error', reject);
          // a worker that exits before it says it is ready would leave the pool waiting for ever
          worker.once('exit', (code) => reject(new Error(`engine: worker thread ${tid} exited (${code}) before it was ready`)));
        }),
      );
    }
    await Promise.all(ready);
    for (const w of pool.workers) w.unref();
    return pool;
  }

  /** Runs kernel `op` with `args` on every thread (or only this one) and returns when all are done. */
  run(op: number, args: readonly number[], threads: number = this.defaultThreads): void {
    const fn = this.fns[op];
    if (threads <= 1 || this.threads === 1) {
      fn(...args, 0, 1);
      return;
    }
    if (this.closed) throw new Error('engine: thread pool is closed');
    const ctrl = this.ctrl;
    for (let i = 0; i < args.length; i++) this.args[i] = args[i];
    ctrl[OP] = op;
    ctrl[NARGS] = args.length;
    Atomics.store(ctrl, PENDING, this.threads - 1);
    Atomics.add(ctrl, GEN, 1);
    Atomics.notify(ctrl, GEN);
    fn(...args, 0, this.threads);
    let spins = 0;
    for (;;) {
      const left = Atomics.load(ctrl, PENDING);
      if (left === 0) break;
      if (++spins > SPIN) Atomics.wait(ctrl, PENDING, left, 1);
    }
    if (Atomics.load(ctrl, FAILED) !== 0) {
      Atomics.store(ctrl, FAILED, 0);
      throw new Error(`engine: kernel ${op} failed on a worker thread`);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.workers.length === 0) return;
    this.ctrl[OP] = OP_EXIT;
    Atomics.store(this.ctrl, PENDING, this.workers.length);
    Atomics.add(this.ctrl, GEN, 1);
    Atomics.notify(this.ctrl, GEN);
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

function spawnWorker(init: PoolInit): Worker {
  const here = import.meta.url;
  if (here.endsWith('.ts')) {
    // running from source under tsx: workers need the loader registered first
    const url = new URL('./pool-worker.ts', here).href;
    const boot = `import { register } from 'tsx/esm/api'; register(); await import(${JSON.stringify(url)});`;
    return new Worker(boot, { eval: true, workerData: init });
  }
  return new Worker(new URL('./pool-worker.js', here), { workerData: init });
}

/** The worker side: instantiate the module on the shared memory, then serve kernels forever. */
export function serveKernels(init: PoolInit, fns: readonly KernelFn[], signalReady: () => void): void {
  const ctrl = new Int32Array(init.ctrl);
  const args = new Float64Array(init.args);
  let gen = Atomics.load(ctrl, GEN);
  signalReady();
  const scratch: number[] = [];
  for (;;) {
    let spins = 0;
    while (Atomics.load(ctrl, GEN) === gen) {
      if (++spins > SPIN) Atomics.wait(ctrl, GEN, gen);
    }
    gen = Atomics.load(ctrl, GEN);
    const op = ctrl[OP];
    if (op === OP_EXIT) return;
    const n = ctrl[NARGS];
    scratch.length = n + 2;
    for (let i = 0; i < n; i++) scratch[i] = args[i];
    scratch[n] = init.tid;
    scratch[n + 1] = init.nt;
    try {
      fns[op](...scratch);
    } catch {
      Atomics.store(ctrl, FAILED, 1);
    }
    if (Atomics.sub(ctrl, PENDING, 1) === 1) Atomics.notify(ctrl, PENDING);
  }
}
