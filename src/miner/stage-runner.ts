// The stage a miner holds: the model (./stage-model.ts: a GPT stage with its
// activation slots and corpus, a first or last stage loading batches itself,
// or a whole MLP classifier on its data), the inner AdamW, and the DiLoCo
// state (weights at the last merge, outer momentum, error feedback).
// It computes; the miner moves bytes: the merge round's frames are encoded and
// decoded in merge-round.ts, from `pseudoGradient()` and into `applyOuterStep()`.
//
// Delayed backwards: a stage that is not last runs a microbatch's backward
// after the backwards (and inner steps) of the microbatches already in flight
// when its forward ran, so the gradient arrives `d` steps late. Two remedies,
// measured in docs/network.md:
// - weight prediction (SpecTrain): the forward runs with the weights AdamW is
//   expected to reach after those d steps, θ − d·lr·m̂/(√v̂ + ε), so the
//   gradient is computed about where it is applied;
// - weight stashing (PipeDream): the slot keeps the weights its forward used
//   and runs its backward with them, so the gradient is the true gradient of
//   that forward, not a mix of two weight versions.
// Cost: one copy of the stage's parameters per activation slot, and a few
// copies of it per microbatch.
import type { ByteCorpus } from '../data/corpus.ts';
import type { Engine } from '../engine/engine.ts';
import { createOuterState, outerStep, type OuterState } from '../merge/outer.ts';
import { pseudoGradient } from '../merge/pseudo-gradient.ts';
import { AdamW, ADAMW_DEFAULTS } from '../model/adamw.ts';
import { encodeStageState, loadModelParams, stageTensors } from '../model/checkpoint.ts';
import { decodeSafetensors, SafetensorsError } from '../model/safetensors.ts';
import { DEFAULT_BLOCK_SIZE } from '../protocol/codec.ts';
import { ErrorFeedback } from '../protocol/error-feedback.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { createStageModel } from './create-stage-model.ts';
import { GptStageData, type StageModel } from './stage-model.ts';

/**
 * Microbatches a stage keeps in flight: the miner's slots, but at most one
 * more than the stages from here to the end (1F1B's S − stage, plus one so
 * that network latency does not stall the pipeline). More would only add
 * gradient delay, since a stage's backward for a microbatch waits for every
 * later stage.
 */
export function inFlightLimit(a: Pick<StageAssignment, 'stage' | 'stageCount'>, slots: number): number {
  return Math.max(1, Math.min(slots, a.stageCount - a.stage + 1));
}

export class StageRunner {
  readonly stage: StageModel;
  private readonly opt: AdamW;
  private readonly freeSlots: number[] = [];
  private readonly slotOf = new Map<number, { slot: number; since: number }>();
  /** per slot: the weights its forward used (allocated on first use) */
  private readonly stash: (Float32Array | null)[];
  /** per slot: the inner steps its weights were predicted ahead */
  private readonly predicted = new Map<number, number>();
  /** weights at the start of the current merge interval */
  private thetaStart: Float32Array;
  private outer: OuterState;
  /**
   * Error feedback of this replica's int8 pseudo-gradient uploads (what
   * rounding dropped, added back next round); reset when a state is loaded.
   */
  readonly feedback: ErrorFeedback;
  /** merge rounds applied */
  round: number;
  /** inner steps since the last merge */
  samples = 0;
  /** fault injection (tamper.ts): the weights are held at zero and never stepped */
  lazy = false;

  constructor(
    engine: Engine,
    readonly assignment: StageAssignment,
    slots: number,
    /** an edge stage's corpus when the data is an uploaded dataset (downloaded by the miner, ./datasets.ts); a named one is loaded here, a path never */
    corpus?: ByteCorpus,
  ) {
    this.stage = createStageModel(engine, assignment, slots, corpus);
    this.opt = new AdamW(engine, this.stage.params, this.stage.grads, { ...ADAMW_DEFAULTS, lr: assignment.lr });
    for (let i = slots - 1; i >= 0; i--) this.freeSlots.push(i);
    this.stash = new Array<Float32Array | null>(slots).fill(null);
    this.thetaStart = this.stage.params.flat.data.slice();
    this.outer = createOuterState(this.stage.paramCount);
    this.feedback = new ErrorFeedback(this.stage.paramCount, DEFAULT_BLOCK_SIZE);
    this.round = 0;
  }

