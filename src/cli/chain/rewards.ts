// nbcli rewards: each epoch's split (miner, score, NIM, transaction), from a
// running orchestrator's API (GET /epochs), with the units of inference each
// miner served and what callers' credit paid for it, to miners and model
// owners (docs/inference.md, "Payment"). What reached the chain is also in
// `nbcli wallet balance` (rewards per epoch, from the chain's events).
import { displayNim } from '../../chain/nim-display.ts';
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import type { EpochView } from '../../api/schemas.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, withCommonOptions, type CommonOptions } from '../common.ts';

interface Flags extends CommonOptions {
  epoch?: string;
  orchestrator: string;
}

export function registerRewards(program: Command): void {
  withCommonOptions(
    program
      .command('rewards')
      .description("each epoch's reward split: miner, score, NIM paid, settlement transaction; inference units and inference payments")
      .option('--epoch <id>', 'only this epoch')
      .option('--orchestrator <url>', 'the orchestrator to ask', DEFAULT_ORCHESTRATOR),
  ).action(async (flags: Flags) => {
    let id: number | undefined;
    if (flags.epoch !== undefined) {
      id = Number(flags.epoch);
      if (!Number.isSafeInteger(id) || id < 1) throw new NimbleError('invalid', `--epoch must be a positive integer, got '${flags.epoch}'`);
    }
    const api = new OrchestratorClient(flags.orchestrator);
    const epochs = id === undefined ? (await api.epochs()).epochs : [await api.epoch(id)];
    const shown = epochs.filter((e) => e.status !== 'open' || e.rewards.length > 0 || id !== undefined);
    emit(flags, id !== undefined ? shown[0] : { epochs: shown }, () => (shown.length === 0 ? 'no epochs closed yet' : shown.map(describeEpoch).join('\n\n')));
  });
}

export function describeEpoch(e: EpochView): string {
  const head = `epoch ${e.id}  ${e.status}${e.runId ? `  run ${e.runId}` : ''}${e.emission !== null ? `  emission ${displayNim(e.emission)} NIM` : ''}${
    e.chainEpoch ? `  on-chain epoch ${e.chainEpoch}` : ''
  }${e.txHash ? `  tx ${e.txHash}` : ''}${e.error ? `  (last error: ${e.error})` : ''}`;
  if (e.rewards.length === 0 && e.inferencePayments.length === 0) return `${head}\n  no work`;
  const served = e.rewards.some((r) => (r.units.inference ?? 0) > 0);
  const rows = [
    ['miner', 'name', 'score', ...(served ? ['inference units'] : []), 'NIM'],
    ...e.rewards.map((r) => [r.miner, r.name ?? '', r.score.toFixed(3), ...(served ? [(r.units.inference ?? 0).toFixed(3)] : []), displayNim(r.amount)]),
  ];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  const lines = rows.map((r) => '  ' + r.map((v, c) => (c >= 2 ? v.padStart(widths[c]) : v.padEnd(widths[c]))).join('  '));
  if (e.remainder !== null && e.remainder !== '0') lines.push(`  remainder ${displayNim(e.remainder)} NIM (not minted)`);
  if (e.inferencePayments.length > 0) {
    lines.push('  inference paid from credit (as stake):');
    for (const p of e.inferencePayments) lines.push(`    ${p.payee}  ${p.role === 'owner' ? 'model owner' : `miner${p.name ? ` ${p.name}` : ''}`}  ${displayNim(p.amount)} NIM  ${p.status}`);
  }
  return [head, ...lines].join('\n');
}
