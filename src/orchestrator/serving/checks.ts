// Spot checks of inference (docs/inference.md, "Spot checks of inference"):
// a sample of the windows miners serve is recomputed on the orchestrator and
// a miner whose answers differ is charged as a training cheat is.
//
//   1. Record. ./check-recorder.ts watches every stage call of the
//      serving path and keeps a sampled share (`rate`) of windows: each
//      step's input and the miner's answer.
//   2. Queue. An ended window waits here (at most `maxQueued`; the windows
//      open and queued hold at most `maxBytes` between them): off the
//      request's path, one window recomputed at a time, the event loop given
//      back between its steps.
//   3. Replay. The window's stage of the published model, loaded from the
//      model store's file (the blob named by its sha256, which the store
//      checked) as a miner loads it, streamed by ranges and hash-checked
//      again, keeping only the stage (../../inference/load-ranges.ts), replays the
//      steps (./check-verify.ts): every answer must be bitwise the
//      replay's, or within the deployment's thresholds (the training
//      checks', or looser where ./build-probe.ts measured the two kernel
//      builds apart on this model); a step that fails is replayed on the
//      other kernel build too, and passes if it matches that.
//   4. Decide. A failed window is an offence (./offences.ts): 'failed_check'
//      work, on a paid network a slash under a key naming the window (unique:
//      charged once), and the miner is evicted, which takes it out of serving
//      (its deployment stage is given to another miner). A window that
//      cannot be replayed here (the model file gone) charges nobody.
import type { Engine } from '../../engine/engine.ts';
import { inferenceFromRanges } from '../../inference/load-ranges.ts';
import type { StageInference } from '../../inference/stage-inference.ts';
import { gptConfigOf } from '../../model/model-ref.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import { remember } from '../cache.ts';
import { ByteBudget, InferenceRecorder, type Draw, type RecordedWindow, type RecorderCounts } from './check-recorder.ts';
import { UncheckableError, verifyWindow, type WindowOutcome } from './check-verify.ts';
import type { BuildProbes } from './build-probe.ts';
import type { Offences } from '../rewards/offences.ts';
import type { OrchestratorState } from '../state/index.ts';

export interface InferenceCheckOptions {
  /** share of windows (a session's calls at one stage, reset to reset) recomputed; 0 disables */
  rate: number;
  /** bytes the recorded windows hold at most, open and queued */
  maxBytes: number;
  /** ended windows waiting for their recomputation at most; more are dropped */
  maxQueued: number;
  /** a window with no step for this long has ended (a generation that failed) */
  idleMs: number;
}

export const INFERENCE_CHECK_DEFAULTS: InferenceCheckOptions = { rate: 0.02, maxBytes: 64 << 20, maxQueued: 64, idleMs: 30_000 };

/** Replay stages kept (by model file, parts and kernel build). */
const STAGES_KEPT = 4;

export interface InferenceCheckCounts extends RecorderCounts {
  passed: number;
  failed: number;
  /** windows that could not be replayed here (charging nobody) */
  uncheckable: number;
  /** ended windows dropped because the queue was full */
  overflow: number;
  queued: number;
}

export interface InferenceCheckDeps {
  state: OrchestratorState;
  /** the model store's files */
  blobs: BlobStore;
  /** the orchestrator's verification engine */
  engine: () => Promise<Engine>;
  /** where a failed check is charged */
  offences: Offences;
  now?: () => number;
  log?: (line: string) => void;
  /** the sampling draw (default: a CSPRNG) */
  draw?: Draw;
  /** runs between two steps of a replay (default: the event loop's next turn) */
  pause?: () => Promise<void>;
  /** the cross-build probes: each model's thresholds, and the other kernel build's engine (absent: the training checks' thresholds, one build) */
  probes?: BuildProbes;
}

export class InferenceChecks {
  readonly options: InferenceCheckOptions;
  /** the serving path's observer: give it to Completions.observe */
  readonly recorder: InferenceRecorder;
  private readonly budget: ByteBudget;
  private readonly queue: RecordedWindow[] = [];
  private readonly stages = new Map<string, StageInference>();
  private readonly decided = { passed: 0, failed: 0, uncheckable: 0, overflow: 0 };
  private running: Promise<void> | null = null;
  private closed = false;
  private readonly now: () => number;
  private readonly log: (line: string) => void;
  private readonly pause: () => Promise<void>;

  constructor(private readonly deps: InferenceCheckDeps, options: Partial<InferenceCheckOptions> = {}) {
    this.options = { ...INFERENCE_CHECK_DEFAULTS, ...options };
    const o = this.options;
    if (!(Number.isInteger(o.maxQueued) && o.maxQueued >= 1)) throw new RangeError(`maxQueued must be an integer ≥ 1, got ${o.maxQueued}`);
    this.now = deps.now ?? Date.now;
    this.log = deps.log ?? (() => {});
    this.pause = deps.pause ?? (() => new Promise((r) => setImmediate(r)));
    this.budget = new ByteBudget(o.maxBytes);
    this.recorder = new InferenceRecorder({ rate: o.rate, idleMs: o.idleMs }, this.budget, (w) => this.enqueue(w), this.now, deps.draw, this.log);
  }

  /** What was sampled, decided and dropped since the start. */
  counts(): InferenceCheckCounts {
    return { ...this.recorder.counts, ...this.decided, queued: this.queue.length };
  }

