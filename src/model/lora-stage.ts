// What a training stage (./gpt.ts) holds for LoRA: the adapters' flat
// parameters and gradients (all that trains, so all that the optimizer,
// merges and checkpoints see), and per microbatch slot each block's
// BlockLora (./lora-linear.ts) over views of them.
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import type { GptConfig } from './config.ts';
import { initParams } from './init.ts';
import type { BlockLora, LoraAdapter, LoraScratch } from './lora-linear.ts';
import { loraLayout, loraParamName, loraScale, loraSites, type LinearName, type LoraSpec } from './lora.ts';
import { FlatTensors, type ParamLayout } from './params.ts';
import type { StageRange } from './parts.ts';

/** A stage's adapters: A kaiming-uniform from `seed` (per tensor name, so whole or split they are the same), B zeros; gradients zero. */
export function createLoraParams(engine: Engine, config: GptConfig, spec: LoraSpec, range: StageRange, seed: number): { layout: ParamLayout; params: FlatTensors; grads: FlatTensors } {
  const layout = loraLayout(config, spec, range);
  const params = new FlatTensors(layout, engine);
  const grads = new FlatTensors(layout, engine);
  initParams(layout, params.flat.data, seed);
  return { layout, params, grads };
}

/** The scratch a stage's adapters share, for N rows. */
export function loraScratch(config: GptConfig, spec: LoraSpec, t: (shape: number[]) => Tensor, N: number): LoraScratch {
  const maxIn = Math.max(...loraSites(config, spec).map((s) => s.inFeatures));
  return { du: t([N, spec.rank]), xd: t([N, maxIn]), dxd: t([N, maxIn]), mask: new Float32Array(N * maxIn) };
}

/** Block `layer`'s adapters in one slot: views of the stage's params and grads, and its own kept activations (N × r per adapter). */
export function blockLora(
  config: GptConfig, spec: LoraSpec, layer: number, params: FlatTensors, grads: FlatTensors, scratch: LoraScratch, t: (shape: number[]) => Tensor, N: number,
): BlockLora {
  const adapters = new Map<LinearName, LoraAdapter[]>();
  for (const site of loraSites(config, spec)) {
    const a = loraParamName(layer, site, 'A'), b = loraParamName(layer, site, 'B');
    const ad: LoraAdapter = {
      site, name: a.slice(0, -2), A: params.get(a), B: params.get(b), dA: grads.get(a), dB: grads.get(b), v: t([N, spec.rank]),
    };
    const list = adapters.get(site.linear) ?? [];
    list.push(ad);
    adapters.set(site.linear, list);
  }
  return { scale: loraScale(spec), rank: spec.rank, dropout: spec.dropout, training: true, maskSeed: 0, adapters, scratch };
}
