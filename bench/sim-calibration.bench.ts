// The simulator against this machine's real local network (docs/simulation.md,
// "Calibration"), group 'scale', in one run:
// 1. the pipeline run (two single-thread miners as 2 stages, no merges, as
//    bench/network.bench.ts pipelineTokensPerSecond): tokens/s, the CPU
//    each process spent per microbatch (the miners' from /proc, the
//    orchestrator's in this process), and the spread of the miners' job
//    times (their own timings, GET /health jobTimes);
// 2. the `nbcli up` network (4 single-thread miners, throttles 1, 0.8, 0.6,
//    0.45, gpt-tiny as 2 stages x 2 replicas, batch 12, merge every 100,
//    1,000 microbatches):
//    tokens/s over whole merge cycles (the end of one merge round to the end
//    of the next), the median over the cycles, and merge time (a round's
//    opening to its last stage done, from GET /runs/:id/merges), the mean
//    over the rounds (a round lasts whole ticks: the mean, not the median of
//    a few, estimates the simulator's mean); its CPU per microbatch too, for
//    the log;
// 3. the engine's job times and a merge round's compute on this machine,
//    idle (src/sim/calibrate.ts measureEngine, src/sim/merge-work.ts
//    measureMergeWork and ./request-cost.ts measureRequestMs, a signed
//    request for a merge frame and a blob's durable write: short
//    microbenchmarks), before the pipeline run,
//    between the two runs and after the up run: each run is predicted with
//    the mean of the two that bracket it, as the machine's speed drifts by
//    10-20% over minutes;
// 4. the simulator on the same description: the miners as they reported
//    themselves at join and their throttles, on one host of this machine's
//    cores shared by every process (src/sim/host.ts), with the per-hop and
//    orchestrator CPU and the jobs' spread measured in the pipeline run (1). The up network is the
//    check: nothing of its own run goes into its prediction (its job times
//    are the engine's alone, measured beside it).
// scale.sim_calibration_error is the largest relative error of the three
// predictions (target ≤ 0.15); .independent is the same without the shared
// host (each miner a machine of its own at its join figure), as before.
import { availableParallelism } from 'node:os';
import type { MinerView, RunView } from '../src/api/schemas.ts';
import { PeerHealth, type JobTimeSums } from '../src/miner/peer-api.ts';
import { parse } from '../src/protocol/messages.ts';
import { averageJobTimes, hostOverheads, jobSpreadBetween, localStages, measureEngine, predictLocal, type HeartbeatCpu, type LocalNetwork, type MeasuredCpu } from '../src/sim/calibrate.ts';
import type { MergeWork } from '../src/sim/merge-time.ts';
import { measureMergeWork } from '../src/sim/merge-work.ts';
import { int8PartitionBytes, mergePartitions } from '../src/sim/costs.ts';
import { simModel } from '../src/sim/models.ts';
import { rangeParamCount } from '../src/model/parts.ts';
import { measureRequestMs } from './request-cost.ts';
import type { JobTimes } from '../src/sim/types.ts';
import { median, type Bench, type BenchResult } from './harness.ts';
import { startNet, stopNet, type Net } from './network.bench.ts';
import { measureCrowdedRate } from './host-crowding.ts';
import { ownCpuMs, processCpuMs } from './process-cpu.ts';

/** nbcli up's demo miners (src/cli/up/up.ts THROTTLES; 1 thread each for 4 miners on this 2-core machine). */
export const UP_THROTTLES = [1, 0.8, 0.6, 0.45];
/** Microbatches of the measured up run: merges after 200, 400, 600, 800 (100 inner steps x 2 replicas) and the final one at 1,000; four whole cycles for the medians. */
const UP_STEPS = Number(process.env.NIMBLE_CALIBRATION_STEPS ?? 1000);
const PIPELINE_STEPS = Number(process.env.NIMBLE_CALIBRATION_PIPELINE_STEPS ?? 200);
/** Both runs' batch (the orchestrator's default). */
const BATCH_SIZE = 12;

