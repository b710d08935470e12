// Merging LoRA adapters into their base weights, as PEFT's merge does:
// W' = W + (alpha / r) · B A for each adapted module. The engine stores its
// linears [in, out] (./parts.ts), so the update of a module with output
// columns [col, col + w) is added as (B A)ᵀ to those columns: W'[i, col + j]
// += s · Σ_k B[j, k] A[k, i] (PEFT's fan_in_fan_out transpose, for GPT-2's
// Conv1D, is this same orientation). The merged weights serve at the base
// model's cost (src/inference/stage-inference.ts); they differ from the
// unmerged forward by f32 rounding only.
import type { GptConfig } from './config.ts';
import { loraLayout, loraParamName, loraScale, loraSites, LoraError, type LoraSpec } from './lora.ts';
import type { ParamLayout } from './params.ts';
import { rangeParts, type StageRange } from './parts.ts';

/**
 * The stage weights `base` (laid out by `baseLayout`: the parts of `range`)
 * with the adapters `adapters` (laid out by loraLayout(config, spec, range))
 * merged in. `base` is left as it was.
 */
export function mergeLora(config: GptConfig, spec: LoraSpec, range: StageRange, baseLayout: ParamLayout, base: Float32Array, adapters: Float32Array): Float32Array {
  const layout = loraLayout(config, spec, range);
  if (base.length !== baseLayout.size) throw new LoraError(`merge: ${base.length} base weights where the stage takes ${baseLayout.size}`);
  checkLoraAdapters(layout, adapters);
  const out = base.slice();
  for (const l of rangeParts(config, range).blocks) {
    for (const linear of new Set(loraSites(config, spec).map((site) => site.linear))) {
      const w = baseLayout.byName.get(`h.${l}.${linear}.w`);
      if (!w) throw new LoraError(`merge: the stage has no h.${l}.${linear}.w`);
      addLoraUpdate(config, spec, w.name, w.shape, out.subarray(w.offset, w.offset + w.size), layout, adapters);
    }
  }
  return out;
}

/** Adapters laid out by `layout`: the right count, every value finite (a LoraError otherwise). */
export function checkLoraAdapters(layout: ParamLayout, adapters: Float32Array): void {
  if (adapters.length !== layout.size) throw new LoraError(`merge: ${adapters.length} adapter values where the spec takes ${layout.size}`);
  for (let i = 0; i < adapters.length; i++) if (!Number.isFinite(adapters[i])) throw new LoraError(`merge: adapter value ${i} is not finite`);
}

/**
 * Adds the adapters' updates to one engine tensor, in place: `values` of the
 * tensor `name` (shape `shape`), `adapters` laid out by `layout` (a
 * loraLayout holding that tensor's block). A tensor no adapter targets is
 * left as it was. What an export with --merge does tensor by tensor.
 */
export function addLoraUpdate(config: GptConfig, spec: LoraSpec, name: string, shape: readonly number[], values: Float32Array, layout: ParamLayout, adapters: Float32Array): void {
  const m = /^h\.(\d+)\.(.+)\.w$/.exec(name);
  if (!m) return;
  const l = Number(m[1]);
  const r = spec.rank, s = loraScale(spec);
  for (const site of loraSites(config, spec)) {
    if (site.linear !== m[2]) continue;
    const a = layout.byName.get(loraParamName(l, site, 'A')), b = layout.byName.get(loraParamName(l, site, 'B'));
    if (!a || !b) throw new LoraError(`merge: no adapter of ${site.module} for block ${l}`);
    const [IN, OUT] = shape;
    if (shape.length !== 2 || values.length !== IN * OUT || IN !== site.inFeatures || site.col + site.width > OUT) throw new LoraError(`merge: ${site.module} does not fit ${name} [${shape}]`);
    const A = adapters.subarray(a.offset, a.offset + a.size), B = adapters.subarray(b.offset, b.offset + b.size);
    for (let i = 0; i < IN; i++) {
      const row = i * OUT + site.col;
      for (let j = 0; j < site.width; j++) {
        let d = 0;
        for (let k = 0; k < r; k++) d += B[j * r + k] * A[k * IN + i];
        values[row + j] += s * d;
      }
    }
  }
}
