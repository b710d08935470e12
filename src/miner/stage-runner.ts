// The stage a miner holds: its trainer (./stage-trainer.ts: a GPT stage with
// its activation slots and corpus, a first or last stage loading batches
// itself, or a whole MLP classifier on its data, with the inner AdamW and the
// slots' weights, in host memory or on the GPU), and the DiLoCo state
// (weights at the last merge, outer momentum, error feedback) in host memory.
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
// copies of it per microbatch (on the GPU for a GPU trainer).
import type { ByteCorpus } from '../data/corpus.ts';
import type { Engine } from '../engine/engine.ts';
import { createOuterState, outerStep, type OuterState } from '../merge/outer.ts';
import { pseudoGradient } from '../merge/pseudo-gradient.ts';
import { encodeStageState, layoutTensors, loadModelParams } from '../model/checkpoint.ts';
import { decodeSafetensors, SafetensorsError } from '../model/safetensors.ts';
import { DEFAULT_BLOCK_SIZE } from '../protocol/codec.ts';
import { ErrorFeedback } from '../protocol/error-feedback.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { createStageTrainer } from './create-stage-trainer.ts';
import type { KeptWeights } from './forward-records.ts';
import type { StageTrainer } from './stage-trainer.ts';

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
  readonly trainer: StageTrainer;
  private readonly freeSlots: number[] = [];
  private readonly slotOf = new Map<number, { slot: number; since: number }>();
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
    this.trainer = createStageTrainer(engine, assignment, slots, corpus);
    for (let i = slots - 1; i >= 0; i--) this.freeSlots.push(i);
    this.thetaStart = this.trainer.initialWeights();
    this.outer = createOuterState(this.trainer.paramCount);
    this.feedback = new ErrorFeedback(this.trainer.paramCount, DEFAULT_BLOCK_SIZE);
    this.round = 0;
  }

  /** Resolves once the stage can run, or rejects with why it cannot (a GPU stage compiles its kernels first). */
  ready(): Promise<void> {
    return this.trainer.ready();
  }

  get runId(): string {
    return this.assignment.runId;
  }

  /** The byte corpus of a GPT's first or last stage (null: a middle stage, or an MLP's). */
  get corpus(): ByteCorpus | null {
    return this.trainer.corpus;
  }

  /** Tokens (GPT) or examples (MLP) a microbatch trains on. */
  get tokensPerMicrobatch(): number {
    return this.trainer.itemsPerMicrobatch;
  }

  get freeSlotCount(): number {
    return this.freeSlots.length;
  }

  /** Activation slots: microbatches this stage can hold in flight. */
  get slotCount(): number {
    return this.trainer.slotCount;
  }

  /** Parameters of the stage. */
  get paramCount(): number {
    return this.trainer.paramCount;
  }

  /** Shape of an activation (or its gradient) at this stage's input and output: [batch · context, channels] for a GPT. */
  get activationShape(): [number, number] {
    return this.trainer.activationShape;
  }

  /** Copies of the weights (spot-check records) the trainer can keep at once. */
  get keptWeightsLimit(): number {
    return this.trainer.keptWeightsLimit;
  }

  /** A copy of the current weights (what the last stage's next microbatch runs with), kept where the trainer keeps its weights. */
  keepWeights(): KeptWeights {
    return this.trainer.keepWeights();
  }

  /** The current weights, after every inner step so far: a copy in host memory. */
  readWeights(): Promise<Float32Array> {
    return this.trainer.readWeights();
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
    if (this.lazy) this.trainer.zeroWeights();
    const delay = this.slotOf.size;
    const slot = this.takeSlot(microbatch);
    this.predicted.set(slot, delay);
    return this.trainer.forward(shard, input, slot, delay);
  }

  /** A copy of the weights the forward of a held microbatch used, and the inner steps they were predicted ahead of the weights then. */
  keepForwardWeights(microbatch: number): { weights: KeptWeights; predictedSteps: number } | null {
    const s = this.slotOf.get(microbatch);
    if (!s || !this.predicted.has(s.slot)) return null;
    return { weights: this.trainer.keepSlotWeights(s.slot), predictedSteps: this.predicted.get(s.slot)! };
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
    if (this.lazy) this.trainer.zeroWeights();
    const slot = this.takeSlot(microbatch);
    this.predicted.delete(slot);
    try {
      const { loss, dInput } = await this.trainer.lossAndBackward(shard, activation, slot, !this.lazy);
      this.samples++;
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
    if (!s || !this.predicted.has(s.slot)) throw new Error(`microbatch ${microbatch} is not held here`);
    try {
      const d = await this.trainer.backward(dOutput, s.slot, !this.lazy);
      this.samples++;
      return d;
    } finally {
      this.release(microbatch);
    }
  }

  // ---- merging -------------------------------------------------------------

  /** The pseudo-gradient of this merge interval: weights at its start minus the current ones. */
  async pseudoGradient(): Promise<Float32Array> {
    return pseudoGradient(this.thetaStart, await this.trainer.readWeights());
  }

  /**
   * Ends merge round `round`: the outer step from the merged pseudo-gradient
   * `delta` (every replica applies the same one and ends with the same
   * weights), or, with no delta, keeps the current weights. Either way the
   * next merge interval starts here.
   */
  async applyOuterStep(delta: Float32Array | null, round: number, lr: number, momentum: number): Promise<void> {
    let next: Float32Array;
    if (delta) {
      if (this.outer.lr !== lr || this.outer.momentum !== momentum) {
        this.outer = { ...createOuterState(this.trainer.paramCount, { lr, momentum }), step: this.outer.step, momentumBuffer: this.outer.momentumBuffer };
      }
      next = outerStep(this.outer, this.thetaStart, delta);
      this.trainer.writeWeights(next);
    } else next = await this.trainer.readWeights();
    this.thetaStart = next;
    this.round = round;
    this.samples = 0;
  }

  /** The stage state after merge round `round`: weights and outer momentum, as a checkpoint. */
  async encodeState(round: number): Promise<Uint8Array> {
    const weights = await this.trainer.readWeights();
    const t = this.trainer;
    return encodeStageState(t.model, t.range, layoutTensors(t.layout, weights), { momentum: this.outer.momentumBuffer, outerStep: this.outer.step }, round);
  }

  /** Loads the stage's parts of a whole-model checkpoint as its initial weights (before the first merge round). */
  loadInitial(bytes: Uint8Array): void {
    this.thetaStart = this.loadParams(decodeSafetensors(bytes));
    this.feedback.reset();
    this.samples = 0;
  }

  /** Loads a stage state saved by a replica (a new or stale replica catching up). */
  loadState(bytes: Uint8Array, round: number): void {
    const file = decodeSafetensors(bytes);
    // validated whole before anything is overwritten: the stage keeps its weights when the state is refused
    const t = this.trainer;
    const weights = new Float32Array(t.paramCount);
    const info = loadModelParams(t.model, t.range, t.layout, weights, file);
    if (info.from !== this.assignment.from || info.to !== this.assignment.to) throw new SafetensorsError('state is for another stage');
    const m = file.tensors.get('outer.momentum');
    if (!m || m.data.length !== t.paramCount) throw new SafetensorsError('state lacks the outer momentum');
    const outerSteps = Number(file.metadata.outerStep ?? 0);
    if (!Number.isSafeInteger(outerSteps) || outerSteps < 0) throw new SafetensorsError(`state has a bad outerStep '${file.metadata.outerStep}'`);
    t.writeWeights(weights);
    this.outer.momentumBuffer.set(m.data);
    this.outer.step = outerSteps;
    this.thetaStart = weights;
    this.feedback.reset();
    this.round = round;
    this.samples = 0;
  }

  /** Copies the stage's parts out of a checkpoint of its model (validated whole before the weights change); returns them. */
  private loadParams(file: ReturnType<typeof decodeSafetensors>): Float32Array {
    const t = this.trainer;
    const weights = new Float32Array(t.paramCount);
    loadModelParams(t.model, t.range, t.layout, weights, file);
    t.writeWeights(weights);
    return weights;
  }

  dispose(): void {
    this.trainer.release();
  }
}