/** What the engine's job times depend on (gpt-tiny as 2 stages, the batch): the runs' miners are not known before they join. */
const ENGINE_NET: LocalNetwork = {
  miners: [0, 1].map((k) => ({ name: `m${k}`, gflops: 1, memoryBytes: 8e9, bandwidthMbps: 1000, threads: 1 })),
  model: 'gpt-tiny',
  stages: 2,
  batchSize: BATCH_SIZE,
  mergeEvery: 100,
};

/** CPU so far of a network's processes: each miner child's and this process's (the orchestrator's); the heartbeats the orchestrator took. */
interface CpuMark {
  children: number[];
  own: number;
  microbatches: number;
  heartbeats: number;
}

function cpuMark(net: Net, microbatches: number): CpuMark {
  return { children: net.children.map((c) => processCpuMs(c.pid!)), own: ownCpuMs(), microbatches, heartbeats: net.orch.coordinator.heartbeatsTaken };
}

/**
 * A heartbeat's CPU on a network whose miners have joined and hold no
 * stage: the orchestrator's and the miners' CPU over `ms`, per heartbeat the
 * orchestrator took. The orchestrator's includes its clock's idle ticks,
 * which one network cannot tell apart from its heartbeats.
 */
async function idleHeartbeatCpu(net: Net, ms = 6000): Promise<HeartbeatCpu> {
  for (let i = 0; (await net.api.miners()).length < net.children.length; i++) {
    if (i > 600) throw new Error('the miners did not join');
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 1000));
  const a = cpuMark(net, 0);
  await new Promise((r) => setTimeout(r, ms));
  const b = cpuMark(net, 0);
  const beats = b.heartbeats - a.heartbeats;
  if (beats <= 0) throw new Error('no heartbeat in the idle window');
  return { orchestratorMs: (b.own - a.own) / beats, minerMs: b.children.reduce((sum, x, k) => sum + x - a.children[k], 0) / beats };
}

/** CPU per microbatch between two marks: per stage, the mean over its replicas (miner child K is named mK). */
function cpuBetween(a: CpuMark, b: CpuMark, run: RunView): MeasuredCpu {
  const n = b.microbatches - a.microbatches;
  if (n <= 0) throw new Error('no microbatch between the CPU marks');
  const ofChild = (name: string): number => {
    const k = Number(name.slice(1));
    return (b.children[k] - a.children[k]) / n;
  };
  return {
    minerMsPerMicrobatch: run.stages.map((s) => s.replicas.reduce((sum, r) => sum + ofChild(r.name), 0) / s.replicas.length),
    orchestratorMsPerMicrobatch: (b.own - a.own) / n,
    heartbeats: { perMicrobatch: (b.heartbeats - a.heartbeats) / n, miners: b.children.length },
  };
}

/** Every miner's job-time sums now, forwards then backwards of each (their GET /health, in the order the orchestrator lists them), and each one's CPU in its jobs by name. */
async function jobSums(net: Net): Promise<{ sums: JobTimeSums[]; cpuMs: Map<string, number> }> {
  const sums: JobTimeSums[] = [];
  const cpuMs = new Map<string, number>();
  for (const m of await net.api.miners()) {
    const health = parse(PeerHealth, await (await fetch(`${m.url}/health`)).json(), `${m.name}'s health`);
    const t = health.stats.jobTimes;
    if (!t) throw new Error(`${m.name} does not time its jobs`);
    if (t.forward.cpuMs === undefined || t.backward.cpuMs === undefined) throw new Error(`${m.name} does not measure its jobs' CPU`);
    sums.push(t.forward, t.backward);
    cpuMs.set(m.name, t.forward.cpuMs + t.backward.cpuMs);
  }
  return { sums, cpuMs };
}

/** Per stage, the CPU its miners spent in their jobs between two readings, per microbatch of the run (the mean over the stage's replicas). */
function jobCpuPerMicrobatch(a: Map<string, number>, b: Map<string, number>, run: RunView, microbatches: number): number[] {
  return run.stages.map((s) => s.replicas.reduce((sum, r) => sum + ((b.get(r.name) ?? 0) - (a.get(r.name) ?? 0)) / microbatches, 0) / s.replicas.length);
}

