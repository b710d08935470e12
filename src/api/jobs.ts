// The job routes' contracts (what `nbcli job`, `nbcli checkpoint` and
// dashboards read and send): TypeBox schemas shared by the server
// (src/orchestrator/routes/jobs.ts) and the client (./client.ts).
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { JobLayout } from '../jobs/layout.ts';
import { JobSpec } from '../jobs/spec.ts';
import { JobStatus } from '../jobs/status.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

export const JOB_ID_PATTERN = '^job-[0-9a-f]{16}$';
export const JobId = Type.String({ pattern: JOB_ID_PATTERN });

export const SubmitJobRequest = Type.Object({ spec: JobSpec }, { additionalProperties: false });
export type SubmitJobRequest = Static<typeof SubmitJobRequest>;

/** One line of a job's history: a status change, or a message about its progress. */
export const JobEvent = Type.Object({
  seq: Count,
  at: Ms,
  kind: Type.Union([Type.Literal('status'), Type.Literal('message'), Type.Literal('checkpoint')]),
  /** the status after this event */
  status: JobStatus,
  message: Type.String(),
});
export type JobEvent = Static<typeof JobEvent>;

export const CheckpointView = Type.Object({
  jobId: JobId,
  step: Count,
  tokens: Count,
  /** held-out loss when it was kept (null: not measured) */
  loss: Nullable(Type.Number()),
  sha256: Sha256,
  bytes: Count,
  createdAt: Ms,
  /** when the collector deletes it (null: while the job runs) */
  expiresAt: Nullable(Ms),
});
export type CheckpointView = Static<typeof CheckpointView>;

export const JobView = Type.Object({
  id: JobId,
  name: Type.String(),
  owner: Address,
  status: JobStatus,
  spec: JobSpec,
  /** the run that trains it now (its placement and pipeline: GET /runs/:id) */
  runId: Nullable(Type.String()),
  steps: Count,
  step: Count,
  tokens: Count,
  loss: Nullable(Type.Number()),
  tokensPerSecond: Type.Number({ minimum: 0 }),
  /** ms left at the current rate (null: unknown) */
  etaMs: Nullable(Ms),
  /** why it waits, stalls or ended */
  message: Nullable(Type.String()),
  createdAt: Ms,
  startedAt: Nullable(Ms),
  endedAt: Nullable(Ms),
  /** the last time its step count moved (or it was submitted) */
  lastProgressAt: Ms,
  timeoutAt: Ms,
  idleTimeoutMs: Ms,
  /** an upgrade asked for and not yet made (the current run is finishing) */
  upgrade: Nullable(JobLayout),
  checkpoints: Type.Array(CheckpointView),
});
export type JobView = Static<typeof JobView>;

/** POST /jobs/:id/upgrade: the group to move to (empty: the orchestrator's default, src/jobs/layout.ts). */
export const UpgradeJobRequest = Type.Object({ stages: Type.Optional(JobLayout.properties.stages), replicas: Type.Optional(JobLayout.properties.replicas) }, { additionalProperties: false });
export type UpgradeJobRequest = Static<typeof UpgradeJobRequest>;

export const JobList = Type.Array(JobView);
export const JobEventList = Type.Array(JobEvent);
export const CheckpointList = Type.Array(CheckpointView);
