// Statuses that do not change any more (as src/api/schemas.ts and
// src/jobs/status.ts say; repeated here so the page bundles no server code).
import type { JobView } from '../../src/api/jobs.ts';
import type { RunStatus } from '../../src/api/schemas.ts';

export const FINAL_RUN_STATUSES: readonly RunStatus[] = ['completed', 'failed', 'cancelled'];
export const FINAL_JOB_STATUSES: readonly JobView['status'][] = ['completed', 'failed', 'timed_out', 'cancelled', 'idle_stopped'];
