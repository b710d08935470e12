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

const Hex32 = Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' });
const Wei = Type.String({ pattern: '^[0-9]{1,78}$' });

/** POST /jobs: the spec, and on a paid network the JobEscrow id holding its budget (opened by the developer first). */
export const SubmitJobRequest = Type.Object({ spec: JobSpec, escrow: Type.Optional(Hex32) }, { additionalProperties: false });
export type SubmitJobRequest = Static<typeof SubmitJobRequest>;

/** POST /jobs/check: would this spec be taken (nothing recorded)? */
export const CheckJobRequest = Type.Object({ spec: JobSpec }, { additionalProperties: false });
export const JobCheck = Type.Object({
  steps: Count,
  /** wei to escrow before submitting (null: the job pays nothing: no budget, or an unpaid network) */
  escrow: Nullable(Wei),
});
export type JobCheck = Static<typeof JobCheck>;

/** GET /jobs/terms: how this network is paid (null: it is not). */
export const PaymentTermsView = Type.Object({
  chainId: Type.Integer({ minimum: 1 }),
  jobEscrow: Address,
  /** storage payments go to this account */
  payee: Address,
  nimPerPetaflop: Type.Number({ minimum: 0 }),
  storageNimPerGbDay: Type.Number({ minimum: 0 }),
});
export type PaymentTermsView = Static<typeof PaymentTermsView>;
export const JobTerms = Type.Object({ payment: Nullable(PaymentTermsView) });
export type JobTerms = Static<typeof JobTerms>;

/** POST /escrows/:id/release: an escrow that pays for no job goes back to its owner. */
export const EscrowRelease = Type.Object({ escrowId: Hex32, refunded: Wei, alreadyClosed: Type.Boolean(), tx: Nullable(Hex32) });
export type EscrowRelease = Static<typeof EscrowRelease>;

/** POST /jobs/:id/checkpoints/keep: keep an ended job's checkpoints until `days` after it ended; on a paid network with the hash of the NIM transfer that paid for it. */
export const KeepRequest = Type.Object({ days: Type.Integer({ minimum: 1, maximum: 3650 }), payment: Type.Optional(Hex32) }, { additionalProperties: false });
export type KeepRequest = Static<typeof KeepRequest>;
/** GET /jobs/:id/checkpoints/keep?days=N: what keeping them that long adds and costs. */
export const KeepQuote = Type.Object({
  days: Count,
  /** when they would expire */
  until: Ms,
  /** of the job's checkpoints */
  bytes: Count,
  /** GB-days added beyond their current expiry */
  gbDays: Type.Number({ minimum: 0 }),
  /** wei (0: nothing to pay) */
  price: Wei,
  /** where to pay it (null: an unpaid network) */
  payee: Nullable(Address),
});
export type KeepQuote = Static<typeof KeepQuote>;

/** How a job is paid for. */
export const JobPaymentView = Type.Object({
  escrowId: Hex32,
  /** wei escrowed: the budget */
  budget: Wei,
  /** wei owed to its miners so far (paid, or being paid) */
  committed: Wei,
  /** wei refunded when the escrow closed (null: open) */
  refunded: Nullable(Wei),
  status: Type.Union([Type.Literal('open'), Type.Literal('ending'), Type.Literal('closed')]),
  nimPerPetaflop: Type.Number({ minimum: 0 }),
  /** the budget ran out: the job was stopped */
  spent: Type.Boolean(),
  /** ms until which the orchestrator's lock on chain holds the escrow: its owner cannot close it before (null: closed, or not locked) */
  lockedUntil: Type.Optional(Nullable(Ms)),
  /** wei of its miners' work that will never be paid: the escrow was closed on chain before (its owner's close after the lock lapsed) */
  unpaid: Type.Optional(Wei),
  /** a payment or escrow call failing now, retried with backoff (null: none) */
  failing: Type.Optional(
    Nullable(
      Type.Object({
        /** `epoch N` (a payment), or `escrow` (renewing its lock, closing it) */
        what: Type.String(),
        error: Type.String(),
        attempts: Count,
        /** ms of the next try */
        retryAt: Nullable(Ms),
      }),
    ),
  ),
});
export type JobPaymentView = Static<typeof JobPaymentView>;

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
  /** the training loss when it was kept (null: none reported yet) */
  loss: Nullable(Type.Number()),
  /** mean cross-entropy (nats) on held-out data, measured by the orchestrator when it was kept (null: not measured) */
  heldoutLoss: Nullable(Type.Number()),
  /** an MLP classifier's share of held-out examples classified right (null: a GPT, or not measured) */
  heldoutAccuracy: Nullable(Type.Number()),
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
  /** its escrow (null: the job pays nothing) */
  payment: Type.Optional(Nullable(JobPaymentView)),
});
export type JobView = Static<typeof JobView>;

/** POST /jobs/:id/upgrade: the group to move to (empty: the orchestrator's default, src/jobs/layout.ts). */
export const UpgradeJobRequest = Type.Object({ stages: Type.Optional(JobLayout.properties.stages), replicas: Type.Optional(JobLayout.properties.replicas) }, { additionalProperties: false });
export type UpgradeJobRequest = Static<typeof UpgradeJobRequest>;

export const JobList = Type.Array(JobView);
export const JobEventList = Type.Array(JobEvent);
export const CheckpointList = Type.Array(CheckpointView);

/**
 * What anyone sees of a job that is not theirs (GET /jobs, /jobs/:id without
 * the owner's signature): what a network's status page needs, counts and
 * states. Its spec, name, owner, payment, messages and checkpoints are the
 * owner's (JobView, for a request signed by the owner).
 */
export const PublicJobView = Type.Object({
  id: JobId,
  status: JobStatus,
  steps: Count,
  step: Count,
  tokens: Count,
  tokensPerSecond: Type.Number({ minimum: 0 }),
  createdAt: Ms,
  startedAt: Nullable(Ms),
  endedAt: Nullable(Ms),
  /** checkpoints kept (their hashes are the owner's) */
  checkpoints: Count,
});
export type PublicJobView = Static<typeof PublicJobView>;

/** A job as its reader may see it: the whole (its owner, the operator) or the public part. */
export const JobEntry = Type.Union([JobView, PublicJobView]);
export type JobEntry = Static<typeof JobEntry>;

/** Whether a job's view is the whole one (the reader is its owner or the operator). */
export function isWholeJobView(v: JobEntry): v is JobView {
  return Array.isArray(v.checkpoints);
}

/** Jobs a page of GET /jobs holds by default, and at most (`limit`). */
export const JOB_PAGE_DEFAULT = 50;
export const JOB_PAGE_MAX = 200;
/** Where a page of jobs goes on from: the last job's creation time and id. */
export const JobCursor = Type.String({ pattern: '^[0-9]{1,16}\\.job-[0-9a-f]{16}$' });

/** GET /jobs?limit=N&cursor=C[&owner=A]: newest first; `next` asks for the page after (null: this is the last). */
export const JobPage = Type.Object({ jobs: Type.Array(JobEntry), next: Nullable(JobCursor) });
export type JobPage = Static<typeof JobPage>;
