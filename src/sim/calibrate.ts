// The simulator on a described local network (docs/simulation.md,
// "Calibration"): the miners as they reported themselves at join (GFLOP/s,
// memory, the bandwidth of their probe to the orchestrator), loopback
// links, the run's model, stages, batch and merge interval; and the engine's
// real job times on this machine, measured by a short microbenchmark
// (measureEngine) instead of FLOPs ÷ GFLOP/s. predictLocal runs the
// simulator on it and returns what the bench compares with the real network:
// tokens/s over whole merge cycles and the merge round's time.
import { loadCorpus } from '../data/corpus.ts';
import { Engine } from '../engine/engine.ts';
import { measureCpuHardware } from '../miner/hardware.ts';
import type { JobTimeSums } from '../miner/peer-api.ts';
import { StageRunner } from '../miner/stage-runner.ts';
import { Throttle } from '../miner/throttle.ts';
import { planPlacement } from '../planner/placement.ts';
import { decodeFrame, encodeFrame } from '../protocol/frame.ts';
import type { ActivationCodec, StageAssignment } from '../protocol/messages.ts';
import type { HardwareTable } from './hardware.ts';
import type { SharedHost } from './host.ts';
import type { MergeWork } from './merge-time.ts';
import { simModel } from './models.ts';
import { simOptions, simulate } from './simulate.ts';
import type { JobTimes, SimOptions } from './types.ts';

/** A miner of the local network, as GET /miners shows what it reported at join. */
export interface LocalMiner {
  name: string;
  gflops: number;
  memoryBytes: number;
  /** its bandwidth probe to the orchestrator (the fastest of three signed 1 MiB uploads), Mbit/s */
  bandwidthMbps: number;
  threads: number;
  /** its `--throttle` (default 1) */
  throttle?: number;
}

/** A local network and the run it trains. */
export interface LocalNetwork {
  miners: LocalMiner[];
  model: string;
  stages: number;
  batchSize: number;
  mergeEvery: number;
  codec?: ActivationCodec;
}

/** One-way latency of a loopback hop: the kernel's part of it is microseconds; HTTP and signing are in the measured bandwidth and job times. */
export const LOOPBACK_LATENCY_MS = 0.05;

/** The hardware table of a local network: one class per miner, exactly one miner each, nobody leaves. */
export function localHardware(net: LocalNetwork): HardwareTable {
  return {
    classes: net.miners.map((m) => ({
      name: m.name,
      share: 1,
      count: 1,
      gflops: m.gflops,
      memoryGB: m.memoryBytes / 1e9,
      upMbps: m.bandwidthMbps,
      downMbps: m.bandwidthMbps,
      latencyMs: LOOPBACK_LATENCY_MS,
      sessionHours: 1e6,
      ...(m.throttle !== undefined && m.throttle < 1 ? { throttle: m.throttle } : {}),
    })),
  };
}

/** The stage cut the orchestrator's planner makes for this network (what the miners run). */
export function localStages(net: LocalNetwork): { from: number; to: number }[] {
  const config = simModel(net.model);
  const plan = planPlacement({ config, miners: net.miners.map((m, i) => ({ id: `m${i}`, gflops: m.gflops, memoryBytes: m.memoryBytes })), stages: net.stages, batchSize: net.batchSize, slots: simOptions({ modelName: net.model, miners: 1 }).slots });
  return plan.stages.map((s) => s.range);
}

/** What the simulator is told about a local network beyond its description (predictLocal, localOptions). */
export interface LocalModel {
  /** the engine's measured job times (measureEngine); undefined: FLOPs ÷ the miners' GFLOP/s */
  jobTimes?: JobTimes;
  /** simulated hours (long enough for many merge cycles); default 1 */
  hours?: number;
  /** the machine's cores shared by every process; undefined: each miner a machine of its own */
  host?: SharedHost;
  /** a merge round's measured compute (./merge-work.ts measureMergeWork); undefined: not modelled */
  mergeWork?: MergeWork;
}

