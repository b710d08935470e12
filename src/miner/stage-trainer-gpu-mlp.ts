// The MLP classifier trained on the GPU, its inner loop included
// (`nbcli miner start --backend webgpu`): the weights, gradients and AdamW's
// moments stay on the GPU (src/engine/webgpu/mlp.ts, stage-optimizer.ts).
// An MLP is one stage: each microbatch loads its batch, runs forward, loss
// and backward at once and queues the step, so no slot keeps weights (its
// spot-check record is the current weights, copied on the GPU). What
// crosses to the CPU per microbatch: the batch's features and classes going
// in; the loss and the step's 16-byte status coming back. The weights start
// as the WASM classifier's do (same layout, same seed), made in host memory.
import type { ByteCorpus } from '../data/corpus.ts';
import { spamBatch, type SpamDataset } from '../data/spam.ts';
import type { GpuArray } from '../engine/webgpu/buffers.ts';
import type { Gpu } from '../engine/webgpu/device.ts';
import { GpuMlp } from '../engine/webgpu/mlp.ts';
import { GpuStageOptimizer } from '../engine/webgpu/stage-optimizer.ts';
import { ADAMW_DEFAULTS } from '../model/adamw.ts';
import type { StageRange } from '../model/parts.ts';
import { stageWeights, type ModelRef } from '../model/model-ref.ts';
import type { ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import type { KeptWeights } from './forward-records.ts';
import { GpuStageTrainer } from './gpu-resident.ts';
import { mlpDataset } from './stage-model-wasm.ts';
import type { StageTrainer } from './stage-trainer.ts';

interface Resident {
  mlp: GpuMlp;
  /** the MLP's own parameters: the current weights */
  weights: GpuArray;
  opt: GpuStageOptimizer;
}

export class GpuMlpStageTrainer extends GpuStageTrainer<Resident> implements StageTrainer {
  readonly range: StageRange = { from: 0, to: 1 };
  readonly layout: ParamLayout;
  readonly corpus: ByteCorpus | null = null;
  private readonly dataset: SpamDataset;

  constructor(
    gpu: Gpu,
    readonly model: Extract<ModelRef, { kind: 'mlp' }>,
    private readonly a: StageAssignment,
    /** microbatches queued for this stage; each runs forward, loss and backward at once */
    readonly slotCount: number,
  ) {
    const dataset = mlpDataset(model, a);
    const { layout, weights } = stageWeights(model, { from: 0, to: 1 }, a.seed ?? 1337);
    super(gpu, weights);
    this.dataset = dataset;
    this.layout = layout;
  }

  get paramCount(): number {
    return this.layout.size;
  }

  get activationShape(): [number, number] {
    return [this.a.batchSize, this.model.config.inputs];
  }

  get itemsPerMicrobatch(): number {
    return this.a.batchSize;
  }

  forward(): Promise<Float32Array> {
    return Promise.reject(new Error('an MLP is one stage: it sends no activation on'));
  }

  async lossAndBackward(shard: number, input: Float32Array | null, _slot: number, step: boolean): Promise<{ loss: number; dInput: Float32Array | null }> {
    if (input) throw new Error('an MLP is one stage: it receives no activation');
    const r = await this.on.get();
    const batch = spamBatch(this.dataset, this.a.seed, shard, this.a.batchSize);
    r.mlp.clearGrads();
    r.mlp.forward(batch.x, batch.B, batch.y);
    r.mlp.backward();
    if (step) r.opt.update(r.mlp.grads.array);
    const [loss, status] = await Promise.all([r.mlp.readLoss(), step ? r.opt.readStatus() : null]);
    return { loss: this.on.checked(loss, status), dInput: null };
  }

  backward(): Promise<Float32Array | null> {
    return Promise.reject(new Error('an MLP is one stage: it receives no gradient'));
  }

  keepSlotWeights(): KeptWeights {
    throw new Error('an MLP is one stage: no slot holds a forward');
  }

  protected async create(initial: Float32Array): Promise<Resident> {
    const mlp = await GpuMlp.create(this.gpu.device, this.model.config, this.layout, initial, this.a.batchSize);
    try {
      return { mlp, weights: mlp.params.array, opt: new GpuStageOptimizer(this.gpu.device, mlp.kernels.optimizer, this.layout, mlp.params.array, { ...ADAMW_DEFAULTS, lr: this.a.lr }) };
    } catch (err) {
      mlp.destroy();
      throw err;
    }
  }

  protected destroy(r: Resident): void {
    r.opt.destroy();
    r.mlp.destroy();
  }
}
