// A plain MLP for tabular tasks: linear → ReLU → … → linear → softmax
// cross-entropy over `classes`. Parameters and gradients are flat buffers with
// named views (fc0.w, fc0.b, …), as for the GPT stages.
import { Type, type Static } from '@sinclair/typebox';
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import { initParams } from './init.ts';
import * as L from './layers.ts';
import { FlatTensors, ParamLayout, type ParamSpec } from './params.ts';

/** The largest sizes an MLP may have (a job spec's and a model reference's limits). */
export const MLP_LIMITS = { inputs: 1 << 20, hidden: 1 << 16, hiddenLayers: 16, classes: 1 << 16 } as const;

/**
 * An MLP's sizes. A TypeBox schema too, for configs read back from stored
 * state or an API (validateMlpConfig checks the parameter count besides).
 */
export const MlpConfig = Type.Object(
  {
    inputs: Type.Integer({ minimum: 1, maximum: MLP_LIMITS.inputs }),
    hidden: Type.Array(Type.Integer({ minimum: 1, maximum: MLP_LIMITS.hidden }), { maxItems: MLP_LIMITS.hiddenLayers }),
    /** output classes */
    classes: Type.Integer({ minimum: 2, maximum: MLP_LIMITS.classes }),
  },
  { additionalProperties: false },
);
export type MlpConfig = Static<typeof MlpConfig>;
/** The most parameters an MLP may have: its weights, gradients and optimizer state must fit a 4 GiB WASM memory. */
export const MAX_MLP_PARAMS = 2 ** 26;

/** Parameters of an MLP: weights and biases of each layer. */
export function mlpParamCountOf(config: MlpConfig): number {
  const w = [config.inputs, ...config.hidden, config.classes];
  let n = 0;
  for (let i = 0; i + 1 < w.length; i++) n += w[i] * w[i + 1] + w[i + 1];
  return n;
}

/** Checks an MLP's sizes: positive integers within MLP_LIMITS, at least 2 classes, at most MAX_MLP_PARAMS parameters. */
export function validateMlpConfig(c: MlpConfig): void {
  if (!Array.isArray(c.hidden)) throw new Error('mlp config: hidden must be a list of widths');
  if (![c.inputs, c.classes, ...c.hidden].every((n) => Number.isInteger(n) && n > 0)) throw new Error('mlp config: every width must be a positive integer');
  if (c.inputs > MLP_LIMITS.inputs) throw new Error(`mlp config: inputs ${c.inputs} exceeds ${MLP_LIMITS.inputs}`);
  if (c.hidden.length > MLP_LIMITS.hiddenLayers) throw new Error(`mlp config: ${c.hidden.length} hidden layers, at most ${MLP_LIMITS.hiddenLayers}`);
  for (const h of c.hidden) if (h > MLP_LIMITS.hidden) throw new Error(`mlp config: hidden width ${h} exceeds ${MLP_LIMITS.hidden}`);
  if (c.classes < 2 || c.classes > MLP_LIMITS.classes) throw new Error(`mlp config: classes must be from 2 to ${MLP_LIMITS.classes}, got ${c.classes}`);
  const params = mlpParamCountOf(c);
  if (params > MAX_MLP_PARAMS) throw new Error(`mlp config: ${params} parameters, more than ${MAX_MLP_PARAMS}`);
}

/** The MLP's parameters, named as in its checkpoints: fc<i>.w [in, out] (weight decay) and fc<i>.b [out]. */
export function mlpParamSpecs(config: MlpConfig): ParamSpec[] {
  const widths = [config.inputs, ...config.hidden, config.classes];
  const specs: ParamSpec[] = [];
  for (let i = 0; i + 1 < widths.length; i++) {
    const fanIn = widths[i];
    specs.push({ name: `fc${i}.w`, shape: [fanIn, widths[i + 1]], decay: true, init: { kind: 'normal', std: Math.sqrt(2 / fanIn) } });
    specs.push({ name: `fc${i}.b`, shape: [widths[i + 1]], decay: false, init: { kind: 'zeros' } });
  }
  return specs;
}

export class Mlp {
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly grads: FlatTensors;
  private readonly widths: number[];
  /** acts[0] is the input; acts[i+1] the pre-activation of layer i; relus[i] its ReLU */
  private readonly acts: Tensor[] = [];
  private readonly relus: Tensor[] = [];
  private readonly dacts: Tensor[] = [];
  private readonly probs: Tensor;
  private readonly losses: Tensor;
  private readonly targets: L.IntBuffer;
  private readonly owned: Tensor[] = [];
  private B = 0;

