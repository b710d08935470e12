// nbcli simulate: the real planner, routing rules, deadlines, merge schedule
// and scoring driven over simulated time (src/sim/, docs/simulation.md).
import { isMemoryModelName, MEMORY_MODELS } from '../../sim/memory-models.ts';
import { writeFileSync } from 'node:fs';
import type { Command } from 'commander';
import { NimbleError } from '../../protocol/errors.ts';
import { PlanError } from '../../planner/errors.ts';
import { isCodec } from '../../protocol/codec.ts';
import type { ActivationCodec } from '../../protocol/messages.ts';
import { COORDINATOR_DEFAULTS } from '../../orchestrator/training/coordinator.ts';
import { chartSvg } from '../../sim/chart.ts';
import { DEFAULT_HARDWARE, loadHardwareFile } from '../../sim/hardware.ts';
import { simModel } from '../../sim/models.ts';
import { simOptions, simulate } from '../../sim/simulate.ts';
import { ROUTE_RULES, type RouteRule, type SimOptions, type SimReport } from '../../sim/types.ts';
import { emit, parsePositiveInt } from '../common.ts';

interface Flags {
  miners: string;
  model: string;
  hours: string;
  churn: string;
  hardware?: string;
  seed: string;
  json?: boolean;
  chart?: string;
  mergeEvery?: string;
  codec: string;
  memoryModel: string;
  mergeBytesPerParam?: string;
  stages?: string;
  batchSize?: string;
  deadline?: string;
  slots?: string;
  activationRatio?: string;
  route: string;
  maxEvents?: string;
}

function number(name: string, value: string, min: number, max: number): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < min || n > max) throw new NimbleError('invalid', `${name} must be a number in [${min}, ${max}], got '${value}'`);
  return n;
}

/** simOptions, its refusals worded as the CLI's. */
function validOptions(input: Parameters<typeof simOptions>[0]): SimOptions {
  try {
    return simOptions(input);
  } catch (e) {
    if (e instanceof RangeError) throw new NimbleError('invalid', e.message);
    throw e;
  }
}

export function registerSimulate(program: Command): void {
  program
    .command('simulate')
    .description('simulate the network over simulated time: the real planner, routing, deadlines, merges and scoring on miners drawn from a hardware table')
    .requiredOption('--miners <n>', 'miners at the start')
    .requiredOption('--model <name>', 'gpt-tiny, gpt-small, gpt-125m, gpt-1b, gpt-10b, gpt-100b, ...')
    .option('--hours <h>', 'simulated hours', '1')
    .option('--churn <x>', "multiplier of the table's leave rates (0: nobody leaves)", '1')
    .option('--hardware <file>', 'a JSON hardware table (docs/simulation.md) instead of the built-in one')
    .option('--seed <n>', 'random seed (same seed, same result)', '1')
    .option('--merge-every <h>', 'inner steps per replica between merges (default: the orchestrator default, 100)')
    .option('--codec <codec>', 'activation codec: f32, f16 or int8-row', 'f16')
    .option('--activation-ratio <r>', 'what-if: activation and gradient frames compressed this many times more than the codec does (default 1: the real frames)')
    .option('--route <rule>', `how a sender picks the next hop: ${ROUTE_RULES.join(', ')} (what-if: two weighted draws, the shorter queue for its speed)`, 'weighted')
    .option('--merge-bytes-per-param <b>', 'bytes per parameter of merge frames (default: the real int8-block frames, ~1.02)')
    .option('--memory-model <name>', `what a miner keeps per parameter and activation: ${Object.keys(MEMORY_MODELS).join(', ')} (what-ifs; engine is what the engines do, docs/simulation.md)`, 'engine')
    .option('--stages <n>', 'number of stages (default: the planner chooses)')
    .option('--batch-size <n>', 'sequences per microbatch (default 12)')
    .option('--slots <n>', `activation slots per miner: microbatches a miner holds in flight, which also sets how many the pipeline may hold (default: the orchestrator's, ${COORDINATOR_DEFAULTS.slots})`)
    .option('--deadline <s>', 'microbatch deadline, seconds (default: the orchestrator default, 15)')
    .option('--max-events <n>', 'give up after this many events, a guard against runs that would take hours (default 200,000,000: some 25 minutes for 10,000 miners in stages of hundreds)')
    .option('--chart <file.svg>', 'write utilization and tokens/s over time as an SVG image')
    .option('--json', 'print the report as JSON')
    .action((flags: Flags) => {
      const miners = parsePositiveInt('--miners', flags.miners, 1);
      if (miners > 1_000_000) throw new NimbleError('invalid', `--miners must be at most 1,000,000, got ${miners}`);
      let config;
      try {
        config = simModel(flags.model);
      } catch (e) {
        throw new NimbleError('invalid', (e as Error).message);
      }
      if (!isCodec(flags.codec) || flags.codec === 'int8-block') throw new NimbleError('invalid', `--codec must be f32, f16 or int8-row, got '${flags.codec}'`);
      if (!isMemoryModelName(flags.memoryModel)) throw new NimbleError('invalid', `--memory-model must be one of ${Object.keys(MEMORY_MODELS).join(', ')}, got '${flags.memoryModel}'`);
      const options = validOptions({
        modelName: flags.model,
        config,
        miners,
        hours: number('--hours', flags.hours, 1e-3, 24 * 365),
        churn: number('--churn', flags.churn, 0, 1000),
        seed: number('--seed', flags.seed, 0, 2 ** 32 - 1),
        hardware: flags.hardware ? loadHardwareFile(flags.hardware) : DEFAULT_HARDWARE,
        codec: flags.codec as ActivationCodec,
        route: flags.route as RouteRule,
        memoryModel: flags.memoryModel,
        ...(flags.mergeEvery !== undefined ? { mergeEvery: parsePositiveInt('--merge-every', flags.mergeEvery, 1) } : {}),
        ...(flags.mergeBytesPerParam !== undefined ? { mergeBytesPerParam: number('--merge-bytes-per-param', flags.mergeBytesPerParam, 1e-6, 4) } : {}),
        ...(flags.stages !== undefined ? { stages: parsePositiveInt('--stages', flags.stages, 1) } : {}),
        ...(flags.batchSize !== undefined ? { batchSize: parsePositiveInt('--batch-size', flags.batchSize, 1) } : {}),
        ...(flags.slots !== undefined ? { slots: parsePositiveInt('--slots', flags.slots, 1) } : {}),
        ...(flags.activationRatio !== undefined ? { activationRatio: number('--activation-ratio', flags.activationRatio, 1, 1e6) } : {}),
        ...(flags.deadline !== undefined ? { deadlineMs: number('--deadline', flags.deadline, 0.001, 86_400) * 1000 } : {}),
        ...(flags.maxEvents !== undefined ? { maxEvents: parsePositiveInt('--max-events', flags.maxEvents, 1) } : {}),
      });
      let report: SimReport;
      try {
        report = simulate(options);
      } catch (e) {
        if (e instanceof PlanError || e instanceof RangeError) throw new NimbleError('invalid', `cannot simulate: ${e.message}`);
        throw e;
      }
      if (flags.chart) writeFileSync(flags.chart, chartSvg(report.series, `${report.model} on ${report.miners} simulated miners, seed ${report.seed}`));
      emit(flags, report, () => describeReport(report));
    });
}

