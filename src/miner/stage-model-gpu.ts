// The MLP classifier (one stage) with its forward, loss and backward on the
// GPU (src/engine/webgpu/mlp.ts), for a miner whose engine has one
// (`nbcli miner start --backend webgpu`). Its flat parameters and gradients
// stay in the WASM memory, where the host trainer's AdamW
// (./stage-trainer-host.ts) steps them: each call writes the weights to the
// GPU and reads the gradients back (the model is small; a GPT stage keeps
// everything on the GPU instead, ./stage-trainer-gpu.ts). The kernels are
// compiled when the stage is taken, in the background; the first call waits
// for them.
import type { Engine } from '../engine/engine.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { GpuMlp } from '../engine/webgpu/mlp.ts';
import { spamBatch } from '../data/spam.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { MlpStageModel } from './stage-model-wasm.ts';

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