export interface MeasuredPipeline {
  tokensPerS: number;
  cpu: MeasuredCpu;
  /** the spread of the miners' jobs over the same windows (their own timings, GET /health) */
  jobSpread: number;
  miners: MinerView[];
  run: RunView;
  /** a heartbeat's CPU on the same network before its run */
  heartbeat: HeartbeatCpu;
}

/**
 * Two single-thread miners as 2 stages (pipelineTokensPerSecond's run):
 * tokens/s, the median over windows of 20 microbatches after the first 20,
 * and the CPU per microbatch over the same windows.
 */
export async function measurePipeline(steps = PIPELINE_STEPS): Promise<MeasuredPipeline> {
  const net = await startNet([{ threads: 1 }, { threads: 1 }]);
  try {
    const heartbeat = await idleHeartbeatCpu(net);
    const { id } = await net.api.createRun({ model: 'gpt-tiny', data: 'moby-dick', steps, stages: 2, batchSize: BATCH_SIZE, mergeEvery: 1_000_000, minMiners: 2 });
    const window = 20;
    const rates: number[] = [];
    let first: CpuMark | null = null;
    let mark: RunView | null = null;
    let t0 = 0;
    let firstJobs: Awaited<ReturnType<typeof jobSums>> = { sums: [], cpuMs: new Map() };
    for (;;) {
      const v = await net.api.run(id);
      if (v.status === 'failed') throw new Error(`run failed: ${v.message}`);
      if (!mark && v.microbatchesDone >= window) {
        [mark, t0, first] = [v, performance.now(), cpuMark(net, v.microbatchesDone)];
        firstJobs = await jobSums(net);
      } else if (mark && v.microbatchesDone >= mark.microbatchesDone + window) {
        const t = performance.now();
        rates.push(((v.tokensDone - mark.tokensDone) * 1000) / (t - t0));
        [mark, t0] = [v, t];
        if (v.microbatchesDone + window > steps - 10) break;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    const lastJobs = await jobSums(net);
    const run = await net.api.run(id);
    const jobSpread = jobSpreadBetween(firstJobs.sums.map((a, i) => [a, lastJobs.sums[i]] as const));
    const cpu = cpuBetween(first!, cpuMark(net, mark.microbatchesDone), run);
    const jobCpu = jobCpuPerMicrobatch(firstJobs.cpuMs, lastJobs.cpuMs, run, mark.microbatchesDone - first!.microbatches);
    return { tokensPerS: median(rates), cpu: { ...cpu, minerJobMsPerMicrobatch: jobCpu }, jobSpread, miners: await net.api.miners(), run, heartbeat };
  } finally {
    await stopNet(net);
  }
}

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
  /** CPU per microbatch from the first merge's end to the run's end */
  cpu: MeasuredCpu | null;
  /** CPU spent while the run was merging, per round: the orchestrator's, and each miner's (mK) */
  mergeCpu: { rounds: number; orchestratorMs: number; minerMs: number[] };
}

/** The `nbcli up` network over loopback: 4 miners, 2 stages x 2 replicas, merge rounds timed from the orchestrator's rows. */
export async function measureUpNetwork(steps = UP_STEPS, log: (line: string) => void = () => {}): Promise<MeasuredUp> {
  const net = await startNet(UP_THROTTLES.map((throttle) => ({ threads: 1, throttle })));
  try {
    const api = net.api;
    const { id } = await api.createRun({ model: 'gpt-tiny', data: 'moby-dick', steps, stages: 2, batchSize: BATCH_SIZE, minMiners: UP_THROTTLES.length });
    const samples: { t: number; tokens: number }[] = [];
    let last = 0;
    let run: RunView;
    let from: CpuMark | null = null;
    let to: CpuMark | null = null;
    // the orchestrator collects a stage's old merge rounds (src/orchestrator/blobs/gc.ts): read them as they finish
    const rounds = new Map<number, { opened: number; done: number }>();
    const readRounds = async (): Promise<void> => {
      for (const r of (await api.runMerges(id)).rounds) {
        if (r.status !== 'done') continue;
        const x = rounds.get(r.round) ?? { opened: Infinity, done: 0 };
        rounds.set(r.round, { opened: Math.min(x.opened, r.startedAt), done: Math.max(x.done, r.phaseAt) });
      }
    };
    let roundsReadAt = 0;
    let mergingSince: CpuMark | null = null;
    const mergeCpu = { rounds: 0, orchestratorMs: 0, minerMs: net.children.map(() => 0) };
    for (;;) {
      run = await api.run(id);
      if (run.status === 'merging' && !mergingSince) mergingSince = cpuMark(net, run.microbatchesDone);
      else if (run.status !== 'merging' && mergingSince) {
        const now = cpuMark(net, run.microbatchesDone);
        mergeCpu.rounds++;
        mergeCpu.orchestratorMs += now.own - mergingSince.own;
        now.children.forEach((ms, k) => (mergeCpu.minerMs[k] += ms - mergingSince!.children[k]));
        mergingSince = null;
      }
      if (performance.now() - roundsReadAt > 1000) {
        roundsReadAt = performance.now();
        await readRounds();
      }
      if (!from && run.mergesDone >= 1 && run.status === 'executing') from = cpuMark(net, run.microbatchesDone);
      samples.push({ t: Date.now(), tokens: run.tokensDone });
      if (performance.now() - last > 20_000) {
        last = performance.now();
        log(`${run.microbatchesDone}/${steps} microbatches, ${run.mergesDone} merges, ${run.status}`);
      }
      if (run.status === 'completed') break;
      if (run.status === 'failed') throw new Error(`run failed: ${run.message}`);
      to = cpuMark(net, run.microbatchesDone);
      await new Promise((r) => setTimeout(r, 100));
    }
    const miners = await api.miners();
    await readRounds();
    const ordered = [...rounds.entries()].sort((a, b) => a[0] - b[0]).map(([, r]) => r);
    // tokens are constant during a round: the last sample before it closed counts them all
    const tokensAt = (t: number): number => samples.filter((s) => s.t <= t).reduce((a, s) => Math.max(a, s.tokens), 0);
    const cpu = from && to && to.microbatches > from.microbatches ? cpuBetween(from, to, run) : null;
    const perRound = (ms: number): number => (mergeCpu.rounds ? ms / mergeCpu.rounds : 0);
    const merging = { rounds: mergeCpu.rounds, orchestratorMs: perRound(mergeCpu.orchestratorMs), minerMs: mergeCpu.minerMs.map(perRound) };
    const out: MeasuredUp = { miners, run, cycleTokensPerS: [], trainTokensPerS: [], mergeMs: ordered.map((r) => r.done - r.opened), tokensPerCycle: [], cpu, mergeCpu: merging };
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

/** The described network of a run: each miner as it reported itself at join, with its throttle (miner K of `throttles` is named mK), and the run's parameters. */
export function describe(miners: MinerView[], run: RunView, throttles: number[]): LocalNetwork {
  return {
    miners: miners.map((x) => ({ name: x.name, gflops: x.gflops, memoryBytes: x.memoryBytes, bandwidthMbps: x.bandwidthMbps, threads: x.threads, throttle: throttles[Number(x.name.slice(1))] ?? 1 })),
    model: 'gpt-tiny',
    stages: 2,
    batchSize: run.batchSize,
    mergeEvery: run.mergeEvery,
  };
}

/** The mean size of a merge frame of the run's first stage with two replicas (what a merge round's requests carry). */
function mergeFrameBytes(net: LocalNetwork): number {
  const params = rangeParamCount(simModel(net.model), localStages(net)[0]);
  const partitions = mergePartitions(params, 2);
  return Math.round(int8PartitionBytes(params, partitions) / partitions);
}

const relErr = (predicted: number, measured: number): number => Math.abs(predicted - measured) / measured;
const mean = (xs: readonly number[]): number => xs.reduce((a, x) => a + x, 0) / xs.length;

/** The mean of merge-work measurements (bracketing a run, as the job times are). */
function meanMergeWork(works: readonly MergeWork[]): MergeWork {
  const out = { ...works[0] };
  for (const key of Object.keys(out) as (keyof MergeWork)[]) out[key] = mean(works.map((w) => w[key] ?? 0));
  return out;
}
const cpuLine = (c: MeasuredCpu | null): string =>
  c ? `miners ${c.minerMsPerMicrobatch.map((x) => x.toFixed(1)).join(' / ')} ms${c.minerJobMsPerMicrobatch ? ` (in their jobs ${c.minerJobMsPerMicrobatch.map((x) => x.toFixed(1)).join(' / ')} ms)` : ''}, orchestrator ${c.orchestratorMsPerMicrobatch.toFixed(1)} ms` : 'not measured';

export const simCalibrationBenches: Bench[] = [
  {
    group: 'scale',
    async run(o): Promise<BenchResult[]> {
      const engine: JobTimes[] = [];
      const merging: MergeWork[] = [];
      const measureIdle = async (when: string): Promise<void> => {
        engine.push(await measureEngine(ENGINE_NET));
        merging.push({ ...(await measureMergeWork(ENGINE_NET)), ...(await measureRequestMs(mergeFrameBytes(ENGINE_NET))) });
        o.log(`engine ${when} (this process alone): ${JSON.stringify(engine.at(-1))}; a merge round's compute (ns per value; a request's round trip in ms): ${JSON.stringify(merging.at(-1), (k, v: unknown) => (typeof v === 'number' && k.endsWith('PerParam') ? Number((v * 1e6).toFixed(2)) : v))}`);
      };
      await measureIdle('before the pipeline run');
      const crowding = await measureCrowdedRate(ENGINE_NET, availableParallelism());
      o.log(`time slicing (a stage-0 microbatch alone, then in ${crowding.processes} processes at once): ${crowding.aloneMs.toFixed(1)} → ${crowding.crowdedMs.toFixed(1)} ms, so a crowded process gets ${(100 * crowding.crowdedRate).toFixed(1)}% of its fair share`);
      o.log(`the pipeline run: 2 single-thread miners, 2 stages, ${PIPELINE_STEPS} microbatches`);
      const pipe = await measurePipeline(PIPELINE_STEPS);
      o.log(`${Math.round(pipe.tokensPerS)} tokens/s; CPU per microbatch: ${cpuLine(pipe.cpu)}; the miners' jobs spread by ${(100 * pipe.jobSpread).toFixed(1)}%`);
      await measureIdle('between the runs');
      o.log(`now the nbcli up network (4 miners, 2 x 2), ${UP_STEPS} microbatches`);
      const up = await measureUpNetwork(UP_STEPS, o.log);
      o.log(`miners: ${up.miners.map((m) => `${m.name} ${m.gflops.toFixed(1)} GFLOP/s ${m.bandwidthMbps.toFixed(0)} Mbit/s`).join(', ')}`);
      o.log(`cycles: ${up.cycleTokensPerS.map((x) => x.toFixed(0)).join(', ')} tokens/s; training ${up.trainTokensPerS.map((x) => x.toFixed(0)).join(', ')}; merges ${up.mergeMs.join(', ')} ms; CPU per microbatch: ${cpuLine(up.cpu)}`);
      o.log(`CPU while merging, per round (${up.mergeCpu.rounds} rounds seen): orchestrator ${up.mergeCpu.orchestratorMs.toFixed(0)} ms, miners ${up.mergeCpu.minerMs.map((x) => x.toFixed(0)).join(' / ')} ms`);
      await measureIdle('after the up run');
      const described = describe(up.miners, up.run, UP_THROTTLES);
      const pipeline = describe(pipe.miners, pipe.run, []);
      for (const net of [described, pipeline]) {
        if (JSON.stringify(localStages(net)) !== JSON.stringify(localStages(ENGINE_NET))) throw new Error('the runs were cut otherwise than the engine measured');
      }
      const jobs = { pipeline: averageJobTimes(engine.slice(0, 2)), up: averageJobTimes(engine.slice(1, 3)) };
      // jobs vary as much as the miners' own timings of them in the pipeline run showed (an idle engine's vary less: `jitter` of its job times)
      o.log(`a heartbeat's CPU on the idle pipeline network: orchestrator ${pipe.heartbeat.orchestratorMs.toFixed(2)} ms, miner ${pipe.heartbeat.minerMs.toFixed(2)} ms; heartbeats per microbatch: pipeline run ${pipe.cpu.heartbeats?.perMicrobatch.toFixed(2)}, up run ${up.cpu?.heartbeats?.perMicrobatch.toFixed(2)}`);
      const host = { ...hostOverheads(availableParallelism(), pipe.cpu, jobs.pipeline, pipe.heartbeat), jobJitter: pipe.jobSpread, crowdedRate: crowding.crowdedRate };
      o.log(`the shared host, from the pipeline run: ${JSON.stringify(host)}`);
      const mergeWork = meanMergeWork(merging.slice(1, 3));
      const shared = { up: predictLocal(described, { jobTimes: jobs.up, host, mergeWork }), pipeline: predictLocal(pipeline, { jobTimes: jobs.pipeline, host }) };
      const independent = { up: predictLocal(described, { jobTimes: jobs.up, mergeWork }), pipeline: predictLocal(pipeline, { jobTimes: jobs.pipeline }) };
      o.log(`predicted on the shared host: ${JSON.stringify(shared)}; each miner a machine of its own: ${JSON.stringify(independent)}`);
      // for comparison, the older method: one engine measurement after both runs for both predictions
      const last = engine[2];
      const lastHost = { ...hostOverheads(availableParallelism(), pipe.cpu, last, pipe.heartbeat), jobJitter: pipe.jobSpread, crowdedRate: crowding.crowdedRate };
      const oneMeasure = { up: predictLocal(described, { jobTimes: last, host: lastHost, mergeWork: merging[2] }), pipeline: predictLocal(pipeline, { jobTimes: last, host: lastHost }) };
      // a round lasts a whole number of ticks (mostly 6 or 7 here): the median of a few is one of two values 17% apart, the mean estimates what the simulator's mean predicts
      const measured = { upTokensPerS: median(up.cycleTokensPerS), upMergeMs: mean(up.mergeMs), pipelineTokensPerS: pipe.tokensPerS };
      o.log(`merge rounds: mean ${measured.upMergeMs.toFixed(0)} ms, median ${median(up.mergeMs)} ms`);
      const errors = (p: typeof shared): number[] => [relErr(p.up.tokensPerS, measured.upTokensPerS), relErr(p.up.mergeMs, measured.upMergeMs), relErr(p.pipeline.tokensPerS, measured.pipelineTokensPerS)];
      const error = Math.max(...errors(shared));
      o.log(`errors (up tokens/s, up merge, pipeline): ${errors(shared).map((e) => e.toFixed(3)).join(', ')}; with one engine measurement after both runs: ${errors(oneMeasure).map((e) => e.toFixed(3)).join(', ')}`);
      return [
        { bench: 'scale.sim_calibration_error', value: Number(error.toFixed(3)), unit: 'ratio' },
        { bench: 'scale.sim_calibration.host_crowded_rate', value: Number(crowding.crowdedRate.toFixed(3)), unit: 'ratio' },
        // the orchestrator's check of an uploaded pseudo-gradient, per value (src/orchestrator/training/merge-checks.ts sliceReach and the blob id), mean of the idle measurements between and after the runs
        { bench: 'scale.sim_calibration.merge_check_ns_per_value', value: Number((mergeWork.checkMsPerParam * 1e6).toFixed(2)), unit: 'ns' },
        { bench: 'scale.sim_calibration_error.independent', value: Number(Math.max(...errors(independent)).toFixed(3)), unit: 'ratio' },
        { bench: 'scale.sim_calibration.pipeline.measured_tokens_per_s', value: Math.round(measured.pipelineTokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.pipeline.predicted_tokens_per_s', value: Math.round(shared.pipeline.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.measured_tokens_per_s', value: Math.round(measured.upTokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.predicted_tokens_per_s', value: Math.round(shared.up.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.up.measured_merge_ms', value: Math.round(measured.upMergeMs), unit: 'ms' },
        { bench: 'scale.sim_calibration.up.predicted_merge_ms', value: Math.round(shared.up.mergeMs), unit: 'ms' },
        { bench: 'scale.sim_calibration.up.predicted_tokens_per_s.independent', value: Math.round(independent.up.tokensPerS), unit: 'tokens/s' },
        { bench: 'scale.sim_calibration.pipeline.predicted_tokens_per_s.independent', value: Math.round(independent.pipeline.tokensPerS), unit: 'tokens/s' },
      ];
    },
  },
];
