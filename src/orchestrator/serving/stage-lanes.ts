// Continuous batching on the orchestrator's serving path (docs/inference.md,
// "Serve"): a StageLane drives the steps of every generation routed through
// the same replicas (one per stage) of a deployment. Each generation submits
// its next rows (its window with `reset`, or its last token) and waits for its
// logits; the lane sends each stage ONE frame holding the rows of every
// session ready at that moment (its meta lists them: id, rows, reset), relays
// stage i's answer to stage i + 1, and hands each session its logits row.
// Sessions join and leave between steps: while a step is in flight the next
// submissions queue, and the lane sends them together once it is back (after
// a macrotask, so that every session the last step answered has submitted its
// next token).
//
// A stage call that fails (unreachable, a timeout or a stall (./stall-deadlines.ts), a 5xx, a malformed frame,
// a miner that no longer holds the stage or the session) rejects every
// session of that step with a StageCallError naming the stage and the miner,
// and whether trying another replica makes sense (./completions.ts replays
// them there). A 4xx that says our request was bad is not worth another
// replica: the same rows would be refused again.
import type { ActivationCodec } from '../../inference/activations.ts';
import type { NimbleError } from '../../protocol/errors.ts';
import { decodeFrame, encodeFrame, type JsonValue } from '../../protocol/frame.ts';
import type { Peer } from '../../protocol/messages.ts';
import type { StallDeadlines } from './stall-deadlines.ts';

const MAX_FRAME_BYTES = 64 << 20;
/** Statuses that say the miner, not the request, is the problem: another replica may serve it. */
const REPLICA_STATUSES = new Set([404, 408, 409, 425, 429]);

/** One session's rows for the next step. */
export interface LaneEntry {
  session: string;
  /** the window to start again (reset) or the one token to feed */
  tokens: readonly number[];
  reset: boolean;
}

/** What one stage did for one session in one step (./completions.ts turns it into a StageStep). */
export interface LaneStep {
  session: string;
  stage: number;
  peer: Peer;
  reset: boolean;
  rows: number;
  input: Float32Array;
  output: Float32Array;
  /** this session's share of the frames' bytes (the shares of a step sum to the frames' sizes) */
  bytesSent: number;
  bytesReceived: number;
  /** sessions in the frame */
  batch: number;
}

/** A stage call that failed, for every session of its step. */
export class StageCallError extends Error {
  override readonly name = 'StageCallError';
  constructor(
    readonly stage: number,
    readonly peer: Peer,
    /** the miner's status (502 when it could not be reached or answered a malformed frame) */
    readonly status: number,
    /** another replica of the stage may serve it (the miner failed, not our request) */
    readonly retryable: boolean,
    message: string,
  ) {
    super(message);
  }
}

export interface LaneSettings {
  deploymentId: string;
  channels: number;
  vocab: number;
  /** how activations cross stage boundaries */
  codec: ActivationCodec;
  /** rows one call may carry (the miners' maxRows) */
  maxRows: number;
  /** sessions one call may carry */
  maxSessions: number;
  /** sends a POST /infer body (./stage-channels.ts); resolves with the answer's bytes or throws a NimbleError (`unreachable` after `timeoutMs`) */
  call(peer: Peer, body: Uint8Array, timeoutMs: number): Promise<Uint8Array>;
  /** how long a call may take before its miner is taken as hung */
  deadlines: StallDeadlines;
  /** each session's step at each stage that answered well */
  onStep(step: LaneStep): void;
  /** the lane has nothing queued or in flight */
  onIdle(): void;
}

interface Waiting {
  entry: LaneEntry;
  resolve(logits: Float32Array): void;
  reject(err: Error): void;
}

export class StageLane {
  private queue: Waiting[] = [];
  private running = false;
  private steps = 0;

  constructor(readonly route: readonly Peer[], private readonly s: LaneSettings) {
    if (route.length === 0) throw new RangeError('a lane needs at least one stage');
  }

  /** Steps sent so far (frames per stage). */
  get stepCount(): number {
    return this.steps;
  }

  /** Queues a session's rows for the next step; resolves with its logits (V floats). */
  submit(entry: LaneEntry): Promise<Float32Array> {
    if (entry.tokens.length === 0 || entry.tokens.length > this.s.maxRows) throw new RangeError(`a step of session ${entry.session} has ${entry.tokens.length} rows; 1 … ${this.s.maxRows}`);
    return new Promise((resolve, reject) => {
      this.queue.push({ entry, resolve, reject });
      if (!this.running) {
        this.running = true;
        setImmediate(() => void this.pump());
      }
    });
  }

  /** Runs steps while sessions are waiting. */
  private async pump(): Promise<void> {
    while (this.queue.length > 0) {
      const batch = this.take();
      try {
        const logits = await this.step(batch.map((w) => w.entry));
        batch.forEach((w, i) => w.resolve(logits[i]));
      } catch (err) {
        for (const w of batch) w.reject(err as Error);
      }
      // let the sessions just answered sample and submit their next token
      await new Promise((r) => setImmediate(r));
    }
    this.running = false;
    this.s.onIdle();
  }