  /** Resolves once the stage can run, or rejects with why it cannot (a GPU stage compiles its kernels first). */
  ready(): Promise<void> {
    return this.stage.ready();
  }

  get runId(): string {
    return this.assignment.runId;
  }

  /** The byte corpus of a GPT's first or last stage (null: a middle stage, or an MLP's). */
  get corpus(): ByteCorpus | null {
    return this.stage instanceof GptStageData ? this.stage.corpus : null;
  }

  /** Tokens (GPT) or examples (MLP) a microbatch trains on. */
  get tokensPerMicrobatch(): number {
    return this.stage.itemsPerMicrobatch;
  }

  get freeSlotCount(): number {
    return this.freeSlots.length;
  }

  /** Activation slots: microbatches this stage can hold in flight. */
  get slotCount(): number {
    return this.stage.slotCount;
  }

  /** Parameters of the stage. */
  get paramCount(): number {
    return this.stage.paramCount;
  }

  /** Shape of an activation (or its gradient) at this stage's input and output: [batch · context, channels] for a GPT. */
  get activationShape(): [number, number] {
    return this.stage.activationShape;
  }

  /** Copies the current weights (what a forward with nothing in flight uses) into `out`. */
  copyWeights(out: Float32Array): Float32Array {
    out.set(this.stage.params.flat.data);
    return out;
  }

  holds(microbatch: number): boolean {
    return this.slotOf.has(microbatch);
  }

  /** Microbatches held longer than `ms`. */
  heldLongerThan(ms: number, now: number): number[] {
    return [...this.slotOf].filter(([, v]) => now - v.since > ms).map(([k]) => k);
  }

  private takeSlot(microbatch: number): number {
    const slot = this.freeSlots.pop();
    if (slot === undefined) throw new Error('no free activation slot');
    this.slotOf.set(microbatch, { slot, since: Date.now() });
    return slot;
  }

  release(microbatch: number): void {
    const s = this.slotOf.get(microbatch);
    if (!s) return;
    this.slotOf.delete(microbatch);
    this.freeSlots.push(s.slot);
  }

  /**
   * Forward of a microbatch whose backward comes later: with the weights
   * predicted for when its gradient is applied (one inner step per
   * microbatch already in flight), kept in its slot for the backward.
   */
  private async forwardDelayed(microbatch: number, shard: number, input: Float32Array | null): Promise<Float32Array> {
    if (this.lazy) this.stage.params.flat.data.fill(0);
    const delay = this.slotOf.size;
    const slot = this.takeSlot(microbatch);
    const w = this.stage.params.flat.data;
    const stashed = this.opt.predict((this.stash[slot] ??= new Float32Array(w.length)), delay);
    this.predicted.set(slot, delay);
    return this.stage.forward(shard, input, slot, stashed);
  }

  /** The weights the forward of a held microbatch used, and the inner steps they are ahead of the current ones. */
  forwardWeights(microbatch: number): { weights: Float32Array; predictedSteps: number } | null {
    const s = this.slotOf.get(microbatch);
    const weights = s ? this.stash[s.slot] : null;
    if (!s || !weights) return null;
    return { weights, predictedSteps: this.predicted.get(s.slot) ?? 0 };
  }

  /** First stage: forward a new microbatch; keeps its activations (and weights) in a slot. */
  forwardFirst(microbatch: number, shard: number): Promise<Float32Array> {
    return this.forwardDelayed(microbatch, shard, null);
  }

  /** Middle stage: forward an activation; keeps the microbatch (and weights) in a slot. */
  forwardMiddle(microbatch: number, activation: Float32Array): Promise<Float32Array> {
    return this.forwardDelayed(microbatch, 0, activation);
  }

  /** Last stage: forward to the loss, backward at once, inner step. Resolves to the loss and d(input). */
  async forwardBackwardLast(microbatch: number, shard: number, activation: Float32Array | null): Promise<{ loss: number; dInput: Float32Array | null }> {
    if (this.lazy) this.stage.params.flat.data.fill(0);
    const slot = this.takeSlot(microbatch);
    try {
      this.stage.zeroGrad();
      const { loss, dInput } = await this.stage.lossAndBackward(shard, activation, slot);
      this.step();
      return { loss, dInput };
    } finally {
      this.release(microbatch);
    }
  }

