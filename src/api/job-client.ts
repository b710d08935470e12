// The job half of the orchestrator's public API (routes in
// src/orchestrator/routes/jobs.ts, contracts in ./jobs.ts): submit, list,
// follow (server-sent events), cancel, and checkpoints. What a developer does
// is signed with their wallet key through the OrchestratorClient.
import { Type } from '@sinclair/typebox';
import type { JobLayout } from '../jobs/layout.ts';
import type { JobSpec } from '../jobs/spec.ts';
import { parseJson } from '../protocol/messages.ts';
import type { OrchestratorClient } from './client.ts';
import { readEvents } from './event-stream.ts';
import { CheckpointList, EscrowRelease, JobCheck, JobEvent, JobEventList, JobList, JobTerms, JobView, KeepQuote, type CheckpointView } from './jobs.ts';

/** What `follow` yields: a job event, or a progress update. */
export type JobUpdate =
  | { kind: 'event'; event: JobEvent }
  | { kind: 'progress'; progress: JobProgress }
  | { kind: 'end' };

export const JobProgress = Type.Object({
  status: Type.String(),
  step: Type.Integer({ minimum: 0 }),
  steps: Type.Integer({ minimum: 0 }),
  tokens: Type.Integer({ minimum: 0 }),
  loss: Type.Union([Type.Number(), Type.Null()]),
  tokensPerSecond: Type.Number({ minimum: 0 }),
  etaMs: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()]),
});
export type JobProgress = typeof JobProgress.static;

export class JobClient {
  constructor(readonly api: OrchestratorClient) {}

  /** Submits a job; on a paid network with the id of the escrow holding its budget (see `terms`, `check`). */
  async submit(spec: JobSpec, escrow?: string): Promise<JobView> {
    return (await this.api.signed()).postJson('/jobs', escrow ? { spec, escrow } : { spec }, JobView, 'job');
  }

  /** Whether the orchestrator would take this spec, and what to escrow for it (nothing is recorded). */
  async check(spec: JobSpec): Promise<JobCheck> {
    return (await this.api.signed()).postJson('/jobs/check', { spec }, JobCheck, 'job check');
  }

  /** How this network is paid (null: it is not). */
  terms(): Promise<JobTerms> {
    return this.api.http.get('/jobs/terms', JobTerms, 'payment terms');
  }

  /** Gets back an escrow of ours that pays for no job (a submission that failed after it was opened). */
  async release(escrowId: string): Promise<EscrowRelease> {
    return (await this.api.signed()).postJson(`/escrows/${escrowId}/release`, {}, EscrowRelease, 'escrow release');
  }

  list(owner?: string): Promise<JobView[]> {
    return this.api.http.get(`/jobs${owner ? `?owner=${encodeURIComponent(owner)}` : ''}`, JobList, 'job list');
  }

  get(id: string): Promise<JobView> {
    return this.api.http.get(`/jobs/${encodeURIComponent(id)}`, JobView, 'job');
  }

  /** The job's history after event `after`. */
  events(id: string, after = 0): Promise<JobEvent[]> {
    return this.api.http.get(`/jobs/${encodeURIComponent(id)}/events?after=${after}`, JobEventList, 'job events');
  }

  async cancel(id: string): Promise<JobView> {
    return parseJson(JobView, await (await this.api.signed()).request('POST', `/jobs/${encodeURIComponent(id)}/cancel`), 'job');
  }

  checkpoints(id: string): Promise<CheckpointView[]> {
    return this.api.http.get(`/jobs/${encodeURIComponent(id)}/checkpoints`, CheckpointList, 'checkpoint list');
  }

  /** Moves the job onto `layout` (stages × replicas; absent: the orchestrator's choice) from the checkpoint its current run ends with. */
  async upgrade(id: string, layout?: JobLayout): Promise<JobView> {
    return (await this.api.signed()).postJson(`/jobs/${encodeURIComponent(id)}/upgrade`, layout ?? {}, JobView, 'job');
  }

  /** What keeping an ended job's checkpoints until `days` after its end adds and costs. */
  keepQuote(id: string, days: number): Promise<KeepQuote> {
    return this.api.http.get(`/jobs/${encodeURIComponent(id)}/checkpoints/keep?days=${days}`, KeepQuote, 'keep quote');
  }

  /** Keeps an ended job's checkpoints until `days` after its end; `payment`: the hash of the NIM transfer that paid the quote. */
  async keep(id: string, days: number, payment?: string): Promise<CheckpointView[]> {
    return (await this.api.signed()).postJson(`/jobs/${encodeURIComponent(id)}/checkpoints/keep`, payment ? { days, payment } : { days }, CheckpointList, 'checkpoint list');
  }

  /** Opens a checkpoint's bytes from `offset` on (a resumed download asks for the rest). */
  async openCheckpoint(id: string, step: number, offset = 0, signal?: AbortSignal): Promise<Response> {
    return (await this.api.signed()).open(`/jobs/${encodeURIComponent(id)}/checkpoints/${step}`, offset > 0 ? { range: `bytes=${offset}-` } : {}, signal);
  }

  /** The job's events from `after` on, then each as it happens, with progress, until the job ends or `signal` aborts. */
  async *follow(id: string, after = 0, signal?: AbortSignal): AsyncGenerator<JobUpdate> {
    const res = await this.api.http.open(`/jobs/${encodeURIComponent(id)}/events?after=${after}`, { accept: 'text/event-stream' }, signal);
    for await (const e of readEvents(res)) {
      if (e.event === 'progress') yield { kind: 'progress', progress: parseJson(JobProgress, e.data, 'job progress') };
      else if (e.event === 'end') {
        yield { kind: 'end' };
        return;
      } else yield { kind: 'event', event: parseJson(JobEvent, e.data, 'job event') };
    }
  }
}
