// A miner's answers to spot checks: each heartbeat reply names the reported
// forwards the orchestrator wants proved; the miner uploads their records
// (weights, input and output frames) and lets the other reported forwards go.
import { encodeCheckBundle } from '../protocol/check-bundle.ts';
import type { WorkReport } from '../protocol/messages.ts';
import type { ForwardRecords } from './forward-records.ts';

/** Uploads a check bundle to `/runs/:runId/checks/:microbatch`. */
export type CheckUpload = (runId: string, microbatch: number, bundle: Uint8Array) => Promise<unknown>;

/**
 * Answers the checks of one heartbeat: `reports` are the ones it carried,
 * `checks` the microbatches the reply asks to prove. Returns one promise per
 * upload (each settles; a failed upload is logged), resolving to the bytes sent.
 */
export function answerChecks(
  records: ForwardRecords,
  reports: readonly WorkReport[],
  checks: readonly number[],
  upload: CheckUpload,
  log: (line: string) => void,
): Promise<number>[] {
  const asked = new Set(checks);
  for (const r of reports) if (r.phase === 'forward' && !asked.has(r.microbatch)) records.drop(r.microbatch);
  const uploads: Promise<number>[] = [];
  for (const id of asked) {
    const bundle = records.take(id);
    if (!bundle) {
      log(`spot check of microbatch ${id}: no longer kept`);
      continue;
    }
    const body = encodeCheckBundle(bundle);
    uploads.push(
      upload(bundle.meta.runId, id, body).then(
        () => body.length,
        (err) => {
          log(`spot check of microbatch ${id}: ${(err as Error).message}`);
          return 0;
        },
      ),
    );
  }
  return uploads;
}
