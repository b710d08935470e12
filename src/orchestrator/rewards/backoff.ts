// How long a failing chain send waits before it is tried again: every send
// the orchestrator retries (an epoch's settlement and a slash here, ./epochs.ts;
// payments from and closes of job escrows, ../jobs/job-payments.ts; payments
// from credit escrows, ../serving/credits.ts) waits 1 s after its first
// failure, twice as long after each next one, never longer than 5 minutes,
// so a chain that keeps refusing (a role revoked, an escrow closed, an RPC
// down) costs one try per wait, not one every pass. Each keeps its tries and
// its next one on its row (a restart waits the same), logs each failure, and
// shows them in the operator's views (GET /epochs, a job's events and escrow,
// a credit escrow).

/** The first retry of a failed chain call comes this long after it (1 s)… */
export const RETRY_BASE_MS = 1_000;
/** …each next one twice as long after the last, never longer than this (5 min). */
export const RETRY_MAX_MS = 300_000;

/** How long after its `attempts`-th failed try a chain call is tried again. */
export function retryDelayMs(attempts: number): number {
  return Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** Math.max(0, Math.min(30, attempts - 1)));
}

/** Whether a row whose next try is at `retryAt` (null: none set) may be tried at `now`. */
export function retryDue(retryAt: number | null, now: number): boolean {
  return retryAt === null || retryAt <= now;
}
