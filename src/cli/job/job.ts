// nbcli job: a developer's job from a spec file to a trained model
// (docs/jobs.md). `init` writes a starter spec, `run --local` is the proof of
// concept in this process, `plan` says what the job needs and which miners
// would train it, `submit` puts it on the network; `status`, `list`, `follow`
// and `cancel` follow it there. Signed with the developer's key
// (--wallet.name, or <data-dir>/developer-key.json).
import { existsSync, writeFileSync } from 'node:fs';
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { JobClient } from '../../api/job-client.ts';
import { JOB_TEMPLATES, type JobTemplate } from '../../jobs/templates.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { withChainOption } from '../chain-options.ts';
import { DEFAULT_ORCHESTRATOR, emit, withCommonOptions, type CommonOptions } from '../common.ts';
import { isWholeJobView } from '../../api/jobs.ts';
import { describeEntry, describeHeldout, describeJob, describePayment, followJob } from './job-follow.ts';
import { registerJobPlan } from './job-plan.ts';
import { readJobSpec } from './job-spec-file.ts';
import { refundEscrow, submitJob } from './job-escrow.ts';
import { showNim } from '../../chain/amounts.ts';
import { uploadJobData } from './job-data.ts';
import { runJobLocally } from './job-local.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';

interface Flags extends CommonOptions {
  orchestrator: string;
  chainRpc?: string;
  'wallet.name'?: string;
  follow?: boolean;
  mine?: boolean;
}

