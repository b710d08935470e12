// nbcli job plan <file>: what a job needs (parameters, FLOPs, memory per
// stage) and which live miners would train it, how fast, for how much NIM
// (src/jobs/plan.ts). The miners come from the orchestrator's public miner
// list; when it cannot be reached the plan says so and explains the model's
// needs only.
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { DEFAULT_PRICING, formatJobPlan, planJob, type JobPlan, type PoolMiner } from '../../jobs/plan.ts';
import { resolveJobSpec } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, withCommonOptions, type CommonOptions } from '../common.ts';
import { isLocalData, packJobData } from './job-data.ts';
import { readJobSpec } from './job-spec-file.ts';

interface PlanFlags extends CommonOptions {
  orchestrator: string;
  price?: string;
}

/** Adds `plan <file>` to the `job` command. */
export function registerJobPlan(job: Command): void {
  withCommonOptions(
    job
      .command('plan <file>')
      .description("what a job needs and which live miners would train it: layouts, speed, time, cost, and what an upgrade buys")
      .option('--orchestrator <url>', 'the network whose live miners to plan on', DEFAULT_ORCHESTRATOR)
      .option('--price <nim>', `NIM per petaflop of training (default ${DEFAULT_PRICING.nimPerPetaflop})`),
  ).action(async (file: string, flags: PlanFlags) => {
    const spec = readJobSpec(file);
    const resolved = resolveJobSpec(spec);
    const price = flags.price === undefined ? DEFAULT_PRICING.nimPerPetaflop : Number(flags.price);
    if (!(Number.isFinite(price) && price > 0)) throw new NimbleError('invalid', `--price must be a positive number of NIM per PFLOP, got '${flags.price}'`);
    const { miners, unreachable } = await liveMiners(flags.orchestrator);
    const plan: JobPlan = planJob(resolved, miners, { nimPerPetaflop: price });
    if (unreachable !== null) {
      plan.explanation.unshift(`${unreachable.charAt(0).toUpperCase()}${unreachable.slice(1)}: planned against no miners, so this is the model's needs only.`);
    }
    if (isLocalData(spec.data)) {
      // its local data is packed as submit would pack it: what it would upload, or why it cannot
      const packed = packJobData(spec, file);
      plan.explanation.push(`Data: ${spec.data} packs to ${packed.bytes.length.toLocaleString('en-US')} bytes (${packed.files.length} file${packed.files.length === 1 ? '' : 's'}${packed.skipped.length ? `, ${packed.skipped.length} skipped: ${packed.skipped.slice(0, 3).map((x) => x.path).join(', ')}${packed.skipped.length > 3 ? ', …' : ''}` : ''}) as ${packed.id}; job submit uploads it once.`);
    }
    emit(flags, plan, () => formatJobPlan(plan));
  });
}

/** The orchestrator's live miners as the planner sees them, or none and why when it cannot be reached. */
async function liveMiners(url: string): Promise<{ miners: PoolMiner[]; unreachable: string | null }> {
  try {
    const list = await new OrchestratorClient(url, { timeoutMs: 5_000 }).miners();
    const miners = list.filter((m) => m.alive).map((m) => ({ id: m.id, name: m.name, gflops: m.gflops, memoryBytes: m.memoryBytes, bandwidthMbps: m.bandwidthMbps }));
    return { miners, unreachable: null };
  } catch (err) {
    if (err instanceof NimbleError && err.code === 'unreachable') return { miners: [], unreachable: err.message };
    throw err;
  }
}
