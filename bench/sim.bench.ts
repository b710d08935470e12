// Simulator benches (src/sim/, docs/simulation.md), group 'scale':
//   scale.plan_10k_miners.ms   the real planner (planPlacement, stage count
//                              chosen) on 10,000 miners drawn from the built-in
//                              hardware table for gpt-100b, batch 1 (with the
//                              default batch of 12 one block needs 140 GB, more
//                              than any class has): median of REPS after a warm-up
//   scale.simulate_10k_1h.s    `simulate` of the same network for 1 simulated
//                              hour with the table's churn: wall seconds
import { planPlacement } from '../src/planner/placement.ts';
import { COORDINATOR_DEFAULTS } from '../src/orchestrator/training/coordinator.ts';
import { DEFAULT_HARDWARE, drawMiner } from '../src/sim/hardware.ts';
import { simModel } from '../src/sim/models.ts';
import { Rng } from '../src/sim/rng.ts';
import { simOptions, simulate } from '../src/sim/simulate.ts';
import { median, type Bench, type BenchOptions, type BenchResult } from './harness.ts';

const MINERS = 10_000;
const MODEL = 'gpt-100b';
const BATCH = 1;
const REPS = 5;
const SEED = 1;

async function planBench(options: BenchOptions): Promise<BenchResult[]> {
  const rng = new Rng(SEED);
  const miners = Array.from({ length: MINERS }, (_, i) => drawMiner(DEFAULT_HARDWARE, rng, i)).map((m) => ({ id: m.id, gflops: m.gflops, memoryBytes: m.memoryBytes }));
  const input = { config: simModel(MODEL), miners, batchSize: BATCH, slots: COORDINATOR_DEFAULTS.slots };
  const first = planPlacement(input);
  options.log(`${MODEL} on ${MINERS} miners: ${first.stages.length} stages, ${first.stages.reduce((a, s) => a + s.miners.length, 0)} miners placed, bottleneck ${Math.round(first.bottleneckTokensPerS)} tokens/s`);
  const times: number[] = [];
  for (let r = 0; r < REPS; r++) {
    const t = performance.now();
    planPlacement(input);
    times.push(performance.now() - t);
  }
  const ms = median(times);
  options.log(`planPlacement: ${ms.toFixed(0)} ms (median of ${REPS})`);
  return [{ bench: 'scale.plan_10k_miners.ms', value: Number(ms.toFixed(1)), unit: 'ms' }];
}

async function simulateBench(options: BenchOptions): Promise<BenchResult[]> {
  const t = performance.now();
  const r = simulate(simOptions({ modelName: MODEL, miners: MINERS, hours: 1, batchSize: BATCH, seed: SEED }));
  const s = (performance.now() - t) / 1000;
  options.log(`simulate ${MODEL}, ${MINERS} miners, 1 h: ${s.toFixed(1)} s wall, ${r.events} events, ${r.tokensPerS.toFixed(1)} tokens/s, ${r.churn.left} left`);
  return [{ bench: 'scale.simulate_10k_1h.s', value: Number(s.toFixed(2)), unit: 's' }];
}

export const simBenches: Bench[] = [{ group: 'scale', run: async (o) => [...(await planBench(o)), ...(await simulateBench(o))] }];
