// Developers' jobs (src/orchestrator/jobs/jobs.ts drives them): the job, its
// history of status changes and messages (job_events, in order, never
// rewritten), and the whole-model checkpoints kept for it (job_checkpoints,
// each a blob, deleted by the collector after its expiry).
import { Type, type Static } from '@sinclair/typebox';
import { JobLayout } from '../../jobs/layout.ts';
import { JobSpec } from '../../jobs/spec.ts';
import { FINAL_JOB_STATUSES, isFinalJobStatus, JobStatus } from '../../jobs/status.ts';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const JOB_MIGRATIONS: Migrations = {
  store: 'jobs',
  steps: [
    `CREATE TABLE IF NOT EXISTS jobs (
      id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, status TEXT NOT NULL,
      run_id TEXT, steps INTEGER NOT NULL, step INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0, loss REAL,
      message TEXT, created_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER,
      last_progress_at INTEGER NOT NULL, timeout_at INTEGER NOT NULL, idle_timeout_ms INTEGER NOT NULL,
      checkpoint_every INTEGER NOT NULL, retention_ms INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner, created_at);
    CREATE TABLE IF NOT EXISTS job_events (
      job_id TEXT NOT NULL, seq INTEGER NOT NULL, at INTEGER NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, message TEXT NOT NULL,
      PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE IF NOT EXISTS job_checkpoints (
      job_id TEXT NOT NULL, step INTEGER NOT NULL, tokens INTEGER NOT NULL, loss REAL, blob TEXT NOT NULL, bytes INTEGER NOT NULL,
      created_at INTEGER NOT NULL, expires_at INTEGER,
      PRIMARY KEY (job_id, step)
    );
    CREATE INDEX IF NOT EXISTS job_checkpoints_blob ON job_checkpoints (blob)`,
    // a job trained by several runs in turn (upgrades): the steps and tokens of the runs before the current one,
    // and the layout an upgrade asked for, taken when the current run has finished
    `ALTER TABLE jobs ADD COLUMN step_base INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN token_base INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN upgrade TEXT`,
    // every run that trained a job, current and before upgrades: the work a job's escrow pays for
    `CREATE TABLE job_runs (run_id TEXT PRIMARY KEY, job_id TEXT NOT NULL);
    INSERT OR IGNORE INTO job_runs (run_id, job_id) SELECT run_id, id FROM jobs WHERE run_id IS NOT NULL`,
    // a checkpoint's held-out figures, measured when it was kept (src/orchestrator/jobs/checkpoint-eval.ts; null: not measured)
    `ALTER TABLE job_checkpoints ADD COLUMN heldout_loss REAL;
    ALTER TABLE job_checkpoints ADD COLUMN heldout_accuracy REAL`,
  ],
};


const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);
const NullableText = Type.Union([Type.String(), Type.Null()]);
const NullableNumber = Type.Union([Type.Number(), Type.Null()]);

const JobRow = Type.Object({
  id: Type.String(),
  owner: Type.String(),
  name: Type.String(),
  spec: Type.String(),
  status: JobStatus,
  runId: NullableText,
  steps: Int,
  step: Int,
  tokens: Int,
  loss: Type.Union([Type.Number(), Type.Null()]),
  message: NullableText,
  createdAt: Int,
  startedAt: NullableInt,
  endedAt: NullableInt,
  lastProgressAt: Int,
  timeoutAt: Int,
  idleTimeoutMs: Int,
  checkpointEvery: Int,
  retentionMs: Int,
  stepBase: Int,
  tokenBase: Int,
  upgrade: NullableText,
});
export interface JobRecord extends Omit<Static<typeof JobRow>, 'spec' | 'upgrade'> {
  spec: JobSpec;
  /** an upgrade asked for and not yet made */
  upgrade: JobLayout | null;
}
const JOB_COLUMNS = `id, owner, name, spec, status, run_id AS runId, steps, step, tokens, loss, message, created_at AS createdAt,
  started_at AS startedAt, ended_at AS endedAt, last_progress_at AS lastProgressAt, timeout_at AS timeoutAt,
  idle_timeout_ms AS idleTimeoutMs, checkpoint_every AS checkpointEvery, retention_ms AS retentionMs,
  step_base AS stepBase, token_base AS tokenBase, upgrade`;
