// Job start-up bench on a local network: an orchestrator (in this process)
// and two idle miner child processes on 127.0.0.1, as in network.bench.ts.
// JOBS gpt-micro jobs of 1,000 steps (batch 8), one after the other, each
// cancelled once executing and the next submitted when every miner is idle.
//   jobs.submit_to_executing.ms         median time from POST /jobs
//                                       (JobClient.submit) to GET /jobs/:id
//                                       answering 'executing' (polled every
//                                       POLL_MS)
//   jobs.submit_to_executing.max_ms     the slowest of them
//   jobs.submit_to_executing.stream_ms  median time to the 'executing' event
//                                       on the job's event stream (what
//                                       `nbcli job follow` shows), followed at
//                                       the same time
// The orchestrator ticks every 200 ms (its default): placement waits up to a
// tick, the first microbatches go out a tick or two later.
import { JobClient } from '../src/api/job-client.ts';
import type { JobSpec } from '../src/jobs/spec.ts';
import { isFinalJobStatus } from '../src/jobs/status.ts';
import { median, type Bench, type BenchOptions, type BenchResult } from './harness.ts';
import { startNet, stopNet, type Net } from './network.bench.ts';

const MINERS = 2;
const JOBS = 5;
const IDLE_TIMEOUT_MS = 60_000;
const EXECUTING_TIMEOUT_MS = 60_000;
const POLL_MS = 25;

/** A small job like the 'gpt' template (src/jobs/templates.ts): long enough not to end before it is cancelled. */
export function submitBenchSpec(i: number): JobSpec {
  return {
    name: `bench-submit-${i}`,
    model: 'gpt-micro',
    data: 'moby-dick',
    training: { steps: 1000, batchSize: 8, learningRate: 0.001, mergeEvery: 100, seed: 1337 },
    checkpointEvery: 1000,
    limits: { timeout: '10m', idleTimeout: '2m', deadline: '10m' },
  };
}

/** Resolves once `n` miners are registered and idle. */
async function waitIdle(net: Net, n: number): Promise<void> {
  const end = performance.now() + IDLE_TIMEOUT_MS;
  while (net.orch.coordinator.idleMiners().length < n) {
    if (performance.now() > end) throw new Error(`only ${net.orch.coordinator.idleMiners().length} of ${n} miners idle after ${IDLE_TIMEOUT_MS / 1000} s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

interface StartTimes {
  /** until GET /jobs/:id answered 'executing' */
  polledMs: number;
  /** until the 'executing' event arrived on the event stream */
  streamedMs: number;
}

/** Milliseconds from `t0` until the job's event stream delivers its 'executing' status event. */
async function streamedExecuting(jobs: JobClient, id: string, t0: number, signal: AbortSignal): Promise<number> {
  for await (const u of jobs.follow(id, 0, signal)) {
    if (u.kind === 'event' && u.event.kind === 'status' && u.event.status === 'executing') return performance.now() - t0;
    if (u.kind === 'end') break;
  }
  throw new Error(`job ${id} ended before its stream said executing`);
}

/** Milliseconds from `t0` until GET /jobs/:id answers 'executing'. */
async function polledExecuting(jobs: JobClient, id: string, t0: number): Promise<number> {
  for (;;) {
    const job = await jobs.get(id);
    if (job.status === 'executing') return performance.now() - t0;
    if (isFinalJobStatus(job.status)) throw new Error(`job ${id} ended before executing: ${job.status} (${job.message})`);
    if (performance.now() - t0 > EXECUTING_TIMEOUT_MS) throw new Error(`job ${id} not executing after ${EXECUTING_TIMEOUT_MS / 1000} s: ${job.status} (${job.message})`);
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

/** Submits one job, times it to 'executing' both ways, then cancels it. */
async function submitToExecuting(jobs: JobClient, spec: JobSpec): Promise<StartTimes> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), EXECUTING_TIMEOUT_MS);
  const t0 = performance.now();
  const job = await jobs.submit(spec);
  let times: StartTimes;
  try {
    const streamed = streamedExecuting(jobs, job.id, t0, abort.signal);
    streamed.catch(() => undefined); // awaited below; a poll failure must not leave it unhandled
    const polledMs = await polledExecuting(jobs, job.id, t0);
    times = { polledMs, streamedMs: await streamed };
  } catch (err) {
    await jobs.cancel(job.id).catch(() => undefined); // it may have ended already
    throw err;
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
  await jobs.cancel(job.id);
  return times;
}

async function submitBench(options: BenchOptions): Promise<BenchResult[]> {
  options.log(`starting an orchestrator and ${MINERS} miners`);
  const net = await startNet(Array.from({ length: MINERS }, () => ({ threads: 1 })));
  try {
    const jobs = new JobClient(net.api);
    const times: StartTimes[] = [];
    for (let i = 0; i < JOBS; i++) {
      await waitIdle(net, MINERS);
      const t = await submitToExecuting(jobs, submitBenchSpec(i));
      options.log(`job ${i + 1}: executing ${t.polledMs.toFixed(0)} ms after POST /jobs (its event stream said so after ${t.streamedMs.toFixed(0)} ms)`);
      times.push(t);
    }
    const polled = times.map((t) => t.polledMs);
    const ms = median(polled);
    options.log(`submit to executing: ${ms.toFixed(0)} ms (median of ${JOBS}; ${polled.map((x) => x.toFixed(0)).join(', ')})`);
    return [
      { bench: 'jobs.submit_to_executing.ms', value: Math.round(ms), unit: 'ms' },
      { bench: 'jobs.submit_to_executing.max_ms', value: Math.round(Math.max(...polled)), unit: 'ms' },
      { bench: 'jobs.submit_to_executing.stream_ms', value: Math.round(median(times.map((t) => t.streamedMs))), unit: 'ms' },
    ];
  } finally {
    await stopNet(net);
  }
}

export const jobSubmitBenches: Bench[] = [{ group: 'jobs-submit', run: submitBench }];
