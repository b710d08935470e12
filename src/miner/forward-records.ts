// What a miner keeps of its recent forwards so that it can answer a spot
// check: the weights the forward used, the activation frame it received and
// the one it sent. A record lives until the heartbeat that reported the
// forward is answered: the orchestrator then either asks for it (a check) or
// lets it go. Weight copies come from a small pool, so steady training
// allocates nothing.
import type { CheckBundle, CheckMeta } from '../protocol/check-bundle.ts';

export interface ForwardRecord {
  meta: CheckMeta;
  weights: Float32Array;
  input: Uint8Array | null;
  output: Uint8Array | null;
}

/** Records kept at most; past it the oldest is let go (and its check would go unanswered). */
export const DEFAULT_MAX_RECORDS = 64;

export class ForwardRecords {
  private readonly records = new Map<number, ForwardRecord>();
  private readonly pool: Float32Array[] = [];

  constructor(readonly maxRecords: number = DEFAULT_MAX_RECORDS) {}

  /** A pooled buffer of `length` values (contents unspecified), for a record about to be made. */
  buffer(length: number): Float32Array {
    const buf = this.pool.pop();
    return buf && buf.length === length ? buf : new Float32Array(length);
  }

  /** A copy of `weights` in a pooled buffer, for a record about to be made. */
  snapshot(weights: Float32Array): Float32Array {
    const buf = this.buffer(weights.length);
    buf.set(weights);
    return buf;
  }

  /** Returns a snapshot that will not be recorded (the forward failed). */
  recycle(weights: Float32Array): void {
    if (this.pool.length < 4) this.pool.push(weights);
  }

  add(record: ForwardRecord): void {
    this.drop(record.meta.microbatch);
    this.records.set(record.meta.microbatch, record);
    while (this.records.size > this.maxRecords) this.drop(this.records.keys().next().value!);
  }

  /** The bundle for a check of `microbatch`, or null when it is not kept; the record is let go. */
  take(microbatch: number): CheckBundle | null {
    const r = this.records.get(microbatch);
    if (!r) return null;
    this.records.delete(microbatch);
    const bundle: CheckBundle = { meta: r.meta, weights: r.weights.slice(), input: r.input, output: r.output };
    this.recycle(r.weights);
    return bundle;
  }

  drop(microbatch: number): void {
    const r = this.records.get(microbatch);
    if (!r) return;
    this.records.delete(microbatch);
    this.recycle(r.weights);
  }

  clear(): void {
    for (const id of [...this.records.keys()]) this.drop(id);
  }
}
