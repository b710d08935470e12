// A model part's parameters live in one flat buffer with named views; the
// gradients mirror it. Tensors that take weight decay come first, so the
// optimizer treats the buffer as two ranges.
import type { Engine } from '../engine/engine.ts';
import { Tensor, numel } from '../engine/tensor.ts';

export type InitKind = { kind: 'normal'; std: number } | { kind: 'uniform'; bound: number } | { kind: 'zeros' } | { kind: 'ones' };

export interface ParamSpec {
  name: string;
  shape: number[];
  /** takes weight decay (matrices and embeddings) */
  decay: boolean;
  init: InitKind;
}

export interface ParamEntry extends ParamSpec {
  /** offset in floats into the flat buffer */
  offset: number;
  size: number;
}

export class ParamLayout {
  readonly entries: ParamEntry[];
  readonly byName: Map<string, ParamEntry>;
  /** total floats */
  readonly size: number;
  /** floats [0, decaySize) take weight decay */
  readonly decaySize: number;

  constructor(specs: readonly ParamSpec[]) {
    const ordered = [...specs.filter((s) => s.decay), ...specs.filter((s) => !s.decay)];
    let offset = 0;
    let decaySize = 0;
    this.entries = ordered.map((s) => {
      const size = numel(s.shape);
      const e: ParamEntry = { ...s, offset, size };
      offset += size;
      if (s.decay) decaySize = offset;
      return e;
    });
    this.size = offset;
    this.decaySize = decaySize;
    this.byName = new Map(this.entries.map((e) => [e.name, e]));
    if (this.byName.size !== this.entries.length) throw new Error('param layout: duplicate names');
  }
}

/** A flat buffer and its named views. */
export class FlatTensors {
  readonly flat: Tensor;
  private readonly views = new Map<string, Tensor>();

  constructor(
    readonly layout: ParamLayout,
    engine: Engine,
  ) {
    this.flat = engine.tensor([layout.size]);
    for (const e of layout.entries) this.views.set(e.name, this.flat.view(e.offset, e.shape));
  }

  get(name: string): Tensor {
    const t = this.views.get(name);
    if (!t) throw new Error(`no parameter named ${name}`);
    return t;
  }

  names(): string[] {
    return this.layout.entries.map((e) => e.name);
  }
}
