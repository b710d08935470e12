// Entry of an engine worker thread: see serveKernels in pool.ts.
import { setFlagsFromString } from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import { serveKernels, type KernelFn, type PoolInit } from './pool.ts';

const init = workerData as PoolInit;
for (const flag of init.flags) setFlagsFromString(flag);
const instance = new WebAssembly.Instance(init.module, { env: { memory: init.memory, abort: () => {} } });
const fns = init.names.map((name) => instance.exports[name] as KernelFn);
serveKernels(init, fns, () => parentPort!.postMessage('ready'));
