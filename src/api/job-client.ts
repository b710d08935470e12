// The job half of the orchestrator's public API (routes in
// src/orchestrator/routes/jobs.ts, contracts in ./jobs.ts): submit, list,
// follow (server-sent events), cancel, and checkpoints. What a developer does
// is signed with their wallet key through the OrchestratorClient; so are its
// reads when it has a key, since a job reads whole only to its owner (anyone
// else gets its public part, PublicJobView).
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { NimbleError } from '../protocol/errors.ts';
import type { JobLayout } from '../jobs/layout.ts';
import type { JobSpec } from '../jobs/spec.ts';
import { parseJson } from '../protocol/messages.ts';
import type { OrchestratorClient } from './client.ts';
import { readEvents } from './event-stream.ts';
import { CheckpointList, EscrowRelease, isWholeJobView, JOB_PAGE_MAX, JobCheck, JobEntry, JobEvent, JobEventList, JobPage, JobTerms, KeepQuote, JobView, type CheckpointView } from './jobs.ts';

/** Pages `entries` reads at most (JOB_PAGE_MAX each). */
const MAX_PAGES = 50;

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

  /** A GET signed as the developer when the client has a key (its own jobs read whole), else anonymous (the public part). */
  private async read<T extends TSchema>(path: string, reply: T, what: string): Promise<Static<T>> {
    if (!this.api.canSign) return this.api.http.get(path, reply, what);
    return parseJson(reply, await (await this.api.signed()).request('GET', path), what);
  }

  private async openRead(path: string, headers: Record<string, string>, signal?: AbortSignal): Promise<Response> {
    return this.api.canSign ? (await this.api.signed()).open(path, headers, signal) : this.api.http.open(path, headers, signal);
  }

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

  /** One page of the network's jobs (of `owner` when given), newest first: whole where this client signs as their owner. */
  page(o: { owner?: string; limit?: number; cursor?: string } = {}): Promise<JobPage> {
    const q = new URLSearchParams();
    if (o.owner) q.set('owner', o.owner);
    if (o.limit !== undefined) q.set('limit', String(o.limit));
    if (o.cursor) q.set('cursor', o.cursor);
    const query = q.toString();
    return this.read(`/jobs${query ? `?${query}` : ''}`, JobPage, 'job list');
  }

  /** The network's jobs (of `owner` when given), newest first, every page (MAX_PAGES at most). */
  async entries(owner?: string): Promise<JobEntry[]> {
    const out: JobEntry[] = [];
    let cursor: string | undefined;
    for (let i = 0; i < MAX_PAGES; i++) {
      const p = await this.page({ owner, limit: JOB_PAGE_MAX, cursor });
      out.push(...p.jobs);
      if (!p.next) break;
      cursor = p.next;
    }
    return out;
  }

  /** Our own jobs, whole (this client must sign as `owner`). */
  async list(owner: string): Promise<JobView[]> {
    return (await this.entries(owner)).map((j) => whole(j));
  }

  /** A job as this client may see it: whole when it signs as the job's owner, else its public part. */
  view(id: string): Promise<JobEntry> {
    return this.read(`/jobs/${encodeURIComponent(id)}`, JobEntry, 'job');
  }

  /** One of our jobs, whole (signed as its owner; another's is refused with 403). */
  async get(id: string): Promise<JobView> {
    return whole(await this.view(id));
  }

  /** The job's history after event `after` (its status changes only, for anyone but its owner). */
  events(id: string, after = 0): Promise<JobEvent[]> {
    return this.read(`/jobs/${encodeURIComponent(id)}/events?after=${after}`, JobEventList, 'job events');
  }

  async cancel(id: string): Promise<JobView> {
    return parseJson(JobView, await (await this.api.signed()).request('POST', `/jobs/${encodeURIComponent(id)}/cancel`), 'job');
  }

  /** The job's checkpoints (its owner's: signed). */
  checkpoints(id: string): Promise<CheckpointView[]> {
    return this.read(`/jobs/${encodeURIComponent(id)}/checkpoints`, CheckpointList, 'checkpoint list');
  }

  /** Moves the job onto `layout` (stages × replicas; absent: the orchestrator's choice) from the checkpoint its current run ends with. */
  async upgrade(id: string, layout?: JobLayout): Promise<JobView> {
    return (await this.api.signed()).postJson(`/jobs/${encodeURIComponent(id)}/upgrade`, layout ?? {}, JobView, 'job');
  }

  /** What keeping an ended job's checkpoints until `days` after its end adds and costs. */
  keepQuote(id: string, days: number): Promise<KeepQuote> {
    return this.read(`/jobs/${encodeURIComponent(id)}/checkpoints/keep?days=${days}`, KeepQuote, 'keep quote');
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
    const res = await this.openRead(`/jobs/${encodeURIComponent(id)}/events?after=${after}`, { accept: 'text/event-stream' }, signal);
    for await (const e of readEvents(res)) {
      if (e.event === 'progress') yield { kind: 'progress', progress: parseJson(JobProgress, e.data, 'job progress') };
      else if (e.event === 'end') {
        yield { kind: 'end' };
        return;
      } else yield { kind: 'event', event: parseJson(JobEvent, e.data, 'job event') };
    }
  }
}

/** A job's whole view, or a 403 for the public part of another's. */
function whole(v: JobEntry): JobView {
  if (!isWholeJobView(v)) throw new NimbleError('forbidden', `job ${v.id} is not yours: only its public part is shown to you (sign with its owner's key)`, 403);
  return v;
}
