// The simulator against this machine's real local network (docs/simulation.md,
// "Calibration"), group 'scale', in one run:
// 1. the pipeline bench (bench/network.bench.ts pipelineTokensPerSecond: two
//    single-thread miners as 2 stages, no merges): tokens/s;
// 2. the `nbcli up` network (4 single-thread miners, throttles 1, 0.8, 0.6,
//    0.45, gpt-tiny as 2 stages x 2 replicas, batch 12, merge every 100):
//    tokens/s over whole merge cycles (the end of one merge round to the end
//    of the next), and merge time (a round's opening to its last stage done,
//    from GET /runs/:id/merges), medians over the cycles;
// 3. the engine's training efficiency on this machine (src/sim/calibrate.ts
//    measureEngine, a short microbenchmark);
// 4. the simulator on the same description (the miners' GFLOP/s, memory and
//    bandwidth as they reported them at join, the run's parameters).
// scale.sim_calibration_error is the largest relative error of the three
// predictions (target ≤ 0.15); the measured and predicted figures are rows.
import { OrchestratorClient } from '../src/api/client.ts';
import type { MinerView, RunView } from '../src/api/schemas.ts';
import { spawn } from 'node:child_process';
import { measureEngine, predictLocal, type LocalNetwork } from '../src/sim/calibrate.ts';
import { childEnv } from '../src/protocol/child-env.ts';
import type { JobTimes } from '../src/sim/types.ts';
import { median, type Bench, type BenchResult } from './harness.ts';
import { pipelineTokensPerSecond, startNet, stopNet } from './network.bench.ts';

/** nbcli up's demo miners (src/cli/up.ts THROTTLES; 1 thread each for 4 miners on this 2-core machine). */
export const UP_THROTTLES = [1, 0.8, 0.6, 0.45];
/** Microbatches of the measured up run: merges after 200, 400 (100 inner steps x 2 replicas) and the final one at 600. */
const UP_STEPS = Number(process.env.NIMBLE_CALIBRATION_STEPS ?? 600);
const PIPELINE_STEPS = Number(process.env.NIMBLE_CALIBRATION_PIPELINE_STEPS ?? 200);

export interface MeasuredUp {
  miners: MinerView[];
  run: RunView;
  /** tokens/s over each whole merge cycle (merge done → next merge done) */
  cycleTokensPerS: number[];
  /** tokens/s while training (merge done → next merge opened) */
  trainTokensPerS: number[];
  /** each round: opened → its last stage done, ms */
  mergeMs: number[];
  tokensPerCycle: number[];
  /** the engine's job times measured by a probe process while the network trained (after its first merge) */
  loaded: JobTimes | null;
}

const PROBE = new URL('../src/sim/engine-probe.ts', import.meta.url).pathname;

/** measureEngine in a child process (the orchestrator in this one keeps serving meanwhile). */
function probeEngine(net: LocalNetwork): Promise<JobTimes> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', PROBE, JSON.stringify(net)], { env: childEnv({}), stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!) as JobTimes) : reject(new Error(`engine probe exited ${code}`))));
  });
}

