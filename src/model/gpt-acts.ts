// What a GPT stage (./gpt.ts) keeps of each microbatch in flight between its
// forward and its backward: per block, the activations the backward reads;
// for the slot, its input, the tokens and targets of an edge stage, and the
// head's outputs on a last stage.
import type { Tensor } from '../engine/tensor.ts';
import type * as L from './layers.ts';

/** One block's saved activations. */
export interface BlockActs {
  input: Tensor;
  ln1: Tensor; ln1Mean: Tensor; ln1Rstd: Tensor;
  qkv: Tensor; att: Tensor; atty: Tensor;
  res2: Tensor;
  ln2: Tensor; ln2Mean: Tensor; ln2Rstd: Tensor;
  fch: Tensor; fchGelu: Tensor;
  out: Tensor;
}

/** Everything one microbatch in flight keeps between forward and backward. */
export interface SlotActs {
  tokens: L.IntBuffer;
  targets: L.IntBuffer;
  inputAct: Tensor;
  blocks: BlockActs[];
  lnf?: Tensor;
  lnfMean?: Tensor;
  lnfRstd?: Tensor;
  logits?: Tensor;
  probs?: Tensor;
  losses?: Tensor;
  /** shape of the slot's last forward pass */
  B: number;
  T: number;
}