const pct = (x: number): string => `${(100 * x).toFixed(1)}%`;
const gb = (b: number): string => `${(b / 1e9).toFixed(2)} GB`;
const num = (x: number, d = 0): string => x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });

/** The human view of a report. */
export function describeReport(r: SimReport): string {
  const lines = [
    `${r.model} (${num(r.params / 1e6, 1)} M parameters) on ${num(r.miners)} miners, ${r.hours} simulated h, seed ${r.seed}; batch ${r.batchSize}, ${r.slots} slots, activations ${r.codec}${r.activationRatio !== 1 ? ` ÷ ${num(r.activationRatio, 1)} (what-if)` : ''}, ${r.route !== 'weighted' ? `route ${r.route} (what-if), ` : ''}memory model ${r.memoryModel}, merge every ${r.mergeEvery}`,
    `stages: ${r.stages.length}; memory per miner up to ${gb(r.memoryPerMinerBytes)}`,
    ...r.stages.map((s, i) => `  stage ${i} [${s.range.from},${s.range.to})  ${num(s.params / 1e6, 1)} M params  ${gb(s.memoryBytes)}  ${s.replicas} replicas (${s.replicasAtEnd} at the end)  planned ${num(s.plannedTokensPerS)} tokens/s`),
    `tokens/s: ${num(r.tokensPerS, 1)} (planner's compute bound ${num(r.plannedTokensPerS)}); ${num(r.microbatchesDone)} microbatches`,
    `utilization: ${pct(r.utilization)} of all miners' time, ${pct(r.utilizationAssigned)} of the time of miners holding a stage`,
    `bytes per token: ${num(r.bytesPerToken.total, 1)} (activations and gradients ${num(r.bytesPerToken.activations, 1)}, merges ${num(r.bytesPerToken.merges, 1)})`,
    `merges: ${r.merges.rounds} rounds, mean ${num(r.merges.meanMs / 1000, 2)} s, longest ${num(r.merges.maxMs / 1000, 2)} s, ${num(r.merges.bytesPerReplicaPerRound / 1e6, 1)} MB per replica per round`,
    `dropped: ${r.dropped.units} units charged, ${r.dropped.reissued} re-issued (${r.dropped.byDeadline} deadline, ${r.dropped.byChurn} churn, ${r.dropped.noPeer} no peer), ${num(r.dropped.wastedComputeMs / 1000, 1)} s of compute wasted`,
    `churn: ${r.churn.left} left, ${r.churn.joined} joined, ${r.churn.replans} replans (${r.churn.fullReplans} fresh), ${r.churn.moves} moves`,
    'earnings per class:',
    ...r.classes.map((c) => `  ${c.hardware.padEnd(14)} ${String(c.miners).padStart(6)} miners  ${String(c.assignedAtEnd).padStart(6)} holding a stage  utilization ${pct(c.utilization).padStart(6)}  ${num(c.earnedNim, 2)} NIM  ${num(c.nimPerMinerHour, 4)} NIM per miner-hour`),
  ];
  if (r.stalled) lines.push(`stalled: ${r.stalled}`);
  return lines.join('\n');
}
