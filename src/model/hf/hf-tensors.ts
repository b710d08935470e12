// The tensors of a Hugging Face checkpoint of each architecture: their names
// and shapes as transformers stores them (a Linear's weight is [out, in]; a
// GPT-2 Conv1D's is [in, out]), from the decoder config alone. An import
// checks a folder's tensors against this list: every tensor named here must
// be there with this shape, and nothing else may be, apart from the buffers
// older checkpoints saved beside the weights (causal masks, rotary
// frequencies), which carry no parameters.
import type { DecoderConfig } from './decoder-config.ts';

export interface HfTensorSpec {
  readonly name: string;
  readonly shape: readonly number[];
}

/** Buffers some checkpoints hold that are not parameters: skipped on import. */
const BUFFERS = [/^(transformer\.)?h\.\d+\.attn\.(masked_)?bias$/, /^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$/];

export const isBufferTensor = (name: string): boolean => BUFFERS.some((re) => re.test(name));

/** Every parameter tensor of `c`'s checkpoint, in the order transformers lists them. */
export function hfTensorSpecs(c: DecoderConfig): HfTensorSpec[] {
  const C = c.channels;
  const I = c.intermediateSize;
  const out: HfTensorSpec[] = [];
  const t = (name: string, ...shape: number[]): void => {
    out.push({ name, shape });
  };
  if (c.architecture === 'gpt2') {
    t('wte.weight', c.vocabSize, C);
    t('wpe.weight', c.contextLength, C);
    for (let l = 0; l < c.layers; l++) {
      const p = `h.${l}.`;
      t(p + 'ln_1.weight', C);
      t(p + 'ln_1.bias', C);
      t(p + 'attn.c_attn.weight', C, 3 * C);
      t(p + 'attn.c_attn.bias', 3 * C);
      t(p + 'attn.c_proj.weight', C, C);
      t(p + 'attn.c_proj.bias', C);
      t(p + 'ln_2.weight', C);
      t(p + 'ln_2.bias', C);
      t(p + 'mlp.c_fc.weight', C, I);
      t(p + 'mlp.c_fc.bias', I);
      t(p + 'mlp.c_proj.weight', I, C);
      t(p + 'mlp.c_proj.bias', C);
    }
    t('ln_f.weight', C);
    t('ln_f.bias', C);
    if (!c.tiedEmbeddings) t('lm_head.weight', c.vocabSize, C);
    return out;
  }
  const q = c.heads * c.headDim;
  const kv = c.kvHeads * c.headDim;
  t('model.embed_tokens.weight', c.vocabSize, C);
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    t(p + 'input_layernorm.weight', C);
    t(p + 'self_attn.q_proj.weight', q, C);
    if (c.qkvBias) t(p + 'self_attn.q_proj.bias', q);
    t(p + 'self_attn.k_proj.weight', kv, C);
    if (c.qkvBias) t(p + 'self_attn.k_proj.bias', kv);
    t(p + 'self_attn.v_proj.weight', kv, C);
    if (c.qkvBias) t(p + 'self_attn.v_proj.bias', kv);
    t(p + 'self_attn.o_proj.weight', C, q);
    if (c.attnOutBias) t(p + 'self_attn.o_proj.bias', C);
    t(p + 'post_attention_layernorm.weight', C);
    t(p + 'mlp.gate_proj.weight', I, C);
    if (c.mlpBias) t(p + 'mlp.gate_proj.bias', I);
    t(p + 'mlp.up_proj.weight', I, C);
    if (c.mlpBias) t(p + 'mlp.up_proj.bias', I);
    t(p + 'mlp.down_proj.weight', C, I);
    if (c.mlpBias) t(p + 'mlp.down_proj.bias', C);
  }
  t('model.norm.weight', C);
  if (!c.tiedEmbeddings) t('lm_head.weight', c.vocabSize, C);
  return out;
}

/**
 * The canonical name of a tensor as stored: GPT-2 checkpoints saved from
 * GPT2LMHeadModel prefix every name with `transformer.`.
 */
export function canonicalTensorName(c: DecoderConfig, stored: string): string {
  if (c.architecture === 'gpt2' && stored.startsWith('transformer.')) return stored.slice('transformer.'.length);
  return stored;
}

export interface TensorSetProblems {
  missing: string[];
  unexpected: string[];
  /** "name: [stored] where the config says [expected]" */
  misshapen: string[];
}

/**
 * What is wrong with a checkpoint's tensors (canonical names → shapes) for
 * config `c`. A tied model may still store `lm_head.weight` (some exports
 * do): it is accepted and ignored.
 */
export function checkTensorSet(c: DecoderConfig, stored: ReadonlyMap<string, readonly number[]>): TensorSetProblems {
  const specs = hfTensorSpecs(c);
  const wanted = new Map(specs.map((s) => [s.name, s.shape]));
  const problems: TensorSetProblems = { missing: [], unexpected: [], misshapen: [] };
  for (const s of specs) {
    const shape = stored.get(s.name);
    if (!shape) problems.missing.push(s.name);
    else if (shape.length !== s.shape.length || shape.some((d, i) => d !== s.shape[i])) problems.misshapen.push(`${s.name}: [${shape.join(', ')}] where the config says [${s.shape.join(', ')}]`);
  }
  for (const [name, shape] of stored) {
    if (wanted.has(name) || isBufferTensor(name)) continue;
    if (c.tiedEmbeddings && name === 'lm_head.weight' && shape.length === 2 && shape[0] === c.vocabSize && shape[1] === c.channels) continue;
    problems.unexpected.push(name);
  }
  return problems;
}
