// A range of a GPT's parts trained on the GPU, its inner loop included
// (`nbcli miner start --backend webgpu`): the weights, the gradients, AdamW's
// moments (src/engine/webgpu/stage-optimizer.ts) and each activation slot's
// weights stay on the GPU from the stage's start to its release. A forward
// predicts its weights into its slot on the GPU and runs with them; a
// backward runs with its slot's weights and queues the AdamW step (its
// clipping scale worked out on the GPU), so nothing waits for a step.
// What crosses to the CPU: the batch or the received activation going in;
// coming back, the activation or input gradient sent on, the loss, and a
// step's 16-byte status (its gradient norm: a step whose norm is not finite
// is skipped on the GPU and reported here as an error). Whole weights are
// read back only for what leaves the miner: a merge's pseudo-gradient, a
// stage state, and the weights of a forward a spot check asks for (kept on
// the GPU until then, see keepSlotWeights). The weights start as the WASM
// stage's do (same layout, same seed): they are made in host memory, not in
// the WASM engine's, so a stage is not held to a WebAssembly memory's 4 GiB.
import type { ByteCorpus } from '../data/corpus.ts';
import { ADAMW_DEFAULTS } from '../model/adamw.ts';
import { copyArray, createArray, readArray, uploadArray, writeArray, type GpuArray } from '../engine/webgpu/buffers.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { clearRef } from '../engine/webgpu/gpt-buffers.ts';
import { GpuGptStage } from '../engine/webgpu/gpt-stage.ts';
import { GpuStageOptimizer } from '../engine/webgpu/stage-optimizer.ts';
import { rangeParts, stageWeights } from '../model/gpt.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { DEFAULT_MAX_RECORDS, type KeptWeights } from './forward-records.ts';
import { GptStageData } from './stage-model.ts';
import type { StageTrainer } from './stage-trainer.ts';

/** GPU memory the weight copies of spot-check records may take (at least two copies are kept whatever their size). */
export const KEPT_WEIGHTS_GPU_BYTES = 1 << 30;

/** What exists once the kernels are compiled and the buffers made. */
interface Resident {
  stage: GpuGptStage;
  /** the current weights (AdamW's); the stage's own params buffer holds the weights a call runs with */
  weights: GpuArray;
  opt: GpuStageOptimizer;
  /** per slot: the (predicted) weights its forward used */
  stash: GpuArray[];
}

export class GpuGptStageTrainer extends GptStageData implements StageTrainer {
  readonly layout: ParamLayout;
  readonly slotCount: number;
  readonly keptWeightsLimit: number;
  private readonly compiled: Promise<Resident>;
  private resident: Resident | null = null;
  private initial: Float32Array | null;
  /** copies for records, free for reuse */
  private readonly spare: GpuArray[] = [];
  /** non-finite steps the GPU has reported so far */
  private nonFinite = 0;
  private released = false;

  constructor(
    private readonly gpu: Gpu,
    model: Extract<ModelRef, { kind: 'gpt' }>,
    a: StageAssignment,
    slots: number,
    corpus?: ByteCorpus,
  ) {
    super(model, a, corpus);
    const config = model.config;
    const { layout, weights } = stageWeights(config, this.range, a.seed ?? 1337);
    this.layout = layout;
    this.initial = weights;
    this.slotCount = slots;
    this.keptWeightsLimit = Math.max(2, Math.min(DEFAULT_MAX_RECORDS, Math.floor(KEPT_WEIGHTS_GPU_BYTES / (4 * layout.size))));
    this.compiled = this.create(config, a, slots);
    this.compiled.catch(() => {}); // reported by the first call that waits for it
  }

  get paramCount(): number {
    return this.layout.size;
  }

  initialWeights(): Float32Array {
    if (!this.initial) throw new Error('the initial weights are on the GPU now: read them with readWeights()');
    return this.initial.slice();
  }

  async forward(shard: number, input: Float32Array | null, slot: number, delay: number): Promise<Float32Array> {
    const r = await this.stage();
    const stash = this.slotWeights(r, slot);
    r.opt.predict(stash, delay);
    copyArray(this.device, stash, 0, r.stage.params.array, 0, this.paramCount);
    r.stage.forward(input ?? this.batch(shard).inputs, this.B, this.T, undefined, slot);
    return this.checked(await r.stage.readOutput(slot));
  }

  async lossAndBackward(shard: number, input: Float32Array | null, slot: number, step: boolean): Promise<{ loss: number; dInput: Float32Array | null }> {
    const r = await this.stage();
    const batch = this.batch(shard);
    copyArray(this.device, r.weights, 0, r.stage.params.array, 0, this.paramCount);
    r.stage.forward(input ?? batch.inputs, this.B, this.T, batch.targets, slot);
    const dInput = this.backwardAndStep(r, undefined, slot, step);
    const [loss, d] = await Promise.all([r.stage.readLoss(slot), dInput]);
    return { loss, dInput: d };
  }

