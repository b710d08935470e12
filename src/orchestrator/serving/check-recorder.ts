// Recording sampled inference steps for spot checks (docs/inference.md, "Spot
// checks of inference"). The serving path (./completions.ts) hands every
// stage call of every generation to its observers; this one samples windows
// and keeps what a checker needs to recompute them:
//
//   - a window is one session's calls at one stage from a reset (the prefill
//     of a new context window) up to the next reset or the session's end: the
//     KV cache a miner builds over a window is all its answers depend on, so a
//     window can be replayed from nothing but its inputs;
//   - each window is sampled with probability `rate`, drawn with a CSPRNG on
//     the orchestrator when its reset step arrives: the miner cannot tell a
//     sampled window from another, it answered every step before anyone knows;
//   - a sampled window keeps each step's input (what the orchestrator sent
//     the miner) and output (the frame the miner answered, decoded), copied;
//   - it ends at the next reset of its session and stage, when its session
//     completes, or when no step came for `idleMs` (a generation that failed
//     is not named by its session in `completed`); it is then handed on.
//
// Memory is bounded by one ByteBudget over the windows open here and those
// handed on and not yet checked: a step that does not fit drops its window
// (counted). A window whose steps change miner (a replica replaced mid-window)
// cannot be replayed as one miner's work, and is dropped too.
import { randomInt } from 'node:crypto';
import type { CompletionObserver, CompletionRequest, CompletionResult, StageStep } from './completions.ts';
import type { DeploymentRecord } from '../state/deployments.ts';

/** One stage call of a recorded window. */
export interface RecordedStep {
  /** token ids (stage 0) or activation rows [rows, C], as sent to the miner */
  input: Float32Array;
  /** what the miner answered, decoded: activation rows [rows, C], or the last stage's logits [1, V] */
  output: Float32Array;
}

/** One session's calls at one stage of a deployment, from a reset on, all run by one miner. */
export interface RecordedWindow {
  deploymentId: string;
  /** the model file's sha256 (the blob the weights come from) */
  sha256: string;
  /** the model reference (gpt-…) */
  model: string;
  stage: number;
  minerId: string;
  session: string;
  /** this recorder's sequence number of the window (with the session, which is random, it names the check) */
  seq: number;
  steps: RecordedStep[];
  /** bytes the steps hold (taken from the budget) */
  bytes: number;
}

/** Bytes the recorded windows may hold at once, open or waiting for their check. */
export class ByteBudget {
  used = 0;
  constructor(readonly limit: number) {
    if (!(Number.isInteger(limit) && limit >= 0)) throw new RangeError(`a byte budget is an integer ≥ 0, got ${limit}`);
  }
  /** Takes `n` bytes if they fit; false (nothing taken) if not. */
  take(n: number): boolean {
    if (this.used + n > this.limit) return false;
    this.used += n;
    return true;
  }
  give(n: number): void {
    this.used = Math.max(0, this.used - n);
  }
}

export interface RecorderOptions {
  /** share of windows recorded (0 records none) */
  rate: number;
  /** a window with no step for this long is ended and handed on */
  idleMs: number;
}

export interface RecorderCounts {
  /** windows sampled */
  sampled: number;
  /** windows handed on for a check */
  handedOn: number;
  /** sampled windows dropped: over the memory budget, or a miner that changed mid-window */
  dropped: number;
}

/** Draws true with probability `rate` (a CSPRNG by default). */
export type Draw = (rate: number) => boolean;

const cryptoDraw: Draw = (rate) => rate > 0 && randomInt(1_000_000) < rate * 1_000_000;

interface Open {
  w: RecordedWindow;
  lastStepAt: number;
}

/** Samples and records windows of stage calls; hands each ended window to `sink`, which gives its bytes back to the budget when done with it. */
export class InferenceRecorder implements CompletionObserver {
  /** open windows by session and stage */
  private readonly open = new Map<string, Open>();
  private seq = 0;
  readonly counts: RecorderCounts = { sampled: 0, handedOn: 0, dropped: 0 };

  constructor(
    private readonly options: RecorderOptions,
    private readonly budget: ByteBudget,
    private readonly sink: (w: RecordedWindow) => void,
    private readonly now: () => number = Date.now,
    private readonly draw: Draw = cryptoDraw,
    private readonly log: (line: string) => void = () => {},
  ) {
    if (!(options.rate >= 0 && options.rate <= 1)) throw new RangeError(`the inference check rate must be in [0, 1], got ${options.rate}`);
    if (!(options.idleMs > 0)) throw new RangeError(`idleMs must be > 0, got ${options.idleMs}`);
  }

  /** Windows open now. */
  get openWindows(): number {
    return this.open.size;
  }

  stageStep(step: StageStep): void {
    const key = `${step.session}/${step.stage}`;
    const open = this.open.get(key);
    if (step.reset) {
      if (open) this.end(key, open);
      if (!this.draw(this.options.rate)) return;
      this.counts.sampled++;
      const w: RecordedWindow = {
        deploymentId: step.deployment.id, sha256: step.deployment.sha256, model: step.deployment.model,
        stage: step.stage, minerId: step.minerId, session: step.session, seq: this.seq++, steps: [], bytes: 0,
      };
      const o = { w, lastStepAt: this.now() };
      this.open.set(key, o);
      this.add(key, o, step);
      return;
    }
    if (!open) return; // not sampled (or dropped)
    if (open.w.minerId !== step.minerId) return this.drop(key, open, `its steps went to ${open.w.minerId} and then ${step.minerId}`);
    this.add(key, open, step);
  }

  completed(_d: DeploymentRecord, _r: CompletionRequest, result: CompletionResult | null): void {
    if (result) this.endSession(result.id);
    this.sweep();
  }

  /** Ends every window of a session (it is over). */
  endSession(session: string): void {
    for (const [key, o] of [...this.open]) if (o.w.session === session) this.end(key, o);
  }

  /** Ends the windows with no step for idleMs (their session ended without saying so, or stalled). */
  sweep(): void {
    const t = this.now();
    for (const [key, o] of [...this.open]) {
      if (t - o.lastStepAt >= this.options.idleMs) this.end(key, o);
    }
  }

  /** Drops every open window (the orchestrator is closing), giving their bytes back. */
  clear(): void {
    for (const o of this.open.values()) this.budget.give(o.w.bytes);
    this.open.clear();
  }

  private add(key: string, o: Open, step: StageStep): void {
    const bytes = step.input.byteLength + step.output.byteLength;
    if (!this.budget.take(bytes)) return this.drop(key, o, `it would pass the memory budget of ${this.budget.limit} bytes for recorded steps`);
    o.w.steps.push({ input: step.input.slice(), output: step.output.slice() });
    o.w.bytes += bytes;
    o.lastStepAt = this.now();
  }

  private end(key: string, o: Open): void {
    this.open.delete(key);
    this.counts.handedOn++;
    this.sink(o.w);
  }

  private drop(key: string, o: Open, why: string): void {
    this.open.delete(key);
    this.budget.give(o.w.bytes);
    this.counts.dropped++;
    this.log(`inference check of miner ${o.w.minerId} (deployment ${o.w.deploymentId} stage ${o.w.stage}, session ${o.w.session}) dropped: ${why}`);
  }
}
