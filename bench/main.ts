// npm run bench [-- --json] [--convergence] [--only GROUP[,GROUP]]
import type { Bench, BenchResult } from './harness.ts';
import { engineBenches } from './engine.bench.ts';
import { chainBenches } from './chain.bench.ts';
import { protocolBenches } from './protocol.bench.ts';
import { mergeBenches } from './merge.bench.ts';
import { networkBenches } from './network.bench.ts';
import { spotCheckBenches } from './spot-check.bench.ts';
import { floodBenches } from './flood.bench.ts';
import { trustBenches } from './trust.bench.ts';
import { spamBenches } from './jobs-spam.bench.ts';
import { jobPlanBenches } from './jobs-plan.bench.ts';
import { jobSubmitBenches } from './jobs-submit.bench.ts';
import { inferenceBenches } from './inference.bench.ts';
import { dashboardBenches } from './dashboard.bench.ts';
import { webgpuBenches } from './webgpu.bench.ts';
import { gcBenches } from './gc.bench.ts';
import { s3Benches } from './s3.bench.ts';
import { simBenches } from './sim.bench.ts';
import { pgBenches } from './pg.bench.ts';
import { simCalibrationBenches } from './sim-calibration.bench.ts';
import { gpt2MinerBenches } from './gpt2-miner.bench.ts';
import { modelsBenches } from './models.bench.ts';
import { tinyllamaBenches } from './tinyllama.bench.ts';

const registry: Bench[] = [...engineBenches, ...protocolBenches, ...chainBenches, ...mergeBenches, ...spotCheckBenches, ...networkBenches, ...floodBenches, ...trustBenches, ...spamBenches, ...jobPlanBenches, ...jobSubmitBenches, ...inferenceBenches, ...dashboardBenches, ...webgpuBenches, ...gcBenches, ...s3Benches, ...simBenches, ...pgBenches, ...simCalibrationBenches, ...modelsBenches, ...gpt2MinerBenches, ...tinyllamaBenches];

const args = process.argv.slice(2);
const json = args.includes('--json');
const convergence = args.includes('--convergence');
const onlyAt = args.indexOf('--only');
const only = onlyAt >= 0 ? new Set(args[onlyAt + 1]?.split(',')) : undefined;

const results: BenchResult[] = [];
for (const bench of registry) {
  if (bench.convergence && !convergence) continue;
  if (only && !only.has(bench.group)) continue;
  const log = (line: string): void => void process.stderr.write(`[${bench.group}] ${line}\n`);
  for (const r of await bench.run({ convergence, log })) {
    results.push(r);
    if (json) process.stdout.write(JSON.stringify(r) + '\n');
  }
}
if (!json) {
  const width = Math.max(...results.map((r) => r.bench.length), 5);
  process.stdout.write(`${'bench'.padEnd(width)}  ${'value'.padStart(12)}  unit\n`);
  for (const r of results) {
    const v = Number.isInteger(r.value) ? String(r.value) : r.value.toPrecision(5);
    process.stdout.write(`${r.bench.padEnd(width)}  ${v.padStart(12)}  ${r.unit}\n`);
  }
}
process.exit(0);
