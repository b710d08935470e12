// The dashboard's requests besides the live feed: reads of what the feed does
// not carry (a curve so far, a job's history, whether this browser is the
// operator) and the operator's actions, on this server only. Errors come back
// in the API's one contract ({ error, code }) and are thrown as ApiError.
import type { CancelAnswer, LossHistory, SessionView, UpgradeAnswer, WalletsView } from '../../src/api/dashboard.ts';
import type { DeploymentView, DeployRequest } from '../../src/api/deployments.ts';
import type { JobEvent, JobView } from '../../src/api/jobs.ts';
import type { RunMerges } from '../../src/api/merges.ts';
import type { JobPlan } from '../../src/jobs/plan-schema.ts';
import type { WorkTotal } from '../../src/api/schemas.ts';

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

async function call<T>(method: 'GET' | 'POST', path: string, payload?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (payload !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(path, { method, credentials: 'same-origin', headers, body: payload === undefined ? undefined : JSON.stringify(payload) });
  const body: unknown = await res.json().catch(() => null);
  if (!res.ok) {
    const e = (body ?? {}) as { error?: unknown; code?: unknown };
    throw new ApiError(res.status, typeof e.code === 'string' ? e.code : 'error', typeof e.error === 'string' ? e.error : `${method} ${path}: HTTP ${res.status}`);
  }
  return body as T;
}

const seg = (s: string): string => encodeURIComponent(s);

export const api = {
  session: (): Promise<SessionView> => call('GET', '/session'),
  logout: (): Promise<SessionView> => call('POST', '/logout'),
  loss: (kind: 'run' | 'job', id: string): Promise<LossHistory> => call('GET', `/${kind}s/${seg(id)}/loss`),
  jobEvents: (id: string): Promise<JobEvent[]> => call('GET', `/jobs/${seg(id)}/events`),
  jobPlan: (id: string): Promise<JobPlan> => call('GET', `/jobs/${seg(id)}/plan`),
  cancel: (kind: 'run' | 'job', id: string): Promise<CancelAnswer> => call('POST', `/operator/${kind}s/${seg(id)}/cancel`),
  wallets: (): Promise<WalletsView> => call('GET', '/wallets'),
  runWork: (id: string): Promise<WorkTotal[]> => call('GET', `/runs/${seg(id)}/work`),
  runMerges: (id: string): Promise<RunMerges> => call('GET', `/runs/${seg(id)}/merges`),
  upgrade: (id: string): Promise<UpgradeAnswer> => call('POST', `/operator/jobs/${seg(id)}/upgrade`),
  submitJob: (spec: unknown): Promise<JobView> => call('POST', '/operator/jobs', { spec }),
  deploy: (sha256: string, request: DeployRequest): Promise<DeploymentView> => call('POST', `/operator/models/${seg(sha256)}/deploy`, request),
  undeploy: (sha256: string): Promise<DeploymentView> => call('POST', `/operator/models/${seg(sha256)}/undeploy`),
};