const readJob = rowReader(JobRow, 'job');
function decodeJob(row: unknown): JobRecord {
  const r = readJob(row);
  return { ...r, spec: jsonColumn(JobSpec, r.spec, `spec of ${r.id}`), upgrade: r.upgrade === null ? null : jsonColumn(JobLayout, r.upgrade, `upgrade of ${r.id}`) };
}

const EventRow = Type.Object({ seq: Int, at: Int, kind: Type.Union([Type.Literal('status'), Type.Literal('message'), Type.Literal('checkpoint')]), status: JobStatus, message: Type.String() });
export type JobEventRecord = Static<typeof EventRow>;
const decodeEvent = rowReader(EventRow, 'job event');

const CheckpointRow = Type.Object({
  jobId: Type.String(),
  step: Int,
  tokens: Int,
  /** the training loss when it was kept */
  loss: NullableNumber,
  /** mean cross-entropy on held-out data (null: not measured) */
  heldoutLoss: NullableNumber,
  /** an MLP classifier's held-out accuracy (null: a GPT, or not measured) */
  heldoutAccuracy: NullableNumber,
  blob: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  bytes: Int,
  createdAt: Int,
  expiresAt: NullableInt,
});
export type JobCheckpointRecord = Static<typeof CheckpointRow>;
const CHECKPOINT_COLUMNS =
  'job_id AS jobId, step, tokens, loss, heldout_loss AS heldoutLoss, heldout_accuracy AS heldoutAccuracy, blob, bytes, created_at AS createdAt, expires_at AS expiresAt';
const decodeCheckpoint = rowReader(CheckpointRow, 'job checkpoint');

/** What a new job is created with. */
export interface NewJob {
  id: string;
  owner: string;
  spec: JobSpec;
  steps: number;
  timeoutMs: number;
  idleTimeoutMs: number;
  checkpointEvery: number;
  retentionMs: number;
}

/** Progress read from the job's run. */
export interface JobProgress {
  step: number;
  tokens: number;
  loss: number | null;
}

const ENDED = `(${FINAL_JOB_STATUSES.map((s) => `'${s}'`).join(', ')})`;

export class JobStore {
  constructor(private readonly db: StateDb) {}

  insert(j: NewJob, now: number): void {
    this.db.tx(() => {
      this.db.run(
        `INSERT INTO jobs (id, owner, name, spec, status, steps, created_at, last_progress_at, timeout_at, idle_timeout_ms, checkpoint_every, retention_ms)
         VALUES (?, ?, ?, ?, 'waiting', ?, ?, ?, ?, ?, ?, ?)`,
        j.id,
        j.owner,
        j.spec.name,
        JSON.stringify(j.spec),
        j.steps,
        now,
        now,
        now + j.timeoutMs,
        j.idleTimeoutMs,
        j.checkpointEvery,
        j.retentionMs,
      );
      this.addEvent(j.id, now, 'status', 'waiting', 'submitted');
    });
  }

  get(id: string): JobRecord | undefined {
    return one(this.db, decodeJob, `SELECT ${JOB_COLUMNS} FROM jobs WHERE id = ?`, id);
  }

  /** Every job, newest first (of one owner when given). */
  list(owner?: string): JobRecord[] {
    return owner
      ? all(this.db, decodeJob, `SELECT ${JOB_COLUMNS} FROM jobs WHERE LOWER(owner) = LOWER(?) ORDER BY created_at DESC, id`, owner)
      : all(this.db, decodeJob, `SELECT ${JOB_COLUMNS} FROM jobs ORDER BY created_at DESC, id`);
  }

