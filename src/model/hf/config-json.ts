// The Hugging Face `config.json` of a decoder config: the inverse of
// decoderConfigFromHf (./decoder-config.ts), for a model that never came from
// a folder (a run trained from an inline `llama:v…` reference, whose
// checkpoint carries no config.json of its own) and is exported as one. What
// reads back is the same decoder; a combination the family's config.json
// cannot say (a Llama with biases on q/k/v but not on the output, a Qwen2
// without its q/k/v biases, a GPT-2 without LayerNorm) is refused in one line.
import { ModelFolderError, type DecoderConfig } from './decoder-config.ts';

type Json = Record<string, unknown>;

const refuse = (d: DecoderConfig, what: string): never => {
  throw new ModelFolderError(`a ${d.architecture} config.json cannot describe ${what}`);
};

function ropeScalingJson(d: DecoderConfig): Json | null {
  const s = d.ropeScaling;
  if (!s) return null;
  if (s.kind === 'linear') return { rope_type: 'linear', factor: s.factor };
  return { rope_type: 'llama3', factor: s.factor, low_freq_factor: s.lowFreqFactor, high_freq_factor: s.highFreqFactor, original_max_position_embeddings: s.originalContextLength };
}

function llamaLikeJson(d: DecoderConfig): Json {
  if (d.norm !== 'rmsnorm' || d.position !== 'rope' || d.mlp !== 'swiglu') refuse(d, `${d.norm}, ${d.position} positions and a ${d.mlp} MLP`);
  const qwen = d.architecture === 'qwen2';
  if (qwen && (!d.qkvBias || d.attnOutBias)) refuse(d, 'attention biases other than on q, k and v');
  if (!qwen && d.qkvBias !== d.attnOutBias) refuse(d, 'biases on q, k and v but not on the output projection (or the reverse)');
  return {
    architectures: [qwen ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'],
    model_type: d.architecture,
    vocab_size: d.vocabSize,
    hidden_size: d.channels,
    intermediate_size: d.intermediateSize,
    num_hidden_layers: d.layers,
    num_attention_heads: d.heads,
    num_key_value_heads: d.kvHeads,
    head_dim: d.headDim,
    max_position_embeddings: d.contextLength,
    rms_norm_eps: d.normEps,
    rope_theta: d.ropeTheta,
    rope_scaling: ropeScalingJson(d),
    hidden_act: 'silu',
    ...(qwen ? { use_sliding_window: false } : { attention_bias: d.qkvBias }),
    mlp_bias: d.mlpBias,
    tie_word_embeddings: d.tiedEmbeddings,
  };
}

function gpt2Json(d: DecoderConfig): Json {
  if (d.norm !== 'layernorm' || d.position !== 'learned' || d.mlp !== 'gelu') refuse(d, `${d.norm}, ${d.position} positions and a ${d.mlp} MLP`);
  if (!d.qkvBias || !d.attnOutBias || !d.mlpBias) refuse(d, 'projections without biases');
  if (d.kvHeads !== d.heads || d.headDim * d.heads !== d.channels) refuse(d, 'grouped-query heads or a head width other than n_embd / n_head');
  return {
    architectures: ['GPT2LMHeadModel'],
    model_type: 'gpt2',
    vocab_size: d.vocabSize,
    n_embd: d.channels,
    n_layer: d.layers,
    n_head: d.heads,
    n_inner: d.intermediateSize,
    n_positions: d.contextLength,
    n_ctx: d.contextLength,
    layer_norm_epsilon: d.normEps,
    activation_function: 'gelu_new',
    tie_word_embeddings: d.tiedEmbeddings,
  };
}

/** The config.json that decoderConfigFromHf reads back as `d`; ModelFolderError for what the family's config cannot say. */
export function hfConfigOfDecoder(d: DecoderConfig): Json {
  return d.architecture === 'gpt2' ? gpt2Json(d) : llamaLikeJson(d);
}
