// What a miner keeps of its recent forwards so that it can answer a spot
// check: the weights the forward used, the activation frame it received and
// the one it sent. A record lives until the heartbeat that reported the
// forward is answered: the orchestrator then either asks for it (a check) or
// lets it go. The weights are kept where the stage keeps its own
// (./stage-trainer.ts): a copy in host memory, or on the GPU, read back only
// when a check asks for them (the bundle leaves the miner then).
import type { CheckMeta } from '../protocol/check-bundle.ts';

/** A copy of the weights one forward used, wherever the stage keeps it. */
export interface KeptWeights {
  /** The weights (an array the caller may keep); waits for a GPU's readback. */
  read(): Promise<Float32Array>;
  /** Lets the copy go; once released it is not read again. */
  release(): void;
}

/** Weights already in host memory: `release` hands the array back (to a pool, say). */
export function hostWeights(weights: Float32Array, release: (w: Float32Array) => void = () => {}): KeptWeights {
  let released = false;
  return {
    read: () => Promise.resolve(weights.slice()),
    release: () => {
      if (released) return;
      released = true;
      release(weights);
    },
  };
}

export interface ForwardRecord {
  meta: CheckMeta;
  weights: KeptWeights;
  input: Uint8Array | null;
  output: Uint8Array | null;
}

/** Records kept at most; past it the oldest is let go (and its check would go unanswered). */
export const DEFAULT_MAX_RECORDS = 64;

export class ForwardRecords {
  private readonly records = new Map<number, ForwardRecord>();

  constructor(
    /** records kept at most (a stage whose copies are large keeps fewer: StageRunner.keptWeightsLimit) */
    public maxRecords: number = DEFAULT_MAX_RECORDS,
  ) {}

  add(record: ForwardRecord): void {
    this.drop(record.meta.microbatch);
    this.records.set(record.meta.microbatch, record);
    while (this.records.size > this.maxRecords) this.drop(this.records.keys().next().value!);
  }

  /** The record of `microbatch`, now the caller's (who releases its weights), or null when it is not kept. */
  take(microbatch: number): ForwardRecord | null {
    const r = this.records.get(microbatch);
    if (!r) return null;
    this.records.delete(microbatch);
    return r;
  }

  drop(microbatch: number): void {
    const r = this.records.get(microbatch);
    if (!r) return;
    this.records.delete(microbatch);
    r.weights.release();
  }

  clear(): void {
    for (const id of [...this.records.keys()]) this.drop(id);
  }
}
