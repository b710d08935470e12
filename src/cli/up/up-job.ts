// nbcli up --job FILE: the local network trains a developer's job instead of
// the demo run. The job is submitted once the miners have joined (so it is
// placed on the smallest that holds it), signed by up's developer key,
// followed to its end as `nbcli job follow` shows it, and then its
// checkpoints are listed with the commands that download them from this
// network while it serves.
import type { OrchestratorClient } from '../../api/client.ts';
import { JobClient } from '../../api/job-client.ts';
import { isWholeJobView, type CheckpointView, type JobView } from '../../api/jobs.ts';
import type { PackedDataset } from '../../data/dataset.ts';
import type { JobSpec } from '../../jobs/spec.ts';
import { emit, type CommonOptions } from '../common.ts';
import { uploadJobData } from '../job/job-data.ts';
import { submitJob } from '../job/job-escrow.ts';
import { followJob } from '../job/job-follow.ts';
import type { Hex } from 'viem';

/** How long to wait for the miners to join before submitting anyway (the job then waits for one). */
export const UP_JOB_MINER_WAIT_MS = 60_000;

export interface UpJobOptions {
  /** miners up started: the job is submitted once this many are alive */
  miners: number;
  /** the data dir whose developer-key.json signed the job (`--data-dir` of the download command) */
  keyDir: string;
  /** that key: on the paid local network it is given the job's budget from the faucet and escrows it */
  key: Hex;
  flags: CommonOptions;
  /** the spec file: a local data path in the spec is taken from its folder, uploaded, and named by its sha256 id */
  specFile?: string;
  /** that data, packed already (up checks it before it starts the network) */
  packed?: PackedDataset;
}

/** Submits `spec`, follows it until it ends, prints its checkpoints and how to download them; returns the ended job. */
export async function trainUpJob(api: OrchestratorClient, spec: JobSpec, options: UpJobOptions): Promise<JobView> {
  const { flags } = options;
  if (options.specFile) spec = await uploadJobData(api, spec, options.specFile, flags, options.packed);
  const alive = await waitForMiners(api, options.miners, UP_JOB_MINER_WAIT_MS);
  const jobs = new JobClient(api);
  const job = await submitJob(flags, jobs, spec, options.key, { faucet: true, log: (line) => emit(flags, { event: 'log', message: line }, () => line) });
  emit(flags, { event: 'submitted', id: job.id, status: job.status, miners: alive }, () => `${job.id} ${job.name} ${job.status}: ${job.message ?? ''} (${alive} miner${alive === 1 ? '' : 's'} joined)`);
  const ended = await followJob(jobs, job.id, flags);
  const checkpoints = await jobs.checkpoints(job.id);
  const list = ['nbcli', 'checkpoint', 'list', job.id, '--orchestrator', api.url];
  const download = ['nbcli', 'checkpoint', 'download', job.id, '--orchestrator', api.url, '--data-dir', options.keyDir];
  emit(flags, { event: 'checkpoints', id: job.id, checkpoints, list, download }, () => describeCheckpoints(job.id, checkpoints, list, download));
  // its own job: the whole view (a job's public part would be another's)
  return isWholeJobView(ended) ? ended : jobs.get(job.id);
}

/** Resolves with the number of live miners once there are `n`, or when `timeoutMs` has passed. */
export async function waitForMiners(api: OrchestratorClient, n: number, timeoutMs: number): Promise<number> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const alive = (await api.miners()).filter((m) => m.alive).length;
    if (alive >= n || Date.now() >= end) return alive;
    await new Promise((r) => setTimeout(r, 250));
  }
}

function describeCheckpoints(id: string, checkpoints: CheckpointView[], list: string[], download: string[]): string {
  const kept = checkpoints.length
    ? `checkpoints of ${id}: ${checkpoints.map((c) => `step ${c.step} (${(c.bytes / 1e6).toFixed(2)} MB)`).join(', ')}`
    : `${id} kept no checkpoint`;
  return [
    kept,
    'while this network serves, list and download them with:',
    `  ${list.join(' ')}`,
    `  ${download.join(' ')} [--step N] [--out FILE]`,
  ].join('\n');
}
