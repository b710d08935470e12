// nbcli checkpoint: a job's kept checkpoints: list them, download one (with a
// progress bar, resumed after an interruption, checked against its sha256),
// keep them longer. Downloads are the job owner's (signed with the
// developer's key).
import { join } from 'node:path';
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { downloadCheckpoint } from '../../api/download.ts';
import { JobClient } from '../../api/job-client.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, resolveDataDir, withCommonOptions, type CommonOptions } from '../common.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';
import { ProgressBar } from '../progress.ts';
import { withChainOption } from '../chain-options.ts';
import { keepCheckpoints } from './job-escrow.ts';
import { describeHeldout } from './job-follow.ts';
import { showNim } from '../../chain/amounts.ts';
import { STORAGE_NIM_PER_GB_DAY } from '../../jobs/plan-constants.ts';

interface Flags extends CommonOptions {
  orchestrator: string;
  'wallet.name'?: string;
  step?: string;
  out?: string;
  days?: string;
}

export function registerCheckpoint(program: Command): void {
  const group = program.command('checkpoint').description("a job's checkpoints: list, download, keep longer");
  const common = (cmd: Command): Command =>
    withCommonOptions(
      cmd
        .option('--orchestrator <url>', 'the network', DEFAULT_ORCHESTRATOR)
        .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
    );
  const jobs = async (flags: Flags): Promise<JobClient> => new JobClient(new OrchestratorClient(flags.orchestrator, { wallet: await signingKey(flags, DEVELOPER_KEY_FILE) }));

  // signed: a job's checkpoints are its owner's
  common(group.command('list <job>').description("a job's checkpoints")).action(async (job: string, flags: Flags) => {
    const list = await (await jobs(flags)).checkpoints(job);
    emit(flags, list, () =>
      list.length
        ? list.map((c) => `step ${c.step}  ${(c.bytes / 1e6).toFixed(2)} MB  training loss ${c.loss?.toFixed(4) ?? '-'}${describeHeldout(c)}  sha256 ${c.sha256}  ${c.expiresAt ? `kept until ${new Date(c.expiresAt).toISOString()}` : 'kept while the job runs'}`).join('\n')
        : `${job} has no checkpoint yet`,
    );
  });

  common(
    group
      .command('download <job>')
      .description('download a checkpoint (the last one unless --step); an interrupted download resumes')
      .option('--step <n>', 'the checkpoint of this step')
      .option('--out <file>', 'where to write it (default: <data-dir>/checkpoints/<job>-<step>.safetensors)'),
  ).action(async (job: string, flags: Flags) => {
    const client = await jobs(flags);
    const list = await client.checkpoints(job);
    const step = flags.step === undefined ? undefined : parsePositiveInt('--step', flags.step, 0);
    const cp = step === undefined ? list.at(-1) : list.find((c) => c.step === step);
    if (!cp) throw new NimbleError('not_found', step === undefined ? `${job} has no checkpoint yet` : `${job} has no checkpoint at step ${step} (it has: ${list.map((c) => c.step).join(', ') || 'none'})`);
    const out = flags.out ?? join(resolveDataDir(flags), 'checkpoints', `${job}-${cp.step}.safetensors`);
    const bar = new ProgressBar('download');
    const started = Date.now();
    const r = await downloadCheckpoint(client, cp, out, (p) => flags.json || bar.update({ done: p.done, total: p.total, elapsedMs: Date.now() - started, text: `bytes${p.resumedFrom ? ` (resumed at ${p.resumedFrom})` : ''}` }));
    emit(flags, { event: 'downloaded', job, step: cp.step, ...r }, () => `${r.path}: ${r.bytes} bytes, sha256 ${r.sha256} (checked)${r.resumedFrom ? `, resumed at byte ${r.resumedFrom}` : ''}`);
  });

  withChainOption(
    common(group.command('keep <job>').description(`keep an ended job's checkpoints N days after it ended (on a paid network: ${STORAGE_NIM_PER_GB_DAY} NIM per GB-day added, paid first)`).requiredOption('--days <n>', 'days')),
  ).action(async (job: string, flags: Flags & { chainRpc?: string }) => {
    const key = await signingKey(flags, DEVELOPER_KEY_FILE);
    const client = new JobClient(new OrchestratorClient(flags.orchestrator, { wallet: key }));
    const { list, paid } = await keepCheckpoints(flags, client, job, parsePositiveInt('--days', flags.days, 3), key);
    emit(flags, list, () => [...list.map((c) => `step ${c.step} kept until ${c.expiresAt ? new Date(c.expiresAt).toISOString() : 'the job ends'}`), ...(paid > 0n ? [`paid ${showNim(paid)} NIM`] : [])].join('\n') || `${job} has no checkpoint`);
  });
}