/** Simulator options for a local network (no churn). */
export function localOptions(net: LocalNetwork, model: LocalModel = {}): SimOptions {
  return simOptions({
    modelName: net.model,
    miners: net.miners.length,
    hardware: localHardware(net),
    stages: net.stages,
    batchSize: net.batchSize,
    mergeEvery: net.mergeEvery,
    codec: net.codec ?? 'f16',
    churn: 0,
    hours: model.hours ?? 1,
    ...(model.jobTimes ? { jobTimes: model.jobTimes } : {}),
    ...(model.host ? { host: model.host } : {}),
    ...(model.mergeWork ? { mergeWork: model.mergeWork } : {}),
  });
}

export interface LocalPrediction {
  tokensPerS: number;
  /** mean merge round, opened → done, ms (0: no merge) */
  mergeMs: number;
  merges: number;
}

/** The simulator's tokens/s and merge time for a local network. */
export function predictLocal(net: LocalNetwork, model: LocalModel = {}): LocalPrediction {
  const r = simulate(localOptions(net, model));
  return { tokensPerS: r.tokensPerS, mergeMs: r.merges.meanMs, merges: r.merges.rounds };
}

/** CPU a local network's processes spent per trained microbatch, as measured (bench/sim-calibration.bench.ts). */
export interface MeasuredCpu {
  /** per stage: a miner's process CPU ms per microbatch (the mean over the stage's replicas) */
  minerMsPerMicrobatch: number[];
  orchestratorMsPerMicrobatch: number;
  /** per stage: the part of minerMsPerMicrobatch its miners spent in their jobs, as they measured it (absent: not measured) */
  minerJobMsPerMicrobatch?: number[];
  /** the heartbeats the orchestrator answered over the same window, per microbatch, and the miners that sent them (absent: not counted) */
  heartbeats?: { perMicrobatch: number; miners: number };
}

/** The CPU of one heartbeat, measured on an idle network (its miners joined, no run): the orchestrator's, and the sending miner's. */
export interface HeartbeatCpu {
  orchestratorMs: number;
  minerMs: number;
}

/**
 * The shared host of a local network: `cores`, and what its processes spent
 * beyond the engine's jobs. A stage's hop overhead is its miners' CPU per
 * microbatch less what they spent in their jobs: as the miners measured it
 * in the same run when `cpu` has it (the machine's speed drifts between
 * moments, and the difference of two large figures measured apart drifts
 * with it), else the engine's forward and backward of that stage measured
 * idle (`jobTimes`); never below 0. With `heartbeat` (and the heartbeats
 * counted in `cpu`), what the heartbeats cost comes out of both the hop
 * overheads and the orchestrator's CPU per microbatch and is charged per
 * heartbeat instead: a network of more miners sends more of them per
 * microbatch.
 */
export function hostOverheads(cores: number, cpu: MeasuredCpu, jobTimes: JobTimes, heartbeat?: HeartbeatCpu): SharedHost {
  if (cpu.minerMsPerMicrobatch.length !== jobTimes.stages.length) throw new RangeError(`CPU of ${cpu.minerMsPerMicrobatch.length} stages for job times of ${jobTimes.stages.length}`);
  if (cpu.minerJobMsPerMicrobatch && cpu.minerJobMsPerMicrobatch.length !== jobTimes.stages.length) throw new RangeError(`job CPU of ${cpu.minerJobMsPerMicrobatch.length} stages for ${jobTimes.stages.length}`);
  const beats = heartbeat && cpu.heartbeats ? cpu.heartbeats : null;
  const minerBeatsMs = beats ? (beats.perMicrobatch / beats.miners) * heartbeat!.minerMs : 0;
  const orchestratorBeatsMs = beats ? beats.perMicrobatch * heartbeat!.orchestratorMs : 0;
  return {
    cores,
    hopOverheadMs: cpu.minerMsPerMicrobatch.map((ms, s) => Math.max(0, ms - minerBeatsMs - (cpu.minerJobMsPerMicrobatch?.[s] ?? jobTimes.stages[s].forwardMs + jobTimes.stages[s].backwardMs))),
    orchestratorMsPerMicrobatch: Math.max(0, cpu.orchestratorMsPerMicrobatch - orchestratorBeatsMs),
    ...(beats ? { orchestratorMsPerHeartbeat: heartbeat!.orchestratorMs, minerMsPerHeartbeat: heartbeat!.minerMs } : {}),
    ...(jobTimes.jitter !== undefined ? { jobJitter: jobTimes.jitter } : {}),
  };
}

