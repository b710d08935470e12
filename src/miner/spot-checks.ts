// A miner's answers to spot checks. Every heartbeat reply names all of the
// miner's forwards the orchestrator still wants proved (a reply that was lost
// costs nothing: the next one names them again). The miner uploads the record
// (weights, input and output frames) of each one it has not answered yet,
// and lets go of the forwards it reported that are not named.
import { encodeCheckBundle } from '../protocol/check-bundle.ts';
import type { WorkReport } from '../protocol/messages.ts';
import type { ForwardRecords } from './forward-records.ts';

/** Uploads a check bundle to `/runs/:runId/checks/:microbatch`. */
export type CheckUpload = (runId: string, microbatch: number, bundle: Uint8Array) => Promise<unknown>;

export class CheckAnswers {
  /** checks answered, or being answered: not uploaded twice */
  private answered = new Set<number>();

  constructor(
    private readonly records: ForwardRecords,
    private readonly upload: CheckUpload,
    private readonly log: (line: string) => void,
  ) {}

  /**
   * After a heartbeat: `reports` are what it carried, `checks` the open checks
   * its reply named. Returns one promise per upload (each settles; a failed
   * upload is logged and tried again at the next reply), resolving to the bytes sent.
   */
  answer(reports: readonly WorkReport[], checks: readonly number[]): Promise<number>[] {
    const open = new Set(checks);
    for (const r of reports) if (r.phase === 'forward' && !open.has(r.microbatch)) this.records.drop(r.microbatch);
    this.answered = new Set([...this.answered].filter((id) => open.has(id)));
    const uploads: Promise<number>[] = [];
    for (const id of open) {
      if (this.answered.has(id)) continue;
      const bundle = this.records.take(id);
      if (!bundle) {
        this.log(`spot check of microbatch ${id}: no longer kept`);
        this.answered.add(id);
        continue;
      }
      this.answered.add(id);
      const body = encodeCheckBundle(bundle);
      uploads.push(
        this.upload(bundle.meta.runId, id, body).then(
          () => body.length,
          (err) => {
            this.log(`spot check of microbatch ${id}: ${(err as Error).message}`);
            // keep it for the next reply that names the check
            this.answered.delete(id);
            this.records.add({ meta: bundle.meta, weights: bundle.weights, input: bundle.input, output: bundle.output });
            return 0;
          },
        ),
      );
    }
    return uploads;
  }

  clear(): void {
    this.answered.clear();
  }
}
