// Following a job on the network (`nbcli job follow`, `job submit --follow`,
// `up --job`): its events as lines and its progress as a bar on stderr, or
// JSON lines with --json, until it ends.
import { showNim } from '../../chain/amounts.ts';
import type { JobClient, JobProgress } from '../../api/job-client.ts';
import { isWholeJobView, type CheckpointView, type JobEntry, type JobView } from '../../api/jobs.ts';
import { formatDuration } from '../../jobs/duration.ts';
import { isFinalJobStatus } from '../../jobs/status.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { emit, type CommonOptions } from '../common.ts';
import { ProgressBar } from '../progress.ts';

/** One line: id, name, status, progress, message. */
export function describeJob(j: JobView): string {
  const loss = j.loss === null ? '' : ` loss ${j.loss.toFixed(3)}`;
  return `${j.id} ${j.name} ${j.status} step ${j.step}/${j.steps}${loss}${j.message ? `: ${j.message}` : ''}`;
}

/** One line of a job as the reader may see it: the whole of its own, the status and progress of another's. */
export function describeEntry(j: JobEntry): string {
  return isWholeJobView(j) ? describeJob(j) : `${j.id} ${j.status} step ${j.step}/${j.steps} (another's job: its public part)`;
}

/** A checkpoint's held-out figures as words (` held-out loss 1.9876`, and ` accuracy 98.13%` for a classifier), or nothing when they were not measured. */
export function describeHeldout(c: Pick<CheckpointView, 'heldoutLoss' | 'heldoutAccuracy'>): string {
  const accuracy = c.heldoutAccuracy === null ? '' : ` accuracy ${(c.heldoutAccuracy * 100).toFixed(2)}%`;
  return c.heldoutLoss === null ? '' : ` held-out loss ${c.heldoutLoss.toFixed(4)}${accuracy}`;
}

/** A job's escrow in one line: budget, paid so far, refunded. */
export function describePayment(p: NonNullable<JobView['payment']>): string {
  const refund = p.refunded === null ? '' : `, ${showNim(BigInt(p.refunded))} NIM refunded`;
  const lock = p.lockedUntil ? `, locked until ${new Date(p.lockedUntil).toISOString()}` : '';
  const unpaid = p.unpaid && p.unpaid !== '0' ? `, ${showNim(BigInt(p.unpaid))} NIM unpaid` : '';
  const failing = p.failing ? `; ${p.failing.what} failing after ${p.failing.attempts} attempt(s)${p.failing.retryAt ? `, next try ${new Date(p.failing.retryAt).toISOString()}` : ''}: ${p.failing.error}` : '';
  return `paid from escrow ${p.escrowId.slice(0, 10)}…: budget ${showNim(BigInt(p.budget))} NIM at ${p.nimPerPetaflop} NIM per PFLOP, ${showNim(BigInt(p.committed))} NIM to its miners${refund}${unpaid} (${p.spent ? 'budget spent, ' : ''}${p.status}${lock})${failing}`;
}

/**
 * Prints each event as a line and progress as a bar until the job ends, then
 * the job in one line; returns it. The exit code becomes 1 when it ended
 * otherwise than completed; throws when the stream closes before the end.
 */
export async function followJob(jobs: JobClient, id: string, flags: CommonOptions): Promise<JobEntry> {
  const bar = new ProgressBar('job');
  const started = Date.now();
  let last: JobProgress | null = null;
  for await (const u of jobs.follow(id)) {
    if (u.kind === 'end') break;
    if (flags.json) {
      process.stdout.write(JSON.stringify(u.kind === 'event' ? { event: 'job', ...u.event } : { event: 'progress', ...u.progress }) + '\n');
      continue;
    }
    if (u.kind === 'event') process.stderr.write(`\n${new Date(u.event.at).toISOString()} ${u.event.status}: ${u.event.message}\n`);
    else {
      last = u.progress;
      const p = u.progress;
      const eta = p.etaMs === null ? '' : ` eta ${formatDuration(p.etaMs)}`;
      bar.update({ done: p.step, total: p.steps, elapsedMs: Date.now() - started, text: `${p.status}${p.loss === null ? '' : ` loss ${p.loss.toFixed(4)}`} ${Math.round(p.tokensPerSecond).toLocaleString('en-US')} tok/s${eta}` });
    }
  }
  const job = await jobs.view(id);
  const whole = isWholeJobView(job) ? job : null;
  emit(flags, { event: 'ended', id: job.id, status: job.status, step: job.step, loss: whole?.loss ?? null, message: whole?.message ?? null }, () => `\n${describeEntry(job)}`);
  if (!isFinalJobStatus(job.status)) throw new NimbleError('unreachable', `the event stream of ${id} closed before the job ended (${job.status}, step ${last?.step ?? job.step}); follow it again`, 502);
  if (job.status !== 'completed') process.exitCode = 1;
  return job;
}
