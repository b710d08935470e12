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
import { copyArray, createArray, uploadArray, type GpuArray } from '../engine/webgpu/buffers.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { GpuGptStage } from '../engine/webgpu/gpt-stage.ts';
import { GpuStageOptimizer } from '../engine/webgpu/stage-optimizer.ts';
import { rangeParts, type StageRange } from '../model/parts.ts';
import { stageWeights, type ModelRef } from '../model/model-ref.ts';
import type { ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import type { KeptWeights } from './forward-records.ts';
import { GpuStageTrainer } from './gpu-resident.ts';
import { GptStageData } from './stage-model.ts';
import type { StageTrainer } from './stage-trainer.ts';

/** What exists once the kernels are compiled and the buffers made. */
interface Resident {
  stage: GpuGptStage;
  /** the current weights (AdamW's); the stage's own params buffer holds the weights a call runs with */
  weights: GpuArray;
  opt: GpuStageOptimizer;
  /** per slot: the (predicted) weights its forward used */
  stash: GpuArray[];
}

export class GpuGptStageTrainer extends GpuStageTrainer<Resident> implements StageTrainer {
  readonly layout: ParamLayout;
  /** the range, shape, corpus and batches, as every GPT stage has them */
  private readonly data: GptStageData;

  constructor(
    gpu: Gpu,
    readonly model: Extract<ModelRef, { kind: 'gpt' }>,
    a: StageAssignment,
    readonly slotCount: number,
    corpus?: ByteCorpus,
  ) {
    const data = new GptStageData(model, a, corpus);
    const { layout, weights } = stageWeights(model, data.range, a.seed ?? 1337);
    super(gpu, weights);
    this.data = data;
    this.layout = layout;
  }

  get range(): StageRange {
    return this.data.range;
  }

  get corpus(): ByteCorpus | null {
    return this.data.corpus;
  }

  get activationShape(): [number, number] {
    return this.data.activationShape;
  }

  get itemsPerMicrobatch(): number {
    return this.data.itemsPerMicrobatch;
  }

  get paramCount(): number {
    return this.layout.size;
  }

  async forward(shard: number, input: Float32Array | null, slot: number, delay: number): Promise<Float32Array> {
    const r = await this.on.get();
    const stash = slotWeights(r, slot);
    r.opt.predict(stash, delay);
    copyArray(this.gpu.device, stash, 0, r.stage.params.array, 0, this.paramCount);
    r.stage.forward(input ?? this.data.batch(shard).inputs, this.data.B, this.data.T, undefined, slot);
    return this.on.checked(await r.stage.readOutput(slot));
  }

  async lossAndBackward(shard: number, input: Float32Array | null, slot: number, step: boolean): Promise<{ loss: number; dInput: Float32Array | null }> {
    const r = await this.on.get();
    const batch = this.data.batch(shard);
    copyArray(this.gpu.device, r.weights, 0, r.stage.params.array, 0, this.paramCount);
    r.stage.forward(input ?? batch.inputs, this.data.B, this.data.T, batch.targets, slot);
    const dInput = this.backwardAndStep(r, undefined, slot, step);
    const [loss, d] = await Promise.all([r.stage.readLoss(slot), dInput]);
    return { loss, dInput: d };
  }

  async backward(dOutput: Float32Array, slot: number, step: boolean): Promise<Float32Array | null> {
    const r = await this.on.get();
    copyArray(this.gpu.device, slotWeights(r, slot), 0, r.stage.params.array, 0, this.paramCount);
    return this.backwardAndStep(r, dOutput, slot, step);
  }

  keepSlotWeights(slot: number): KeptWeights {
    return this.on.copies.keep(slotWeights(this.on.now(), slot));
  }

  protected async create(initial: Float32Array): Promise<Resident> {
    const config = this.model.config, a = this.data.a;
    const stage = await GpuGptStage.create(this.gpu.device, config, rangeParts(config, this.range), this.layout, initial, { batchSize: a.batchSize, slots: this.slotCount });
    const owned: GpuArray[] = [];
    try {
      const weights = uploadArray(this.gpu.device, initial, 'weights');
      owned.push(weights);
      for (let s = 0; s < this.slotCount; s++) owned.push(createArray(this.gpu.device, this.layout.size, `slot ${s} weights`));
      const opt = new GpuStageOptimizer(this.gpu.device, stage.kernels.optimizer, this.layout, weights, { ...ADAMW_DEFAULTS, lr: a.lr });
      return { stage, weights, opt, stash: owned.slice(1) };
    } catch (err) {
      for (const x of owned) x.destroy();
      stage.destroy();
      throw err;
    }
  }

  protected destroy(r: Resident): void {
    r.opt.destroy();
    for (const x of [r.weights, ...r.stash]) x.destroy();
    r.stage.destroy();
  }

  /** Queues the backward (gradients cleared first) and, when `step`, AdamW; resolves to d(input) once the step's status is read. */
  private async backwardAndStep(r: Resident, dOutput: Float32Array | undefined, slot: number, step: boolean): Promise<Float32Array | null> {
    r.stage.clearGrads();
    r.stage.backward(dOutput, slot);
    if (step) r.opt.update(r.stage.grads.array);
    const [dInput, status] = await Promise.all([r.stage.readDInput(slot), step ? r.opt.readStatus() : null]);
    return this.on.checked(dInput, status);
  }
}

function slotWeights(r: Resident, slot: number): GpuArray {
  const a = r.stash[slot];
  if (!a) throw new RangeError(`slot ${slot} outside 0..${r.stash.length - 1}`);
  return a;
}