/**
 * SharedHost.crowdedRate from a job's mean time in one process alone on the
 * host (`aloneMs`) and its mean in each of `processes` single-thread
 * processes running it at once (`crowdedMs`, more processes than cores):
 * the share of its fair share each got, undone of the linear ramp of
 * `processRate`. At most 1 (a crowded host that ran faster than fair lost
 * nothing), above 0.
 */
export function crowdedRateOf(aloneMs: number, crowdedMs: number, processes: number, cores: number): number {
  if (!(aloneMs > 0 && crowdedMs > 0)) throw new RangeError(`job times must be positive, got ${aloneMs} and ${crowdedMs} ms`);
  if (!(processes > cores)) throw new RangeError(`crowding needs more processes than cores, got ${processes} on ${cores}`);
  const ofFair = aloneMs / crowdedMs / (cores / processes);
  const crowding = Math.min(1, (processes - cores) / cores);
  return Math.min(1, Math.max(1e-3, 1 - (1 - ofFair) / crowding));
}

const medianOf = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1];

/** Stage `s` of a local network's run as its miner is assigned it (the stage cut of localStages, the run's model, batch and codec). */
export function calibrationStage(net: LocalNetwork, s: number): StageAssignment {
  const ranges = localStages(net);
  return { runId: 'calibration', stage: s, stageCount: ranges.length, from: ranges[s].from, to: ranges[s].to, model: net.model, data: 'moby-dick', batchSize: net.batchSize, seed: 1337, round: 0, stateBlob: null, codec: net.codec ?? 'f16', lr: 1e-3 };
}

/**
 * The engine's job times on one thread of this machine, the way a miner runs
 * them (src/miner/stage-runner.ts: forward with predicted weights kept in a
 * slot, backward with them, AdamW step; the last stage's forward, loss and
 * backward as one job) plus the activation frame's encoding by the sender and
 * decoding by the receiver in the run's codec; and the GFLOP/s the same
 * thread measures the way a miner does at join. Medians of `reps` after a
 * warm-up.
 */
export async function measureEngine(net: LocalNetwork, reps = 7): Promise<JobTimes> {
  const ranges = localStages(net);
  const engine = await Engine.create({ threads: 1 });
  const corpus = loadCorpus('moby-dick');
  try {
    const referenceGflops = measureCpuHardware(engine, new Throttle(1)).gflops;
    const frames = calibrationFrames(net);
    const stages = [];
    // every job's time relative to its kind's median: their spread is the jitter
    const relative: number[] = [];
    for (let s = 0; s < ranges.length; s++) {
      const runner = new StageRunner(engine, calibrationStage(net, s), 1, corpus);
      await runner.ready();
      const fwd: number[] = [];
      const bwd: number[] = [];
      for (let k = 0; k < reps + 2; k++) {
        const t = await stageJobs(runner, k, frames);
        if (k >= 2) {
          fwd.push(t.forwardMs);
          bwd.push(t.backwardMs);
        }
      }
      runner.dispose();
      stages.push({ forwardMs: medianOf(fwd), backwardMs: medianOf(bwd) });
      for (const xs of [fwd, bwd]) {
        const m = medianOf(xs);
        if (m > 0) relative.push(...xs.map((x) => x / m - 1));
      }
    }
    return { referenceGflops, stages, jitter: Math.sqrt(relative.reduce((a, d) => a + d * d, 0) / relative.length) };
  } finally {
    await engine.close();
  }
}

