// Job planning bench: matching a mix of jobs over a large pool of miners
// (src/jobs/matching.ts, which plans each job with src/jobs/plan.ts).
//   jobs.plan_1000_miners.ms   median wall time of one matchJobs call: a
//                              gpt-small job whose 3 h deadline needs a group,
//                              a gpt-tiny job and the spam MLP, all waiting,
//                              over 1,000 miners with seeded random GFLOP/s
//                              (5-200), memory (64 MB-16 GB, log-uniform) and
//                              upload bandwidth (10 Mbit/s-1 Gbit/s, log-uniform)
// One thread; one warm-up call, then the median of REPS timed calls.
import { matchJobs, type QueuedJob } from '../src/jobs/matching.ts';
import type { PoolMiner } from '../src/jobs/plan.ts';
import { resolveJobSpec, validateJobSpec } from '../src/jobs/spec.ts';
import { median, type Bench, type BenchOptions, type BenchResult } from './harness.ts';

const MINERS = 1000;
const REPS = 9;
const SEED = 20_240_601;

/** `n` miners with varied figures, the same for a given seed. */
export function simulatedMiners(n: number, seed: number): PoolMiner[] {
  let s = seed >>> 0 || 1;
  const rnd = (): number => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
  return Array.from({ length: n }, (_, i) => ({
    id: `miner-${String(i).padStart(4, '0')}`,
    gflops: 5 + 195 * rnd(),
    memoryBytes: Math.round(64e6 * 2 ** (8 * rnd())),
    bandwidthMbps: 10 * 100 ** rnd(),
  }));
}

/** The 3-job mix, all waiting: a group job, a small GPT and an MLP classifier. */
export function jobMix(now: number): QueuedJob[] {
  const spec = (value: unknown) => resolveJobSpec(validateJobSpec(value));
  return [
    { id: 'gpt-small', job: spec({ name: 'small', model: 'gpt-small', data: 'moby-dick', training: { steps: 200_000 }, limits: { deadline: '3h' } }), offerNimPerPetaflop: 1.5, queuedAt: now - 60_000 },
    { id: 'gpt-tiny', job: spec({ name: 'tiny', model: 'gpt-tiny', data: 'moby-dick', training: { steps: 20_000 }, limits: { deadline: '2h' } }), offerNimPerPetaflop: 1, queuedAt: now - 120_000 },
    { id: 'spam', job: spec({ name: 'spam', model: { type: 'mlp', inputs: 4096, hidden: [64], classes: 2 }, data: 'spam-assassin', training: { steps: 2000 } }), offerNimPerPetaflop: 1, queuedAt: now - 30_000 },
  ];
}

async function planBench(options: BenchOptions): Promise<BenchResult[]> {
  const miners = simulatedMiners(MINERS, SEED);
  const now = 1_700_000_000_000;
  const jobs = jobMix(now);
  const first = matchJobs(jobs, miners, now);
  for (const d of first.decisions) {
    const what = d.action === 'start' ? `${d.layout.stages} × ${d.layout.replicas} on ${d.miners.length} miner(s), ${Math.round(d.layout.itemsPerS)} items/s` : d.action === 'wait' ? d.reason : 'keeps its miners';
    options.log(`${d.id}: ${d.action} ${what}`);
  }
  const times: number[] = [];
  for (let r = 0; r < REPS; r++) {
    const t = performance.now();
    matchJobs(jobs, miners, now);
    times.push(performance.now() - t);
  }
  const ms = median(times);
  options.log(`matchJobs over ${MINERS} miners: ${ms.toFixed(1)} ms (median of ${REPS})`);
  return [{ bench: 'jobs.plan_1000_miners.ms', value: Number(ms.toFixed(2)), unit: 'ms' }];
}

export const jobPlanBenches: Bench[] = [{ group: 'jobs-plan', run: planBench }];
