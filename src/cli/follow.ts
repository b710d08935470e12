// Following a run on the network: the orchestrator's view, polled, shown as a
// progress line (or JSON lines), until the run ends.
import type { RunView } from '../orchestrator/views.ts';
import { UserError } from './common.ts';
import { ProgressBar } from './progress.ts';

/** A JSON request to the orchestrator, with a clear error when it is unreachable or refuses. */
async function requestJson<T>(base: string, path: string, init: RequestInit): Promise<T> {
  let res: Response;
  try {
    res = await fetch(new URL(path, base), { ...init, signal: AbortSignal.timeout(15_000) });
  } catch (err) {
    throw new UserError(`cannot reach the orchestrator at ${base}: ${(err as Error).message}`);
  }
  const body = (await res.json().catch(() => ({}))) as T & { error?: string };
  if (!res.ok) throw new UserError(`${path}: ${body.error ?? res.statusText}`);
  return body;
}

/** GET a JSON document from the orchestrator. */
export function getJson<T>(base: string, path: string): Promise<T> {
  return requestJson<T>(base, path, {});
}

/** POST JSON to the orchestrator. */
export function postJson<T>(base: string, path: string, value: unknown): Promise<T> {
  return requestJson<T>(base, path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(value) });
}

/** One line describing a run's progress. */
export function describeRun(v: RunView): string {
  const replicas = v.stages.map((s) => s.replicas.filter((r) => r.alive).length).join('+');
  const mode = v.stages.some((s) => s.mode === 'merging') ? ' merging' : '';
  const loss = v.loss === null ? '-' : v.loss.toFixed(4);
  return `loss ${loss} ${Math.round(v.tokensPerSecond).toLocaleString('en-US')} tok/s miners ${replicas || '-'} merges ${v.mergesDone} ${v.status}${mode}`;
}

/** Polls until the run completes or fails; returns the last view. */
export async function followRun(base: string, runId: string, json: boolean, intervalMs = 1000): Promise<RunView> {
  const bar = new ProgressBar('run');
  const start = performance.now();
  let lastJson = '';
  for (;;) {
    const v = await getJson<RunView>(base, `/runs/${runId}`);
    if (json) {
      const line = JSON.stringify({ event: 'progress', id: v.id, status: v.status, step: v.microbatchesDone, steps: v.steps, loss: v.loss, tokensPerSecond: v.tokensPerSecond, mergesDone: v.mergesDone, minersPerStage: v.stages.map((s) => s.replicas.filter((r) => r.alive).length), bytesSent: v.bytesSent });
      if (line !== lastJson) process.stdout.write(line + '\n');
      lastJson = line;
    } else {
      bar.update({ done: v.microbatchesDone, total: v.steps, elapsedMs: performance.now() - start, text: describeRun(v) + (v.message ? ` (${v.message})` : '') });
    }
    if (v.status === 'completed' || v.status === 'failed') return v;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