/** The `nbcli up` network over loopback: 4 miners, 2 stages x 2 replicas, merge rounds timed from the orchestrator's rows. */
export async function measureUpNetwork(steps = UP_STEPS, log: (line: string) => void = () => {}): Promise<MeasuredUp> {
  const net = await startNet(UP_THROTTLES.map((throttle) => ({ threads: 1, throttle })));
  try {
    const api: OrchestratorClient = net.api;
    const { id } = await api.createRun({ model: 'gpt-tiny', data: 'moby-dick', steps, stages: 2, minMiners: UP_THROTTLES.length });
    const samples: { t: number; tokens: number }[] = [];
    let last = 0;
    let run: RunView;
    let probe: Promise<JobTimes> | null = null;
    for (;;) {
      run = await api.run(id);
      if (!probe && run.mergesDone >= 1 && run.status === 'executing') probe = probeEngine(describe(await api.miners(), run));
      samples.push({ t: Date.now(), tokens: run.tokensDone });
      if (performance.now() - last > 20_000) {
        last = performance.now();
        log(`${run.microbatchesDone}/${steps} microbatches, ${run.mergesDone} merges, ${run.status}`);
      }
      if (run.status === 'completed') break;
      if (run.status === 'failed') throw new Error(`run failed: ${run.message}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const miners = await api.miners();
    const rounds = new Map<number, { opened: number; done: number }>();
    for (const r of (await api.runMerges(id)).rounds) {
      if (r.status !== 'done') continue;
      const x = rounds.get(r.round) ?? { opened: Infinity, done: 0 };
      rounds.set(r.round, { opened: Math.min(x.opened, r.startedAt), done: Math.max(x.done, r.phaseAt) });
    }
    const ordered = [...rounds.entries()].sort((a, b) => a[0] - b[0]).map(([, r]) => r);
    // tokens are constant during a round: the last sample before it closed counts them all
    const tokensAt = (t: number): number => samples.filter((s) => s.t <= t).reduce((a, s) => Math.max(a, s.tokens), 0);
    const loaded = probe ? await probe : null;
    const out: MeasuredUp = { miners, run, cycleTokensPerS: [], trainTokensPerS: [], mergeMs: ordered.map((r) => r.done - r.opened), tokensPerCycle: [], loaded };
    for (let k = 1; k < ordered.length; k++) {
      const a = ordered[k - 1], b = ordered[k];
      const tokens = tokensAt(b.done) - tokensAt(a.done);
      out.tokensPerCycle.push(tokens);
      out.cycleTokensPerS.push((tokens * 1000) / (b.done - a.done));
      out.trainTokensPerS.push((tokens * 1000) / (b.opened - a.done));
    }
    return out;
  } finally {
    await stopNet(net);
  }
}

/** The described network of an up run: each miner as it reported itself at join, the run's parameters. */
export function describe(miners: MinerView[], run: RunView): LocalNetwork {
  return {
    miners: miners.map((x) => ({ name: x.name, gflops: x.gflops, memoryBytes: x.memoryBytes, bandwidthMbps: x.bandwidthMbps, threads: x.threads })),
    model: 'gpt-tiny',
    stages: 2,
    batchSize: run.batchSize,
    mergeEvery: run.mergeEvery,
  };
}

/** The same network with each miner's speed taken from the probe run during training: a core's GFLOP/s then × the miner's throttle. */
export function underLoad(net: LocalNetwork, loaded: JobTimes): LocalNetwork {
  return { ...net, miners: net.miners.map((m) => ({ ...m, gflops: loaded.referenceGflops * (UP_THROTTLES[Number(m.name.slice(1))] ?? 1) })) };
}

const relErr = (predicted: number, measured: number): number => Math.abs(predicted - measured) / measured;

export const simCalibrationBenches: Bench[] = [
  {
    group: 'scale',
    async run(o): Promise<BenchResult[]> {
      o.log(`the pipeline bench: 2 single-thread miners, 2 stages, ${PIPELINE_STEPS} microbatches`);
      const pipe = await pipelineTokensPerSecond(PIPELINE_STEPS);
      o.log(`${Math.round(pipe)} tokens/s; now the nbcli up network (4 miners, 2 x 2), ${UP_STEPS} microbatches`);
      const up = await measureUpNetwork(UP_STEPS, o.log);
      o.log(`miners: ${up.miners.map((m) => `${m.name} ${m.gflops.toFixed(1)} GFLOP/s ${m.bandwidthMbps.toFixed(0)} Mbit/s`).join(', ')}`);
      o.log(`cycles: ${up.cycleTokensPerS.map((x) => x.toFixed(0)).join(', ')} tokens/s; training ${up.trainTokensPerS.map((x) => x.toFixed(0)).join(', ')}; merges ${up.mergeMs.join(', ')} ms`);
      const described = describe(up.miners, up.run);
      const idle = await measureEngine(described);
      o.log(`engine (idle machine, this process): ${JSON.stringify(idle)}`);
      o.log(`engine (while the network trained, a probe process): ${JSON.stringify(up.loaded)}`);
      const m0 = described.miners.find((m) => m.name === 'm0') ?? described.miners[0];
      const pipeline: LocalNetwork = { ...described, miners: [{ ...m0, name: 'm0' }, { ...m0, name: 'm1' }], mergeEvery: 1_000_000 };
      const byJoin = { up: predictLocal(described, idle), pipeline: predictLocal(pipeline, idle) };
      const loaded = up.loaded ?? idle;
      const byLoad = { up: predictLocal(underLoad(described, loaded), loaded), pipeline: predictLocal(underLoad(pipeline, idle), idle) };
      o.log(`predicted from the join figures: ${JSON.stringify(byJoin)}; from the cores' speed under load: ${JSON.stringify(byLoad)}`);
      const measured = { upTokensPerS: median(up.cycleTokensPerS), upMergeMs: median(up.mergeMs), pipelineTokensPerS: pipe };
      const errorOf = (p: typeof byJoin): number => Math.max(relErr(p.up.tokensPerS, measured.upTokensPerS), relErr(p.up.mergeMs, measured.upMergeMs), relErr(p.pipeline.tokensPerS, measured.pipelineTokensPerS));
      // the brief's description: the miners' join figures; the cores' speed under load is a second reading
      const error = errorOf(byJoin);
      const predicted = byJoin;
      return [
        { bench: 'scale.sim_calibration_error', value: Number(error.toFixed(3)), unit: 'ratio' },
        { bench: 'scale.sim_calibration_error.under_load', value: Number(errorOf(byLoad).toFixed(3)), unit: 'ratio' },
        { bench: 'scale.sim_calibration.up.predicted_tokens_per_s.under_load', value: Math.round(byLoad.up.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.pipeline.predicted_tokens_per_s.under_load', value: Math.round(byLoad.pipeline.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.pipeline.measured_tokens_per_s', value: Math.round(measured.pipelineTokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.pipeline.predicted_tokens_per_s', value: Math.round(predicted.pipeline.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.measured_tokens_per_s', value: Math.round(measured.upTokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.predicted_tokens_per_s', value: Math.round(predicted.up.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.measured_merge_ms', value: Math.round(measured.upMergeMs), unit: 'ms' },
        { bench: 'scale.sim_calibration.up.predicted_merge_ms', value: Math.round(predicted.up.mergeMs), unit: 'ms' },
      ];
    },
  },
];
