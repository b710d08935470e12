// A GPT-2 model folder in the engine's GPT (src/model/gpt.ts): the byte-level
// GPT's parts are GPT-2's (LayerNorm, learned positions, tanh-GELU, a fused
// qkv projection, Conv1D weights stored [in, out] as the engine stores its
// linears), so a GPT-2 checkpoint maps onto them name by name. The one
// difference: GPT-2 ties its head to the token embedding, and the engine's
// head is a tensor of its own (so that the first and last stages share no
// weights): it is written as the embedding's transpose.
import type { GptConfig } from '../config.ts';
import type { ParamLayout } from '../params.ts';
import { ModelFolderError, type DecoderConfig } from './decoder-config.ts';
import type { ModelFolder } from './model-folder.ts';

/** The engine's GPT config of a GPT-2 decoder; ModelFolderError for what the engine's GPT does not run yet. */
export function gptConfigOfGpt2(c: DecoderConfig): GptConfig {
  if (c.architecture !== 'gpt2') throw new ModelFolderError(`a ${c.architecture} model is not a GPT-2`);
  if (c.intermediateSize % c.channels !== 0) throw new ModelFolderError(`n_inner ${c.intermediateSize} is not a multiple of n_embd ${c.channels}`);
  if (Math.abs(c.normEps - 1e-5) > 1e-12) throw new ModelFolderError(`layer_norm_epsilon ${c.normEps} is not supported yet (1e-5)`);
  if (c.vocabSize % 4 !== 0) throw new ModelFolderError(`vocab_size ${c.vocabSize} is not a multiple of 4, which the engine's GPT needs yet`);
  return { vocabSize: c.vocabSize, contextLength: c.contextLength, channels: c.channels, layers: c.layers, heads: c.heads, mlpRatio: c.intermediateSize / c.channels, init: 'gpt2' };
}

/** Our name of each parameter → the checkpoint tensor it comes from (transposed: the head). */
function sourceOf(name: string, tied: boolean): { tensor: string; transpose: boolean } {
  const fixed: Record<string, string> = { wte: 'wte.weight', wpe: 'wpe.weight', 'lnf.w': 'ln_f.weight', 'lnf.b': 'ln_f.bias' };
  if (name in fixed) return { tensor: fixed[name], transpose: false };
  if (name === 'lm_head.w') return { tensor: tied ? 'wte.weight' : 'lm_head.weight', transpose: true };
  const m = /^h\.(\d+)\.(.+)$/.exec(name);
  const block: Record<string, string> = {
    'ln1.w': 'ln_1.weight', 'ln1.b': 'ln_1.bias', 'attn.qkv.w': 'attn.c_attn.weight', 'attn.qkv.b': 'attn.c_attn.bias',
    'attn.proj.w': 'attn.c_proj.weight', 'attn.proj.b': 'attn.c_proj.bias', 'ln2.w': 'ln_2.weight', 'ln2.b': 'ln_2.bias',
    'mlp.fc.w': 'mlp.c_fc.weight', 'mlp.fc.b': 'mlp.c_fc.bias', 'mlp.proj.w': 'mlp.c_proj.weight', 'mlp.proj.b': 'mlp.c_proj.bias',
  };
  if (!m || !(m[2] in block)) throw new ModelFolderError(`no GPT-2 tensor for the engine's ${name}`);
  return { tensor: `h.${m[1]}.${block[m[2]]}`, transpose: false };
}

/** The weights of `layout` (a stage's parameters) filled from a GPT-2 folder, one tensor read at a time. */
export function gpt2Weights(folder: ModelFolder, layout: ParamLayout): Float32Array {
  const out = new Float32Array(layout.size);
  for (const e of layout.entries) {
    const { tensor, transpose } = sourceOf(e.name, folder.config.tiedEmbeddings);
    const values = folder.read(tensor);
    if (values.length !== e.size) throw new ModelFolderError(`${tensor}: ${values.length} values where the engine's ${e.name} takes ${e.size}`);
    if (!transpose) {
      out.set(values, e.offset);
      continue;
    }
    // [V, C] → [C, V]
    const [C, V] = e.shape;
    for (let v = 0; v < V; v++) for (let c = 0; c < C; c++) out[e.offset + c * V + v] = values[v * C + c];
  }
  return out;
}