  async backward(dOutput: Float32Array, slot: number, step: boolean): Promise<Float32Array | null> {
    const r = await this.stage();
    copyArray(this.device, this.slotWeights(r, slot), 0, r.stage.params.array, 0, this.paramCount);
    return this.backwardAndStep(r, dOutput, slot, step);
  }

  keepSlotWeights(slot: number): KeptWeights {
    const r = this.mustBeResident();
    return this.keep(this.slotWeights(r, slot));
  }

  keepWeights(): KeptWeights {
    return this.keep(this.mustBeResident().weights);
  }

  async readWeights(): Promise<Float32Array> {
    const r = await this.stage();
    return this.checked(await readArray(this.device, r.weights));
  }

  writeWeights(weights: Float32Array): void {
    if (weights.length !== this.paramCount) throw new RangeError(`${weights.length} weights for a stage of ${this.paramCount}`);
    if (this.released) throw new Error('the stage was released');
    // before the buffers exist, they are made from these
    if (!this.resident) this.initial = weights.slice();
    else writeArray(this.device, this.resident.weights, weights);
  }

  zeroWeights(): void {
    if (!this.resident) this.initial?.fill(0);
    else clearRef(this.device, this.resident.weights, this.paramCount);
  }

  async ready(): Promise<void> {
    await this.compiled;
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.initial = null;
    this.compiled.then((r) => {
      r.opt.destroy();
      for (const a of [r.weights, ...r.stash]) a.destroy();
      r.stage.destroy();
    }, () => {});
    // records still out keep their copies until they are released
    for (const a of this.spare.splice(0)) a.destroy();
  }

  private get device(): GPUDevice {
    return this.gpu.device;
  }

  private async create(config: Extract<ModelRef, { kind: 'gpt' }>['config'], a: StageAssignment, slots: number): Promise<Resident> {
    const stage = await GpuGptStage.create(this.device, config, rangeParts(config, this.range), this.layout, this.initial!, { batchSize: a.batchSize, slots });
    const owned: GpuArray[] = [];
    try {
      if (this.released) throw new Error('the stage was released');
      // the latest weights: writeWeights may have replaced the initial ones while the kernels compiled
      const weights = uploadArray(this.device, this.initial!, 'weights');
      owned.push(weights);
      for (let s = 0; s < slots; s++) owned.push(createArray(this.device, this.layout.size, `slot ${s} weights`));
      const opt = new GpuStageOptimizer(this.device, stage.kernels.optimizer, this.layout, weights, { ...ADAMW_DEFAULTS, lr: a.lr });
      this.checked(null);
      this.resident = { stage, weights, opt, stash: owned.slice(1) };
      this.initial = null;
      return this.resident;
    } catch (err) {
      for (const x of owned) x.destroy();
      stage.destroy();
      throw err;
    }
  }

  private async stage(): Promise<Resident> {
    if (this.released) throw new Error('the stage was released');
    const r = await this.compiled;
    if (this.released) throw new Error('the stage was released');
    return r;
  }

  private mustBeResident(): Resident {
    if (this.released || !this.resident) throw new Error(this.released ? 'the stage was released' : 'the stage is not on the GPU yet');
    return this.resident;
  }

  private slotWeights(r: Resident, slot: number): GpuArray {
    const a = r.stash[slot];
    if (!a) throw new RangeError(`slot ${slot} outside 0..${r.stash.length - 1}`);
    return a;
  }

  /** Queues the backward (gradients cleared first) and, when `step`, AdamW; resolves to d(input) once the step's status is read. */
  private async backwardAndStep(r: Resident, dOutput: Float32Array | undefined, slot: number, step: boolean): Promise<Float32Array | null> {
    r.stage.clearGrads();
    r.stage.backward(dOutput, slot);
    if (step) r.opt.update(r.stage.grads.array);
    const [dInput, status] = await Promise.all([r.stage.readDInput(slot), step ? r.opt.readStatus() : null]);
    this.checked(null);
    if (status && status.nonFinite > this.nonFinite) {
      this.nonFinite = status.nonFinite;
      throw new Error('gradient norm is not finite (the GPU skipped the inner step)');
    }
    return dInput;
  }

  /** A copy of `from` kept on the GPU, read back when a check asks for it. */
  private keep(from: GpuArray): KeptWeights {
    const copy = this.spare.pop() ?? createArray(this.device, this.paramCount, 'kept weights');
    copyArray(this.device, from, 0, copy, 0, this.paramCount);
    let released = false;
    return {
      read: async () => {
        if (released) throw new Error('the kept weights were released');
        return this.checked(await readArray(this.device, copy));
      },
      release: () => {
        if (released) return;
        released = true;
        if (!this.released && this.spare.length < 2) this.spare.push(copy);
        else copy.destroy();
      },
    };
  }

  /** `values`, unless the device reported an error (out of memory, a validation error): then what it said. */
  private checked<T>(values: T): T {
    const errors = this.gpu.takeErrors();
    if (errors.length) throw new Error(`WebGPU: ${errors[0].slice(0, 300)}`);
    return values;
  }
}