  /** At most `limit` jobs, newest first (of one owner when given), after the one `after` names (its creation time and id). */
  page(p: { owner?: string; after?: { createdAt: number; id: string }; limit: number }): JobRecord[] {
    const where: string[] = [];
    const values: (string | number)[] = [];
    if (p.owner) {
      where.push('LOWER(owner) = LOWER(?)');
      values.push(p.owner);
    }
    if (p.after) {
      where.push('(created_at < ? OR (created_at = ? AND id > ?))');
      values.push(p.after.createdAt, p.after.createdAt, p.after.id);
    }
    const filter = where.length ? `WHERE ${where.join(' AND ')}` : '';
    return all(this.db, decodeJob, `SELECT ${JOB_COLUMNS} FROM jobs ${filter} ORDER BY created_at DESC, id LIMIT ?`, ...values, p.limit);
  }

  /** Jobs that have not ended, oldest first. */
  active(): JobRecord[] {
    return all(this.db, decodeJob, `SELECT ${JOB_COLUMNS} FROM jobs WHERE status NOT IN ${ENDED} ORDER BY created_at, id`);
  }

  countActiveOf(owner: string): number {
    return scalar(this.db, `SELECT COUNT(*) AS n FROM jobs WHERE owner = ? AND status NOT IN ${ENDED}`, owner);
  }

  countWaiting(): number {
    return scalar(this.db, "SELECT COUNT(*) AS n FROM jobs WHERE status = 'waiting'");
  }

  setRun(id: string, runId: string): void {
    this.db.tx(() => {
      this.db.run('UPDATE jobs SET run_id = ? WHERE id = ?', runId, id);
      this.db.run('INSERT OR IGNORE INTO job_runs (run_id, job_id) VALUES (?, ?)', runId, id);
    });
  }

  /** The job a run trains, if any. */
  jobOfRun(runId: string): string | null {
    const row = this.db.statement('SELECT job_id AS jobId FROM job_runs WHERE run_id = ?').get(runId) as { jobId: string } | undefined;
    return row?.jobId ?? null;
  }

  /** An upgrade to `layout` is asked for: made when the current run has finished. */
  requestUpgrade(id: string, layout: JobLayout, message: string, now: number): void {
    this.db.tx(() => {
      this.db.run('UPDATE jobs SET upgrade = ? WHERE id = ?', JSON.stringify(layout), id);
      this.note(id, message, now);
    });
  }

  /** The job goes on in a new run, after `stepBase` steps and `tokenBase` tokens of the runs before it; the upgrade is made. */
  moveOn(id: string, runId: string, stepBase: number, tokenBase: number, message: string, now: number): void {
    this.db.tx(() => {
      this.db.run('UPDATE jobs SET run_id = ?, step_base = ?, token_base = ?, upgrade = NULL WHERE id = ?', runId, stepBase, tokenBase, id);
      this.db.run('INSERT OR IGNORE INTO job_runs (run_id, job_id) VALUES (?, ?)', runId, id);
      this.note(id, message, now);
    });
  }

  /** Moves the job to `status` and records why, in one transaction. */
  move(id: string, status: JobStatus, reason: string, now: number): void {
    const final = FINAL_JOB_STATUSES.includes(status);
    this.db.tx(() => {
      this.db.run(
        `UPDATE jobs SET status = ?, message = ?, started_at = CASE WHEN ? = 'started' AND started_at IS NULL THEN ? ELSE started_at END,
          ended_at = CASE WHEN ? = 1 THEN ? ELSE ended_at END WHERE id = ?`,
        status,
        reason,
        status,
        now,
        final ? 1 : 0,
        now,
        id,
      );
      this.addEvent(id, now, 'status', status, reason);
      // the checkpoints of an ended job are kept for its retention from now
      if (final) this.db.run('UPDATE job_checkpoints SET expires_at = ? + (SELECT retention_ms FROM jobs WHERE id = ?) WHERE job_id = ? AND expires_at IS NULL', now, id, id);
    });
  }

  /**
   * Records a message about the job's progress (its status unchanged). An
   * ended job keeps why it ended as its message: a note that comes after
   * (the final checkpoint, kept in the background) is an event only.
   */
  note(id: string, message: string, now: number, kind: 'message' | 'checkpoint' = 'message'): void {
    const job = this.get(id);
    if (!job) return;
    this.db.tx(() => {
      if (!isFinalJobStatus(job.status)) this.db.run('UPDATE jobs SET message = ? WHERE id = ?', message, id);
      this.addEvent(id, now, kind, job.status, message);
    });
  }

