// A job's status and the moves between them (docs/jobs.md):
//
//   waiting → started → executing → completed
//      │         │          │
//      └─────────┴──────────┴──→ failed | timed_out | cancelled | idle_stopped
//
// `waiting`: no miners hold it yet; `started`: miners are placed and loading
// it; `executing`: microbatches flow. A job may go back from executing to
// waiting when its miners vanish. The last four, and `completed`, are final.
import { Type, type Static } from '@sinclair/typebox';

export const JobStatus = Type.Union([
  Type.Literal('waiting'),
  Type.Literal('started'),
  Type.Literal('executing'),
  Type.Literal('completed'),
  Type.Literal('failed'),
  Type.Literal('timed_out'),
  Type.Literal('cancelled'),
  Type.Literal('idle_stopped'),
]);
export type JobStatus = Static<typeof JobStatus>;

/** Statuses a job does not leave. */
export const FINAL_JOB_STATUSES: readonly JobStatus[] = ['completed', 'failed', 'timed_out', 'cancelled', 'idle_stopped'];

export function isFinalJobStatus(s: JobStatus): boolean {
  return FINAL_JOB_STATUSES.includes(s);
}

/** Whether a job may move from `from` to `to`. */
export function canMove(from: JobStatus, to: JobStatus): boolean {
  if (from === to || isFinalJobStatus(from)) return false;
  if (isFinalJobStatus(to)) return true;
  // back to waiting when its miners vanish; forward otherwise
  const order: JobStatus[] = ['waiting', 'started', 'executing'];
  return to === 'waiting' || order.indexOf(to) > order.indexOf(from);
}