export function registerJob(program: Command): void {
  const group = program.command('job').description("a developer's training job: write a spec, try it locally, plan it, submit it, follow it");
  const common = (cmd: Command): Command =>
    withChainOption(withCommonOptions(
      cmd
        .option('--orchestrator <url>', 'the network', DEFAULT_ORCHESTRATOR)
        .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
    ));
  const api = async (flags: Flags): Promise<OrchestratorClient> => new OrchestratorClient(flags.orchestrator, { wallet: await signingKey(flags, DEVELOPER_KEY_FILE) });

  withCommonOptions(
    group
      .command('init')
      .description('write a starter nimble.job.json')
      .option('--template <name>', `gpt or classifier`, 'gpt')
      .option('--out <file>', 'where to write it', 'nimble.job.json')
      .option('--force', 'overwrite the file if it exists'),
  ).action((flags: CommonOptions & { template: string; out: string; force?: boolean }) => {
    if (!(flags.template in JOB_TEMPLATES)) throw new NimbleError('invalid', `--template must be one of ${Object.keys(JOB_TEMPLATES).join(', ')}, got '${flags.template}'`);
    if (existsSync(flags.out) && !flags.force) throw new NimbleError('conflict', `${flags.out} exists; use --force to overwrite it`);
    const spec = JOB_TEMPLATES[flags.template as JobTemplate];
    writeFileSync(flags.out, JSON.stringify(spec, null, 2) + '\n');
    emit(flags, { event: 'written', path: flags.out, spec }, () => `wrote ${flags.out} (${flags.template}); try it with: nbcli job run ${flags.out} --local`);
  });

  withCommonOptions(
    group
      .command('run <file>')
      .description('the proof of concept: the job in this process for a few steps, on the same code path as the network')
      .option('--local', 'run in this process (the only way for now; `job submit` puts it on the network)')
      .option('--steps <n>', 'steps to run (default: the spec\'s, at most 100)')
      .option('--threads <n>', 'engine threads (default: every core)')
      .option('--out <file>', 'checkpoint path (default: <data-dir>/checkpoints/<name>-local.safetensors)'),
  ).action(async (file: string, flags: CommonOptions & { local?: boolean; steps?: string; threads?: string; out?: string }) => {
    if (!flags.local) throw new NimbleError('invalid', 'job run needs --local (to put the job on the network: nbcli job submit FILE)');
    await runJobLocally(readJobSpec(file), { ...flags, specFile: file });
  });

  registerJobPlan(group);

  common(
    group
      .command('submit <file>')
      .description('put a job on the network')
      .option('--follow', 'follow it until it ends')
      .option('--auto-upgrade', "let the orchestrator upgrade it onto stages × replicas when one miner cannot meet its deadline or hold the model (the spec's autoUpgrade)"),
  ).action(async (file: string, flags: Flags & { autoUpgrade?: boolean }) => {
    const spec = { ...readJobSpec(file), ...(flags.autoUpgrade ? { autoUpgrade: true } : {}) };
    const key = await signingKey(flags, DEVELOPER_KEY_FILE);
    const jobs = new JobClient(new OrchestratorClient(flags.orchestrator, { wallet: key }));
    const job = await submitJob(flags, jobs, await uploadJobData(new OrchestratorClient(flags.orchestrator, { wallet: key }), spec, file, flags), key, { log: (line) => flags.json || console.error(line) });
    emit(flags, { event: 'submitted', id: job.id, status: job.status }, () => `${job.id} ${job.status}: ${job.message ?? ''}\nfollow it with: nbcli job follow ${job.id}`);
    if (flags.follow) await followJob(jobs, job.id, flags);
  });

  // signed: its owner sees the whole job, anyone else its public part (status and counts)
  common(group.command('status <id>').description("a job's status, progress, checkpoints and history")).action(async (id: string, flags: Flags) => {
    const jobs = new JobClient(await api(flags));
    const [job, events] = await Promise.all([jobs.view(id), jobs.events(id)]);
    if (!isWholeJobView(job)) {
      emit(flags, { ...job, events }, () => [describeEntry(job), ...events.map((e) => `  ${new Date(e.at).toISOString()} ${e.status}`)].join('\n'));
      return;
    }
    emit(flags, { ...job, events }, () =>
      [
        describeJob(job),
        ...(job.payment ? [`  ${describePayment(job.payment)}`] : []),
        ...job.checkpoints.map((c) => `  checkpoint step ${c.step}: ${(c.bytes / 1e6).toFixed(1)} MB${describeHeldout(c)} sha256 ${c.sha256.slice(0, 16)}…${c.expiresAt ? ` kept until ${new Date(c.expiresAt).toISOString()}` : ''}`),
        ...events.map((e) => `  ${new Date(e.at).toISOString()} ${e.status.padEnd(12)} ${e.message}`),
      ].join('\n'),
    );
  });

  // newest first; your own whole, the others' public part
  common(group.command('list').description('jobs on the network').option('--mine', 'only your jobs')).action(async (flags: Flags) => {
    const client = await api(flags);
    const jobs = new JobClient(client);
    const list = flags.mine ? await jobs.list((await client.signed()).address) : await jobs.entries();
    emit(flags, list, () => (list.length ? list.map(describeEntry).join('\n') : 'no jobs'));
  });

  common(group.command('follow <id>').description("a job's progress and messages until it ends")).action(async (id: string, flags: Flags) => {
    await followJob(new JobClient(await api(flags)), id, flags);
  });

  common(group.command('upgrade <id>').description('move one of your jobs onto pipeline stages × replicas from the checkpoint its current run ends with'))
    .option('--stages <n>', 'pipeline stages (with --replicas; default: the orchestrator chooses)', parsePositive)
    .option('--replicas <n>', 'replicas of each stage (with --stages)', parsePositive)
    .action(async (id: string, flags: Flags & { stages?: number; replicas?: number }) => {
      if ((flags.stages === undefined) !== (flags.replicas === undefined)) throw new NimbleError('invalid', 'give both --stages and --replicas, or neither');
      const layout = flags.stages !== undefined && flags.replicas !== undefined ? { stages: flags.stages, replicas: flags.replicas } : undefined;
      const job = await new JobClient(await api(flags)).upgrade(id, layout);
      emit(flags, job, () => describeJob(job));
    });

  common(group.command('cancel <id>').description('end one of your jobs; its last checkpoint is kept')).action(async (id: string, flags: Flags) => {
    const job = await new JobClient(await api(flags)).cancel(id);
    emit(flags, job, () => describeJob(job));
  });

  withChainOption(withCommonOptions(
    group
      .command('refund <escrow-id>')
      .description("close one of your escrows on chain yourself and get back what it did not pay, for when the orchestrator is gone: from its refund time on, never while the orchestrator's lock holds it for a job or credit it pays")
      .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
  )).action(async (escrowId: string, flags: Flags) => {
    const r = await refundEscrow(flags, escrowId, await signingKey(flags, DEVELOPER_KEY_FILE));
    emit(
      flags,
      { event: 'refunded', escrowId: r.escrow.jobId, alreadyClosed: r.alreadyClosed, refunded: r.refunded.toString(), paid: r.escrow.paid.toString(), tx: r.tx },
      () => `escrow ${r.escrow.jobId}: ${r.alreadyClosed ? 'was already closed' : 'closed'}, ${showNim(r.refunded)} NIM refunded (${showNim(r.escrow.paid)} NIM paid to miners)`,
    );
  });
}

function parsePositive(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw new NimbleError('invalid', `'${v}' is not a whole number from 1 to 1024`);
  return n;
}