  /** The oldest waiting sessions that fit one call (one session per step each). */
  private take(): Waiting[] {
    const out: Waiting[] = [];
    const seen = new Set<string>();
    let rows = 0;
    const rest: Waiting[] = [];
    for (const w of this.queue) {
      const n = w.entry.tokens.length;
      if (out.length < this.s.maxSessions && rows + n <= this.s.maxRows && !seen.has(w.entry.session)) {
        out.push(w);
        seen.add(w.entry.session);
        rows += n;
      } else rest.push(w);
    }
    this.queue = rest;
    return out;
  }

  /** One step of `batch` through every stage; each session's logits. */
  private async step(batch: readonly LaneEntry[]): Promise<Float32Array[]> {
    const { channels: C, vocab: V } = this.s;
    this.steps++;
    const counts = batch.map((e) => e.tokens.length);
    const rows = counts.reduce((a, b) => a + b, 0);
    const sessions: JsonValue[] = batch.map((e): JsonValue => (e.reset ? { id: e.session, rows: e.tokens.length, reset: true } : { id: e.session, rows: e.tokens.length }));
    let data: Float32Array = new Float32Array(rows);
    let at = 0;
    for (const e of batch) for (const t of e.tokens) data[at++] = t;
    for (let stage = 0; stage < this.route.length; stage++) {
      const peer = this.route[stage];
      const last = stage === this.route.length - 1;
      const codec = last ? 'f32' : this.s.codec;
      // token ids go as f32 (exact); activations in the lane's codec (f16 rows were rounded by the miner that sent them: re-encoding is exact)
      const body = encodeFrame(data, stage === 0 ? [rows] : [rows, C], stage === 0 ? 'f32' : this.s.codec, { deploymentId: this.s.deploymentId, stage, sessions, codec });
      let answer: Uint8Array;
      const prefill = batch.some((e) => e.reset);
      try {
        const t0 = performance.now();
        answer = await this.s.call(peer, body, this.s.deadlines.deadline(peer.id, rows));
        this.s.deadlines.note(peer.id, performance.now() - t0, rows, prefill);
      } catch (err) {
        const e = err as NimbleError;
        const status = typeof e.status === 'number' ? e.status : 502;
        const retryable = e.code === 'unreachable' || status >= 500 || REPLICA_STATUSES.has(status);
        throw new StageCallError(stage, peer, status, retryable, `stage ${stage} (miner ${peer.id}) failed: ${e.message}`.slice(0, 500));
      }
      let out: Float32Array;
      try {
        // only the codec asked: a miner answering f32 to an f16 request would change what the next stage computes
        const frame = decodeFrame(answer, { shape: last ? [batch.length, V] : [rows, C], codecs: [codec], maxBytes: MAX_FRAME_BYTES });
        for (let i = 0; i < frame.data.length; i++) if (!Number.isFinite(frame.data[i])) throw new Error(`a non-finite value at ${i}`);
        out = frame.data;
      } catch (err) {
        throw new StageCallError(stage, peer, 502, true, `stage ${stage} (miner ${peer.id}) answered with a malformed frame: ${(err as Error).message}`.slice(0, 500));
      }
      this.report(batch, counts, stage, peer, data, out, body.byteLength, answer.byteLength, last);
      data = out;
    }
    return batch.map((_, i) => data.subarray(i * V, (i + 1) * V));
  }

  /** Each session's share of a stage's step, handed to onStep. */
  private report(
    batch: readonly LaneEntry[], counts: readonly number[], stage: number, peer: Peer,
    input: Float32Array, output: Float32Array, sent: number, received: number, last: boolean,
  ): void {
    const C = this.s.channels;
    const V = this.s.vocab;
    const rows = counts.reduce((a, b) => a + b, 0);
    const share = (total: number, part: number, whole: number): number => Math.floor((total * part) / whole);
    let sentLeft = sent;
    let receivedLeft = received;
    const shares = batch.map((_, i) => {
      const s = share(sent, counts[i], rows);
      const r = last ? share(received, 1, batch.length) : share(received, counts[i], rows);
      sentLeft -= s;
      receivedLeft -= r;
      return [s, r];
    });
    // the rounding's remainder goes to the first session: the shares sum to the frames' sizes
    shares[0][0] += sentLeft;
    shares[0][1] += receivedLeft;
    let row = 0;
    batch.forEach((e, i) => {
      const n = counts[i];
      const width = stage === 0 ? 1 : C;
      this.s.onStep({
        session: e.session, stage, peer, reset: e.reset, rows: n,
        input: input.subarray(row * width, (row + n) * width),
        output: last ? output.subarray(i * V, (i + 1) * V) : output.subarray(row * C, (row + n) * C),
        bytesSent: shares[i][0], bytesReceived: shares[i][1], batch: batch.length,
      });
      row += n;
    });
  }
}