  /** Bytes the recorded windows hold now. */
  get bytesHeld(): number {
    return this.budget.used;
  }

  /** The clock: windows idle for idleMs end and are queued. */
  tick(): void {
    this.recorder.sweep();
  }

  /** Resolves once every queued window is decided. */
  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  /** Stops: open and queued windows are dropped, the replay under way ends, the stages are released. Call before the engine closes. */
  async close(): Promise<void> {
    this.closed = true;
    this.recorder.clear();
    for (const w of this.queue.splice(0)) this.budget.give(w.bytes);
    await this.settled();
    for (const s of this.stages.values()) s.release();
    this.stages.clear();
  }

  private enqueue(w: RecordedWindow): void {
    if (this.closed || this.queue.length >= this.options.maxQueued) {
      this.budget.give(w.bytes);
      if (!this.closed) this.decided.overflow++;
      return;
    }
    this.queue.push(w);
    this.kick();
  }

  /** Starts draining the queue unless a drain is under way (one restarts itself if a window came as it ended). */
  private kick(): void {
    if (this.running || this.closed || this.queue.length === 0) return;
    this.running = this.drain().finally(() => {
      this.running = null;
      this.kick();
    });
  }

  private async drain(): Promise<void> {
    for (let w = this.queue.shift(); w && !this.closed; w = this.queue.shift()) {
      try {
        await this.check(w);
      } catch (err) {
        this.log(`inference check of miner ${w.minerId} failed to run: ${(err as Error).message}`);
      } finally {
        this.budget.give(w.bytes);
      }
      await this.pause();
    }
  }

  private async check(w: RecordedWindow): Promise<void> {
    const what = `inference check of miner ${w.minerId} (deployment ${w.deploymentId} stage ${w.stage}, session ${w.session}, ${w.steps.length} steps)`;
    let outcome: WindowOutcome;
    try {
      const engine = await this.deps.engine();
      const stage = await this.stageFor(w, engine);
      const cut = this.cutOf(w);
      const probes = this.deps.probes;
      const thresholds = probes ? await probes.thresholds(w.sha256, cut.fromPart, cut.toPart) : undefined;
      const otherEngine = probes ? await probes.otherEngine() : null;
      const other = otherEngine ? await this.stageFor(w, otherEngine) : null;
      if (this.closed) return;
      outcome = await verifyWindow(stage, w, { pause: this.pause, thresholds, other });
    } catch (err) {
      if (!(err instanceof UncheckableError)) throw err;
      this.decided.uncheckable++;
      this.log(`${what}: cannot be recomputed here, nobody charged: ${err.message}`);
      return;
    }
    if (outcome.passed) {
      this.decided.passed++;
      this.log(`${what}: passed, ${outcome.detail}`);
      return;
    }
    this.decided.failed++;
    this.log(`${what}: FAILED, ${outcome.detail}`);
    const now = this.now();
    this.deps.state.tx(() =>
      this.deps.offences.charge(
        {
          minerId: w.minerId,
          runId: null,
          stage: w.stage,
          kind: 'failed_check',
          detail: `inference check of deployment ${w.deploymentId} stage ${w.stage}, session ${w.session}: ${outcome.detail}`,
          key: `inference check ${w.deploymentId}/${w.session}/${w.stage}/${w.seq}`,
        },
        now,
      ),
    );
  }

  /** The parts of the window's deployment stage. */
  private cutOf(w: RecordedWindow): { fromPart: number; toPart: number } {
    const cut = this.deps.state.deployments.stages(w.deploymentId).find((s) => s.stage === w.stage);
    if (!cut) throw new UncheckableError(`deployment ${w.deploymentId} has no stage ${w.stage}`);
    return cut;
  }

  /** The replay stage of the window's parts on `engine`'s kernel build, loaded from the model store's file (kept for the next windows). */
  private async stageFor(w: RecordedWindow, engine: Engine): Promise<StageInference> {
    const cut = this.cutOf(w);
    const key = `${w.sha256}/${cut.fromPart}/${cut.toPart}/${engine.relaxedSimd ? 'relaxed' : 'plain'}`;
    const kept = this.stages.get(key);
    if (kept) return kept;
    const size = await this.deps.blobs.size(w.sha256).catch(() => undefined);
    if (size === undefined) throw new UncheckableError(`the model file ${w.sha256.slice(0, 12)} is not in the store`);
    let stage: StageInference;
    try {
      // streamed by ranges and checked against its sha256: only the stage's tensors are kept
      stage = await inferenceFromRanges(engine, { size, read: (start, end) => this.deps.blobs.getRange(w.sha256, start, end) }, { sha256: w.sha256, range: { from: cut.fromPart, to: cut.toPart }, stage: { maxSessions: 1 } });
    } catch (err) {
      throw new UncheckableError(`the model file does not load: ${(err as Error).message}`);
    }
    if (JSON.stringify(stage.config) !== JSON.stringify(gptConfigOf(w.model))) {
      stage.release();
      throw new UncheckableError(`the model file holds ${JSON.stringify(stage.config)}, not ${w.model}`);
    }
    if (this.closed) {
      stage.release();
      throw new UncheckableError('closing');
    }
    remember(this.stages, key, stage, STAGES_KEPT, (old) => old.release());
    return stage;
  }
}