  /** The run's counters; the time of progress moves only when the step count does. */
  setProgress(id: string, p: JobProgress, now: number): void {
    this.db.run(
      'UPDATE jobs SET last_progress_at = CASE WHEN step <> ? THEN ? ELSE last_progress_at END, step = ?, tokens = ?, loss = ? WHERE id = ?',
      p.step,
      now,
      p.step,
      p.tokens,
      p.loss,
      id,
    );
  }

  /** The job's history from `afterSeq` on, in order. */
  events(id: string, afterSeq = 0): JobEventRecord[] {
    return all(this.db, decodeEvent, 'SELECT seq, at, kind, status, message FROM job_events WHERE job_id = ? AND seq > ? ORDER BY seq', id, afterSeq);
  }

  private addEvent(id: string, at: number, kind: JobEventRecord['kind'], status: JobStatus, message: string): void {
    const seq = scalar(this.db, 'SELECT COALESCE(MAX(seq), 0) + 1 AS n FROM job_events WHERE job_id = ?', id);
    this.db.run('INSERT INTO job_events (job_id, seq, at, kind, status, message) VALUES (?, ?, ?, ?, ?, ?)', id, seq, at, kind, status, message);
  }

  // ---- checkpoints -----------------------------------------------------------------

  /**
   * Keeps a checkpoint (a second one of the same step replaces nothing);
   * one kept after its job ended expires with the job's others. Returns
   * whether it was new.
   */
  addCheckpoint(c: Omit<JobCheckpointRecord, 'expiresAt' | 'createdAt' | 'heldoutLoss' | 'heldoutAccuracy'> & Partial<Pick<JobCheckpointRecord, 'heldoutLoss' | 'heldoutAccuracy'>>, now: number): boolean {
    const r = this.db.run(
      `INSERT OR IGNORE INTO job_checkpoints (job_id, step, tokens, loss, heldout_loss, heldout_accuracy, blob, bytes, created_at, expires_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT CASE WHEN ended_at IS NULL THEN NULL ELSE ended_at + retention_ms END FROM jobs WHERE id = ?))`,
      c.jobId,
      c.step,
      c.tokens,
      c.loss,
      c.heldoutLoss ?? null,
      c.heldoutAccuracy ?? null,
      c.blob,
      c.bytes,
      now,
      c.jobId,
    );
    return r.changes > 0;
  }

  checkpoints(jobId: string): JobCheckpointRecord[] {
    return all(this.db, decodeCheckpoint, `SELECT ${CHECKPOINT_COLUMNS} FROM job_checkpoints WHERE job_id = ? ORDER BY step`, jobId);
  }

  /** Keeps the job's checkpoints until `until` at least (never shortens). */
  extendRetention(jobId: string, until: number): void {
    this.db.run('UPDATE job_checkpoints SET expires_at = MAX(expires_at, ?) WHERE job_id = ? AND expires_at IS NOT NULL', until, jobId);
  }

  /** Deletes checkpoints expired by `now` (at most `limit`); returns their blobs. */
  deleteExpiredCheckpoints(now: number, limit: number): string[] {
    return this.db.tx(() => {
      const due = all(this.db, decodeCheckpoint, `SELECT ${CHECKPOINT_COLUMNS} FROM job_checkpoints WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?`, now, limit);
      for (const c of due) this.db.run('DELETE FROM job_checkpoints WHERE job_id = ? AND step = ?', c.jobId, c.step);
      return due.map((c) => c.blob);
    });
  }

  /** The owners of the jobs that kept this blob as a checkpoint. */
  checkpointOwners(blob: string): string[] {
    const rows = this.db.statement('SELECT DISTINCT j.owner AS owner FROM job_checkpoints c JOIN jobs j ON j.id = c.job_id WHERE c.blob = ?').all(blob) as { owner: string }[];
    return rows.map((r) => r.owner);
  }

  /** Whether a kept checkpoint is this blob. */
  referencesBlob(blob: string): boolean {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM job_checkpoints WHERE blob = ?', blob) > 0;
  }
}