/** A local network's frames as its miners send them: `framed` encodes one in the run's codec and decodes it; `input` stands for every frame a stage receives (activation or activation gradient). */
export interface CalibrationFrames {
  framed(x: Float32Array): Float32Array;
  input: Float32Array;
}

export function calibrationFrames(net: LocalNetwork): CalibrationFrames {
  const config = simModel(net.model);
  const shape: [number, number] = [net.batchSize * config.contextLength, config.channels];
  const codec = net.codec ?? 'f16';
  return {
    framed: (x) => decodeFrame(encodeFrame(x, shape, codec, { runId: 'calibration', microbatch: 1 })).data,
    input: new Float32Array(shape[0] * shape[1]).map((_, i) => Math.sin(i) * 0.1),
  };
}

/**
 * Microbatch `k`'s jobs on a stage as its miner runs them (forward, then
 * backward with the AdamW step; the last stage's forward, loss and backward
 * as one job, counted as its forward), each with the frames it receives
 * decoded and those it sends encoded (`frames`). Wall ms of each.
 */
export async function stageJobs(runner: StageRunner, k: number, { framed, input }: CalibrationFrames): Promise<{ forwardMs: number; backwardMs: number }> {
  const s = runner.assignment.stage;
  let t0 = performance.now();
  if (s === runner.assignment.stageCount - 1) {
    const { dInput } = await runner.forwardBackwardLast(k, k, s === 0 ? null : framed(input));
    if (dInput) framed(dInput);
    return { forwardMs: performance.now() - t0, backwardMs: 0 };
  }
  framed(s === 0 ? await runner.forwardFirst(k, k) : await runner.forwardMiddle(k, framed(input)));
  const forwardMs = performance.now() - t0;
  t0 = performance.now();
  const d = await runner.backward(k, framed(input));
  if (d) framed(d);
  return { forwardMs, backwardMs: performance.now() - t0 };
}

/**
 * The mean of job times measured at several moments (for example just before
 * and just after a run): this machine's speed drifts by 10–20% over minutes,
 * so a run is best described by the measurements that bracket it.
 */
export function averageJobTimes(times: readonly JobTimes[]): JobTimes {
  if (times.length === 0) throw new RangeError('no job times to average');
  const n = times[0].stages.length;
  if (times.some((t) => t.stages.length !== n)) throw new RangeError('job times of different stage counts');
  const mean = (f: (t: JobTimes) => number): number => times.reduce((a, t) => a + f(t), 0) / times.length;
  const jitters = times.flatMap((t) => (t.jitter === undefined ? [] : [t.jitter]));
  return {
    referenceGflops: mean((t) => t.referenceGflops),
    stages: Array.from({ length: n }, (_, s) => ({ forwardMs: mean((t) => t.stages[s].forwardMs), backwardMs: mean((t) => t.stages[s].backwardMs) })),
    ...(jitters.length ? { jitter: jitters.reduce((a, x) => a + x, 0) / jitters.length } : {}),
  };
}

/**
 * The spread of the jobs run between two readings of the same miners' sums
 * (their `GET /health` `jobTimes`):
 * each miner's and kind's coefficient of variation, pooled by jobs (the root
 * of the mean squared relative deviation). Kinds and miners with fewer than
 * two jobs between the readings count for nothing; none at all gives 0.
 */
export function jobSpreadBetween(pairs: readonly (readonly [before: JobTimeSums, after: JobTimeSums])[]): number {
  let jobs = 0;
  let weighted = 0;
  for (const [a, b] of pairs) {
    const n = b.count - a.count;
    if (n < 2) continue;
    const mean = (b.ms - a.ms) / n;
    if (!(mean > 0)) continue;
    const variance = Math.max(0, (b.msSquared - a.msSquared) / n - mean * mean);
    jobs += n;
    weighted += (n * variance) / (mean * mean);
  }
  return jobs ? Math.sqrt(weighted / jobs) : 0;
}
