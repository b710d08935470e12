// Following a run on the network: the orchestrator's view, polled, shown as a
// progress line (or JSON lines), until the run ends.
import type { OrchestratorClient } from '../../api/client.ts';
import { FINAL_RUN_STATUSES, type RunView } from '../../api/schemas.ts';
import { ProgressBar } from '../progress.ts';

/** One line describing a run's progress. */
export function describeRun(v: RunView): string {
  const replicas = v.stages.map((s) => s.replicas.filter((r) => r.alive).length).join('+');
  const mode = v.stages.some((s) => s.mode === 'merging') ? ' merging' : '';
  const loss = v.loss === null ? '-' : v.loss.toFixed(4);
  return `loss ${loss} ${Math.round(v.tokensPerSecond).toLocaleString('en-US')} tok/s miners ${replicas || '-'} merges ${v.mergesDone} ${v.status}${mode}`;
}

/** Polls until the run completes or fails; returns the last view. */
export async function followRun(api: OrchestratorClient, runId: string, json: boolean, intervalMs = 1000): Promise<RunView> {
  const bar = new ProgressBar('run');
  const start = performance.now();
  let lastJson = '';
  for (;;) {
    const v = await api.run(runId);
    if (json) {
      const line = JSON.stringify({ event: 'progress', id: v.id, status: v.status, step: v.microbatchesDone, steps: v.steps, loss: v.loss, tokensPerSecond: v.tokensPerSecond, mergesDone: v.mergesDone, minersPerStage: v.stages.map((s) => s.replicas.filter((r) => r.alive).length), bytesSent: v.bytesSent });
      if (line !== lastJson) process.stdout.write(line + '\n');
      lastJson = line;
    } else {
      bar.update({ done: v.microbatchesDone, total: v.steps, elapsedMs: performance.now() - start, text: describeRun(v) + (v.message ? ` (${v.message})` : '') });
    }
    if (FINAL_RUN_STATUSES.includes(v.status)) return v;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