  /**
   * Backward of a microbatch held in a slot, from the gradient of its output,
   * with the weights its forward used; then the inner step on the current weights.
   */
  async backward(microbatch: number, dOutput: Float32Array): Promise<Float32Array | null> {
    const s = this.slotOf.get(microbatch);
    const stashed = s ? this.stash[s.slot] : null;
    if (!s || !stashed) throw new Error(`microbatch ${microbatch} is not held here`);
    try {
      this.stage.zeroGrad();
      const d = await this.stage.backward(dOutput, s.slot, stashed);
      this.step();
      return d;
    } finally {
      this.release(microbatch);
    }
  }

  private step(): void {
    if (this.lazy) {
      this.samples++;
      return;
    }
    const norm = this.opt.update();
    if (!Number.isFinite(norm)) throw new Error('gradient norm is not finite');
    this.samples++;
  }

  // ---- merging -------------------------------------------------------------

  /** The pseudo-gradient of this merge interval: weights at its start minus the current ones. */
  pseudoGradient(): Float32Array {
    return pseudoGradient(this.thetaStart, this.stage.params.flat.data);
  }

  /**
   * Ends merge round `round`: the outer step from the merged pseudo-gradient
   * `delta` (every replica applies the same one and ends with the same
   * weights), or, with no delta, keeps the current weights. Either way the
   * next merge interval starts here.
   */
  applyOuterStep(delta: Float32Array | null, round: number, lr: number, momentum: number): void {
    if (delta) {
      if (this.outer.lr !== lr || this.outer.momentum !== momentum) {
        this.outer = { ...createOuterState(this.stage.paramCount, { lr, momentum }), step: this.outer.step, momentumBuffer: this.outer.momentumBuffer };
      }
      const next = outerStep(this.outer, this.thetaStart, delta);
      this.stage.params.flat.data.set(next);
    }
    this.thetaStart = this.stage.params.flat.data.slice();
    this.round = round;
    this.samples = 0;
  }

  /** The stage state after merge round `round`: weights and outer momentum, as a checkpoint. */
  encodeState(round: number): Uint8Array {
    return encodeStageState(this.stage.model, this.stage.range, stageTensors(this.stage), { momentum: this.outer.momentumBuffer, outerStep: this.outer.step }, round);
  }

  /** Loads the stage's parts of a whole-model checkpoint as its initial weights (before the first merge round). */
  loadInitial(bytes: Uint8Array): void {
    this.loadParams(decodeSafetensors(bytes));
    this.thetaStart = this.stage.params.flat.data.slice();
    this.feedback.reset();
    this.samples = 0;
  }

  /** Loads a stage state saved by a replica (a new or stale replica catching up). */
  loadState(bytes: Uint8Array, round: number): void {
    const file = decodeSafetensors(bytes);
    // validated whole before anything is overwritten: the stage keeps its weights when the state is refused
    const weights = new Float32Array(this.stage.paramCount);
    const info = loadModelParams(this.stage.model, this.stage.range, this.stage.layout, weights, file);
    if (info.from !== this.assignment.from || info.to !== this.assignment.to) throw new SafetensorsError('state is for another stage');
    const m = file.tensors.get('outer.momentum');
    if (!m || m.data.length !== this.stage.paramCount) throw new SafetensorsError('state lacks the outer momentum');
    const outerSteps = Number(file.metadata.outerStep ?? 0);
    if (!Number.isSafeInteger(outerSteps) || outerSteps < 0) throw new SafetensorsError(`state has a bad outerStep '${file.metadata.outerStep}'`);
    this.stage.params.flat.data.set(weights);
    this.outer.momentumBuffer.set(m.data);
    this.outer.step = outerSteps;
    this.thetaStart = this.stage.params.flat.data.slice();
    this.feedback.reset();
    this.round = round;
    this.samples = 0;
  }

  /** Copies the stage's parts out of a checkpoint of its model (validated whole before the weights change). */
  private loadParams(file: ReturnType<typeof decodeSafetensors>): void {
    const weights = new Float32Array(this.stage.paramCount);
    loadModelParams(this.stage.model, this.stage.range, this.stage.layout, weights, file);
    this.stage.params.flat.data.set(weights);
  }

  dispose(): void {
    this.opt.release();
    this.stage.release();
  }
}