  constructor(
    private readonly engine: Engine,
    readonly config: MlpConfig,
    readonly maxBatch: number,
    seed = 1337,
  ) {
    if (![config.inputs, config.classes, ...config.hidden].every((n) => Number.isInteger(n) && n > 0)) throw new Error('mlp: widths must be positive integers');
    this.widths = [config.inputs, ...config.hidden, config.classes];
    this.layout = new ParamLayout(mlpParamSpecs(config));
    this.params = new FlatTensors(this.layout, engine);
    this.grads = new FlatTensors(this.layout, engine);
    initParams(this.layout, this.params.flat.data, seed);
    const t = (shape: number[]): Tensor => {
      const x = engine.tensor(shape);
      this.owned.push(x);
      return x;
    };
    for (const w of this.widths) {
      this.acts.push(t([maxBatch, w]));
      this.dacts.push(t([maxBatch, w]));
    }
    for (let i = 1; i < this.widths.length - 1; i++) this.relus.push(t([maxBatch, this.widths[i]]));
    this.probs = t([maxBatch, config.classes]);
    this.losses = t([maxBatch]);
    this.targets = engine.int32(maxBatch);
  }

  /** Mean cross-entropy on B rows of features (B × inputs) and class targets; logits without targets. */
  forward(x: Float32Array, B: number, targets?: Int32Array): number | Float32Array {
    if (!(B >= 1 && B <= this.maxBatch) || x.length !== B * this.config.inputs) throw new RangeError(`mlp takes up to ${this.maxBatch} rows of ${this.config.inputs} features`);
    for (let i = 0; i < x.length; i++) if (!Number.isFinite(x[i])) throw new RangeError(`feature ${i} is not finite`);
    this.B = B;
    const k = this.engine.kernels;
    this.acts[0].data.set(x);
    const layers = this.widths.length - 1;
    for (let i = 0; i < layers; i++) {
      const inp = i === 0 ? this.acts[0] : this.relus[i - 1];
      L.linearForward(k, this.acts[i + 1], inp, this.params.get(`fc${i}.w`), this.params.get(`fc${i}.b`), B, this.widths[i], this.widths[i + 1]);
      if (i < layers - 1) L.reluForward(k, this.relus[i], this.acts[i + 1], B * this.widths[i + 1]);
    }
    const logits = this.acts[layers];
    if (!targets) return logits.data.subarray(0, B * this.config.classes);
    if (targets.length !== B) throw new RangeError(`mlp takes ${B} targets`);
    for (const c of targets) if (!(c >= 0 && c < this.config.classes)) throw new RangeError(`class ${c} out of range`);
    this.targets.data.set(targets);
    return L.crossEntropyForward(k, this.losses, this.probs, logits, this.targets, B, this.config.classes);
  }

  /** The most likely class of each of B rows (argmax of the logits, the lowest class on a tie); forward only. */
  predict(x: Float32Array, B: number): Int32Array {
    const logits = this.forward(x, B) as Float32Array;
    const C = this.config.classes;
    const out = new Int32Array(B);
    for (let b = 0; b < B; b++) {
      let best = 0;
      for (let c = 1; c < C; c++) if (logits[b * C + c] > logits[b * C + best]) best = c;
      out[b] = best;
    }
    return out;
  }

  /** Gradients of the last forward's mean loss, accumulated into grads. Returns d(input). */
  backward(): Float32Array {
    const k = this.engine.kernels;
    const B = this.B;
    const layers = this.widths.length - 1;
    L.crossEntropyBackward(k, this.dacts[layers], this.probs, this.targets, B, this.config.classes);
    for (let i = layers - 1; i >= 0; i--) {
      const inp = i === 0 ? this.acts[0] : this.relus[i - 1];
      L.linearBackward(k, this.dacts[i], this.grads.get(`fc${i}.w`), this.grads.get(`fc${i}.b`), this.dacts[i + 1], inp, this.params.get(`fc${i}.w`), B, this.widths[i], this.widths[i + 1]);
      if (i > 0) L.reluBackward(k, this.dacts[i], this.acts[i], this.dacts[i], B * this.widths[i]);
    }
    return this.dacts[0].data.subarray(0, B * this.config.inputs);
  }

  zeroGrad(): void {
    this.grads.flat.data.fill(0);
  }

  release(): void {
    for (const t of this.owned) this.engine.free(t);
    this.engine.free(this.params.flat);
    this.engine.free(this.grads.flat);
    this.engine.free(this.targets);
  }
}
