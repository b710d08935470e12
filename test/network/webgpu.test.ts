// A miner on the WebGPU backend trains its stage in a real network next to a
// WASM miner: gpt-micro in 2 stages, one miner each (real processes), the
// WebGPU one on SwiftShader (`--backend webgpu` takes a software adapter; this
// machine has no GPU). The run completes, both miners did forward and
// backward work, the orchestrator's spot checks (recomputed on WASM) passed
// the WebGPU miner's activations, and the loss falls as in the same run on
// two WASM miners (train.test.ts's criterion, and within 0.25 of a second
// run here with a second WASM miner in place of the WebGPU one).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import type { RunView } from '../../src/api/schemas.ts';
import { Cluster, type Proc } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stop());

const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;

async function train(): Promise<{ done: RunView; losses: number[] }> {
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 80, stages: 2, mergeEvery: 20, batchSize: 8, lr: 0.003, minMiners: 2 });
  const losses: number[] = [];
  const done = await cluster.waitRun(run.id, (v) => {
    if (v.loss !== null) losses.push(v.loss);
    return v.status === 'completed' || v.status === 'failed';
  });
  assert.equal(done.status, 'completed', JSON.stringify(done));
  return { done, losses };
}

test('a WebGPU miner (SwiftShader) and a WASM miner train gpt-micro in 2 stages; the loss falls as with two WASM miners', { timeout: 600_000 }, async () => {
  await cluster.startOrchestrator(['--check-rate', '0.5']);
  const wasm = await cluster.startMiner('wasm-a');
  const gpu: Proc = await cluster.startMiner('gpu', ['--backend', 'webgpu', '--gpu-memory', '3GiB']);
  const joined = gpu.lines.find((l) => /joined as .* on WebGPU on /.test(l));
  assert.ok(joined, `the WebGPU miner says which adapter it trains on:\n${gpu.lines.join('\n')}`);
  assert.match(joined, /software adapter/);
  const miners = await cluster.api.miners();
  const gpuId = miners.find((m) => m.name === 'gpu')!.id;
  // the memory offered: what --gpu-memory said on the GPU; at most a WebAssembly memory on WASM
  assert.ok(miners.find((m) => m.name === 'gpu')!.memoryBytes <= 3 * 2 ** 30, JSON.stringify(miners));
  assert.ok(miners.find((m) => m.name === 'wasm-a')!.memoryBytes <= 4 * 2 ** 30, JSON.stringify(miners));

  const mixed = await train();
  assert.equal(mixed.done.microbatchesDone, 80);
  const holders = mixed.done.stages.map((s) => s.replicas.map((r) => r.id));
  assert.ok(holders.flat().includes(gpuId), `the WebGPU miner holds a stage: ${JSON.stringify(holders)}`);
  const work = await cluster.api.work();
  for (const kind of ['forward', 'backward'] as const) assert.ok(work.some((w) => w.miner === gpuId && w.kind === kind && w.units > 0), `the WebGPU miner did ${kind} work`);
  // its activations (or losses) were recomputed by the orchestrator on WASM, and passed
  const checks = mixed.done.checks.find((c) => c.name === 'gpu');
  assert.ok(checks && checks.passed >= 1 && checks.failed === 0, `spot checks: ${JSON.stringify(mixed.done.checks)}`);
  const early = mean(mixed.losses.slice(0, 3)), late = mean(mixed.losses.slice(-3));
  process.stderr.write(`WebGPU + WASM: ${mixed.losses.length} losses, ${early.toFixed(3)} -> ${late.toFixed(3)}; checks ${JSON.stringify(mixed.done.checks)}\n`);
  assert.ok(early > 4.5 && late < early - 1, `WebGPU + WASM: loss ${early.toFixed(3)} -> ${late.toFixed(3)}`);

  // the same run on two WASM miners
  gpu.child.kill('SIGTERM');
  await cluster.startMiner('wasm-b');
  const plain = await train();
  const plainLate = mean(plain.losses.slice(-3));
  process.stderr.write(`final loss: WebGPU + WASM ${late.toFixed(3)}, WASM + WASM ${plainLate.toFixed(3)}\n`);
  // the runs end within 0.001 of each other in every run seen but one (3.806 against 3.055, once in ten, cause not found): what the processes said about rounds and failed work, for the next time
  const told = (p: Proc | null, who: string): string[] => (p?.lines ?? []).filter((l) => /round|offence|abandon|microbatch \d+:|WebGPU|error/i.test(l)).slice(-25).map((l) => `${who}: ${l.slice(0, 300)}`);
  assert.ok(Math.abs(late - plainLate) <= 0.25, [`final losses ${late.toFixed(3)} (WebGPU + WASM) and ${plainLate.toFixed(3)} (WASM + WASM)`, ...told(cluster.orchestrator, 'orchestrator'), ...told(gpu, 'gpu'), ...told(wasm, 'wasm-a')].join('\n'));
  assert.ok(wasm.child.exitCode === null);
});
