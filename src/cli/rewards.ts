// nbcli rewards: each epoch's split (miner, score, NIM, transaction), from a
// running orchestrator (GET /epochs) or from the orchestrator state in the
// data dir.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { OrchestratorDb } from '../orchestrator/db.ts';
import { epochView, type EpochView } from '../orchestrator/views.ts';
import { emit, resolveDataDir, UserError, withCommonOptions, type CommonOptions } from './common.ts';
import { getJson } from './follow.ts';

interface Flags extends CommonOptions {
  epoch?: string;
  orchestrator?: string;
}

export function registerRewards(program: Command): void {
  withCommonOptions(
    program
      .command('rewards')
      .description("each epoch's reward split: miner, score, NIM paid, settlement transaction")
      .option('--epoch <id>', 'only this epoch')
      .option('--orchestrator <url>', 'ask this orchestrator (default: read the orchestrator state in the data dir)'),
  ).action(async (flags: Flags) => {
    let id: number | undefined;
    if (flags.epoch !== undefined) {
      id = Number(flags.epoch);
      if (!Number.isSafeInteger(id) || id < 1) throw new UserError(`--epoch must be a positive integer, got '${flags.epoch}'`);
    }
    const epochs = flags.orchestrator ? await fromOrchestrator(flags.orchestrator, id) : fromDataDir(resolveDataDir(flags), id);
    const shown = epochs.filter((e) => e.status !== 'open' || e.rewards.length > 0 || id !== undefined);
    emit(flags, id !== undefined ? shown[0] : { epochs: shown }, () => (shown.length === 0 ? 'no epochs closed yet' : shown.map(describeEpoch).join('\n\n')));
  });
}

async function fromOrchestrator(url: string, id: number | undefined): Promise<EpochView[]> {
  let base: URL;
  try {
    base = new URL(url);
  } catch {
    throw new UserError(`--orchestrator must be a URL, got '${url}'`);
  }
  const body = await getJson<{ epochs?: EpochView[] } & Partial<EpochView>>(base.href, id === undefined ? '/epochs' : `/epochs/${id}`);
  return id === undefined ? (body.epochs ?? []) : [body as EpochView];
}

function fromDataDir(dataDir: string, id: number | undefined): EpochView[] {
  const file = [join(dataDir, 'orchestrator', 'orchestrator.sqlite'), join(dataDir, 'up', 'orchestrator', 'orchestrator.sqlite')].find((f) => existsSync(f));
  if (!file) throw new UserError(`no orchestrator state in ${dataDir} (give --orchestrator URL or --data-dir)`);
  const db = new OrchestratorDb(file);
  try {
    if (id !== undefined) {
      const e = db.epoch(id);
      if (!e) throw new UserError(`unknown epoch ${id}`);
      return [epochView(db, e)];
    }
    return db.epochs().map((e) => epochView(db, e));
  } finally {
    db.close();
  }
}

export function describeEpoch(e: EpochView): string {
  const head = `epoch ${e.id}  ${e.status}${e.runId ? `  run ${e.runId}` : ''}${e.emission !== null ? `  emission ${e.emission} NIM` : ''}${
    e.chainEpoch ? `  on-chain epoch ${e.chainEpoch}` : ''
  }${e.txHash ? `  tx ${e.txHash}` : ''}${e.error ? `  (last error: ${e.error})` : ''}`;
  if (e.rewards.length === 0) return `${head}\n  no work`;
  const rows = [['miner', 'name', 'score', 'NIM'], ...e.rewards.map((r) => [r.miner, r.name ?? '', r.score.toFixed(3), r.amount])];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  const lines = rows.map((r) => '  ' + r.map((v, c) => (c >= 2 ? v.padStart(widths[c]) : v.padEnd(widths[c]))).join('  '));
  if (e.remainder !== null && e.remainder !== '0') lines.push(`  remainder ${e.remainder} NIM (not minted)`);
  return [head, ...lines].join('\n');
}
