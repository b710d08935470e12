// The traffic between the stages of each run under way, as the pipeline
// picture shows it (docs/dashboard.md). No byte counter is kept per hop, so it
// is computed from what is known: the microbatches that crossed a boundary
// (the work log: a completed microbatch credits a forward and a backward
// unit to each stage of its path, src/orchestrator/training/microbatches.ts; so the
// forward units of stage s count the activations stage s sent to s + 1, and
// the backward units of stage s + 1 the gradients it sent back) times the
// payload bytes of one microbatch's frame at the run's codec (an activation
// and its gradient have the same shape, [batch × context, d_model], and go
// in the same codec: src/miner/pipeline.ts). Frame headers and attempts that
// did not complete are not counted.
//
// The work log is read incrementally (entries after the last one read, by
// primary key), at most every WORK_EVERY_MS; each run's rate is taken over
// about the last minute, as the miners' work per minute is.
import type { BoundaryTraffic, RunTraffic } from '../../api/dashboard.ts';
import { parseModelRef } from '../../model/model-ref.ts';
import { DEFAULT_BLOCK_SIZE, payloadByteLength } from '../../protocol/codec.ts';
import type { ActivationCodec } from '../../protocol/messages.ts';
import type { Ledger } from '../state/ledger.ts';
import type { RunRecord } from '../state/runs.ts';

/** The traffic is computed again at most this often. */
export const TRAFFIC_EVERY_MS = 2_000;
/** A boundary's rate is taken over about this long ... */
export const TRAFFIC_RATE_WINDOW_MS = 60_000;
/** ... and only once it was watched for at least this long. */
const RATE_MIN_MS = 5_000;
/** Work log entries read per query while catching up. */
const CHUNK = 50_000;

/** The shape and payload bytes of one microbatch's activation (or gradient) frame, as it crosses a boundary of the run; null for a model that is not cut (an MLP). */
export function activationFrame(model: string, batchSize: number, codec: ActivationCodec): { shape: [number, number]; bytes: number } | null {
  let ref;
  try {
    ref = parseModelRef(model);
  } catch {
    return null;
  }
  if (ref.kind !== 'gpt') return null;
  const shape: [number, number] = [batchSize * ref.config.contextLength, ref.config.channels];
  return { shape, bytes: payloadByteLength(codec, shape, shape[0] * shape[1], DEFAULT_BLOCK_SIZE) };
}

/** Units per stage of a run, forward and backward. */
interface Counts {
  forward: number[];
  backward: number[];
}

interface Mark extends Counts {
  at: number;
}

export class StageTraffic {
  /** the last work log entry read */
  private after = 0;
  private readonly counts = new Map<string, Counts>();
  private readonly marks = new Map<string, Mark[]>();
  private last: { at: number; byRun: Map<string, RunTraffic> } | null = null;

  constructor(
    private readonly ledger: Pick<Ledger, 'workBetween' | 'lastWorkId'>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The traffic of each run in `active` (the runs under way), computed again at most every TRAFFIC_EVERY_MS. */
  of(active: readonly RunRecord[]): Map<string, RunTraffic> {
    const now = this.now();
    if (this.last && now - this.last.at < TRAFFIC_EVERY_MS) return this.last.byRun;
    // nobody watched for a while: a rate over the gap would not be about the last minute
    if (this.last && now - this.last.at > TRAFFIC_RATE_WINDOW_MS) this.marks.clear();
    this.readLog();
    const ids = new Set(active.map((r) => r.id));
    for (const id of this.counts.keys()) if (!ids.has(id)) this.counts.delete(id);
    for (const id of this.marks.keys()) if (!ids.has(id)) this.marks.delete(id);
    const byRun = new Map<string, RunTraffic>();
    for (const run of active) {
      const t = this.runTraffic(run, now);
      if (t) byRun.set(run.id, t);
    }
    this.last = { at: now, byRun };
    return byRun;
  }

  /** Adds the forward and backward units logged since the last read, per run and stage. */
  private readLog(): void {
    const last = this.ledger.lastWorkId();
    while (this.after < last) {
      const to = Math.min(last, this.after + CHUNK);
      for (const w of this.ledger.workBetween(this.after, to)) {
        if ((w.kind !== 'forward' && w.kind !== 'backward') || w.runId === null || w.stage === null) continue;
        const c = this.counts.get(w.runId) ?? this.counts.set(w.runId, { forward: [], backward: [] }).get(w.runId)!;
        c[w.kind][w.stage] = (c[w.kind][w.stage] ?? 0) + w.units;
      }
      this.after = to;
    }
  }

  private runTraffic(run: RunRecord, now: number): RunTraffic | null {
    const frame = activationFrame(run.model, run.batchSize, run.options.codec);
    if (!frame) return null;
    const c = this.counts.get(run.id) ?? { forward: [], backward: [] };
    const marks = this.marks.get(run.id) ?? this.marks.set(run.id, []).get(run.id)!;
    marks.push({ at: now, forward: [...c.forward], backward: [...c.backward] });
    while (marks.length > 1 && marks[1].at <= now - TRAFFIC_RATE_WINDOW_MS) marks.shift();
    const since = now - marks[0].at >= RATE_MIN_MS ? marks[0] : null;
    const rate = (units: number, before: number | undefined): number | null => (since === null ? null : (Math.max(0, units - (before ?? 0)) * frame.bytes * 1000) / (now - since.at));
    const boundaries: BoundaryTraffic[] = [];
    for (let s = 0; s + 1 < run.stageCount; s++) {
      const forward = Math.round(c.forward[s] ?? 0);
      const backward = Math.round(c.backward[s + 1] ?? 0);
      boundaries.push({
        from: s,
        forwardMicrobatches: forward,
        backwardMicrobatches: backward,
        forwardBytes: forward * frame.bytes,
        backwardBytes: backward * frame.bytes,
        forwardBytesPerSecond: rate(forward, since?.forward[s]),
        backwardBytesPerSecond: rate(backward, since?.backward[s + 1]),
      });
    }
    return { codec: run.options.codec, shape: frame.shape, frameBytes: frame.bytes, boundaries };
  }
}
