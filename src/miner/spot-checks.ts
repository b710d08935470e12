// A miner's answers to spot checks. Every heartbeat reply names all of the
// miner's forwards the orchestrator still wants proved (a reply that was lost
// costs nothing: the next one names them again). The miner uploads the record
// (weights, input and output frames) of each one it has not answered yet,
// and lets go of the forwards it reported that are not named.
import { encodeCheckBundle, type CheckBundle } from '../protocol/check-bundle.ts';
import type { WorkReport } from '../protocol/messages.ts';
import { hostWeights, type ForwardRecord, type ForwardRecords } from './forward-records.ts';

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
      const record = this.records.take(id);
      this.answered.add(id);
      if (!record) {
        this.log(`spot check of microbatch ${id}: no longer kept`);
        continue;
      }
      uploads.push(this.send(id, record));
    }
    return uploads;
  }

  /** Reads the record's weights (a GPU's readback), uploads its bundle; on failure keeps it for the next reply that names the check. Resolves to the bytes sent. */
  private async send(id: number, record: ForwardRecord): Promise<number> {
    let weights: Float32Array;
    try {
      weights = await record.weights.read();
    } catch (err) {
      this.log(`spot check of microbatch ${id}: its weights could not be read: ${(err as Error).message}`);
      return 0;
    } finally {
      record.weights.release();
    }
    const bundle: CheckBundle = { meta: record.meta, weights, input: record.input, output: record.output };
    const body = encodeCheckBundle(bundle);
    try {
      await this.upload(bundle.meta.runId, id, body);
      return body.length;
    } catch (err) {
      this.log(`spot check of microbatch ${id}: ${(err as Error).message}`);
      this.answered.delete(id);
      this.records.add({ ...record, weights: hostWeights(weights) });
      return 0;
    }
  }

  clear(): void {
    this.answered.clear();
  }
}
