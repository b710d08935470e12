// A range of a GPT's parts whose forward and backward run on the GPU
// (src/engine/webgpu/gpt-stage.ts), for a miner whose engine has one
// (`nbcli miner start --backend webgpu`). The flat parameters and gradients
// stay where every other part of the miner reads them, in the WASM memory
// (the same layout and initialisation as the WASM stage), so the inner AdamW,
// weight stashing and prediction, merges, checkpoints and spot-check records
// work unchanged. What crosses to the GPU per call: the weights the call runs
// with (queued before its kernels), the batch or the activation received;
// what comes back: the activation or gradient sent on (a frame that leaves
// the miner anyway), the loss, and after a backward the stage's gradients.
// The GPU kernels are compiled when the stage is taken, in the background;
// the first call waits for them. The MLP classifier (one stage) runs its
// forward, loss and backward on the GPU the same way (GpuMlpStageModel).
import type { ByteCorpus } from '../data/corpus.ts';
import type { Engine } from '../engine/engine.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { GpuGptStage } from '../engine/webgpu/gpt-stage.ts';
import { GpuMlp } from '../engine/webgpu/mlp.ts';
import { spamBatch } from '../data/spam.ts';
import { createStageParams, rangeParts } from '../model/gpt.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { FlatTensors, ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { GptStageData, type StageModel } from './stage-model.ts';
import { MlpStageModel } from './stage-model-wasm.ts';

export class GpuGptStageModel extends GptStageData implements StageModel {
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly grads: FlatTensors;
  readonly slotCount: number;
  private readonly compiled: Promise<GpuGptStage>;
  private released = false;

  constructor(
    private readonly engine: Engine,
    private readonly gpu: Gpu,
    model: Extract<ModelRef, { kind: 'gpt' }>,
    a: StageAssignment,
    slots: number,
    corpus?: ByteCorpus,
  ) {
    super(model, a, corpus);
    const config = model.config;
    // the WASM stage's layout and initialisation (src/model/gpt.ts GptStage): same seed, same weights, whichever backend
    ({ layout: this.layout, params: this.params, grads: this.grads } = createStageParams(engine, config, this.range, a.seed ?? 1337));
    this.slotCount = slots;
    this.compiled = GpuGptStage.create(gpu.device, config, rangeParts(config, this.range), this.layout, this.params.flat.data, { batchSize: a.batchSize, slots });
    this.compiled.catch(() => {}); // reported by the first call that waits for it
  }

  get paramCount(): number {
    return this.layout.size;
  }

  async forward(shard: number, input: Float32Array | null, slot: number, weights: Float32Array): Promise<Float32Array> {
    const g = await this.stage();
    g.writeParams(weights);
    g.forward(input ?? this.batch(shard).inputs, this.B, this.T, undefined, slot);
    return checked(this.gpu, await g.readOutput(slot));
  }

  async lossAndBackward(shard: number, input: Float32Array | null, slot: number): Promise<{ loss: number; dInput: Float32Array | null }> {
    const g = await this.stage();
    const batch = this.batch(shard);
    g.writeParams(this.params.flat.data);
    g.forward(input ?? batch.inputs, this.B, this.T, batch.targets, slot);
    g.clearGrads();
    g.backward(undefined, slot);
    const [loss, dInput, grads] = await Promise.all([g.readLoss(slot), g.readDInput(slot), g.readGrads()]);
    accumulate(this.grads.flat.data, checked(this.gpu, grads), this.released);
    return { loss, dInput: dInput ? checked(this.gpu, dInput) : null };
  }

  async backward(dOutput: Float32Array, slot: number, weights: Float32Array): Promise<Float32Array | null> {
    const g = await this.stage();
    g.writeParams(weights);
    g.clearGrads();
    g.backward(dOutput, slot);
    const [dInput, grads] = await Promise.all([g.readDInput(slot), g.readGrads()]);
    accumulate(this.grads.flat.data, checked(this.gpu, grads), this.released);
    return dInput ? checked(this.gpu, dInput) : null;
  }

  async ready(): Promise<void> {
    await this.compiled;
  }

  zeroGrad(): void {
    this.grads.flat.data.fill(0);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.compiled.then((g) => g.destroy(), () => {});
    this.engine.free(this.params.flat);
    this.engine.free(this.grads.flat);
  }

  private async stage(): Promise<GpuGptStage> {
    if (this.released) throw new Error('the stage was released');
    const g = await this.compiled;
    if (this.released) throw new Error('the stage was released');
    return g;
  }

}

/** The whole MLP classifier, its forward, loss and backward on the GPU; the rest as MlpStageModel (its WASM Mlp holds the flat parameters and gradients). */
export class GpuMlpStageModel extends MlpStageModel {
  private readonly compiled: Promise<GpuMlp>;
  private released = false;

  constructor(engine: Engine, private readonly gpu: Gpu, model: Extract<ModelRef, { kind: 'mlp' }>, a: StageAssignment, slots: number) {
    super(engine, model, a, slots);
    this.compiled = GpuMlp.create(gpu.device, model.config, this.layout, this.params.flat.data, a.batchSize);
    this.compiled.catch(() => {}); // reported by the first call that waits for it
  }

  override async lossAndBackward(shard: number, input: Float32Array | null): Promise<{ loss: number; dInput: Float32Array | null }> {
    if (input) throw new Error('an MLP is one stage: it receives no activation');
    if (this.released) throw new Error('the stage was released');
    const g = await this.compiled;
    if (this.released) throw new Error('the stage was released');
    const batch = spamBatch(this.dataset, this.a.seed, shard, this.a.batchSize);
    g.writeParams(this.params.flat.data);
    g.clearGrads();
    g.forward(batch.x, batch.B, batch.y);
    g.backward();
    const [loss, grads] = await Promise.all([g.readLoss(), g.readGrads()]);
    accumulate(this.grads.flat.data, checked(this.gpu, grads), this.released);
    return { loss, dInput: null };
  }

  override async ready(): Promise<void> {
    await this.compiled;
  }

  override release(): void {
    if (this.released) return;
    this.released = true;
    this.compiled.then((g) => g.destroy(), () => {});
    super.release();
  }
}

/** One call's gradients from the GPU, added to the flat gradients (which accumulate, as on WASM). */
function accumulate(into: Float32Array, grads: Float32Array, released: boolean): void {
  if (released) throw new Error('the stage was released');
  for (let i = 0; i < into.length; i++) into[i] += grads[i];
}

/** `values`, unless the device reported an error (out of memory, a validation error): then what it said. */
function checked(gpu: Gpu, values: Float32Array): Float32Array {
  const errors = gpu.takeErrors();
  if (errors.length) throw new Error(`WebGPU: ${errors[0].slice(0, 300)}`);
  return values;
}
