// The config.json written for a decoder (src/model/hf/config-json.ts) reads
// back as the same decoder for each family, rope scaling included; what the
// family's config.json cannot say is refused in one line.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { hfConfigOfDecoder } from '../../../src/model/hf/config-json.ts';
import { decoderConfigFromHf, ModelFolderError, type DecoderConfig } from '../../../src/model/hf/decoder-config.ts';
import { TINY_GPT2_CONFIG, TINY_LLAMA_CONFIG, TINY_QWEN2_CONFIG } from '../../helpers/hf-folder.ts';

const LLAMA3_SCALED = { ...TINY_LLAMA_CONFIG, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } };
const LINEAR_SCALED = { ...TINY_LLAMA_CONFIG, rope_scaling: { type: 'linear', factor: 2 }, attention_bias: true, mlp_bias: true, tie_word_embeddings: true, head_dim: 32 };

test('a decoder\'s config.json reads back as the decoder: Llama (plain, llama3 and linear rope scaling, biases, tied), Qwen2, GPT-2', () => {
  for (const hf of [TINY_LLAMA_CONFIG, LLAMA3_SCALED, LINEAR_SCALED, TINY_QWEN2_CONFIG, TINY_GPT2_CONFIG]) {
    const d = decoderConfigFromHf(hf);
    const json = hfConfigOfDecoder(d);
    assert.equal(json.model_type, hf.model_type);
    assert.deepEqual(json.architectures, hf.architectures);
    assert.deepEqual(decoderConfigFromHf(JSON.parse(JSON.stringify(json))), d, String(hf.model_type));
  }
});

test('what a family\'s config.json cannot say is refused', () => {
  const llama = decoderConfigFromHf(TINY_LLAMA_CONFIG);
  const qwen = decoderConfigFromHf(TINY_QWEN2_CONFIG);
  const gpt2 = decoderConfigFromHf(TINY_GPT2_CONFIG);
  const cases: [DecoderConfig, RegExp][] = [
    [{ ...llama, qkvBias: true }, /llama config\.json cannot describe biases on q, k and v but not on the output/],
    [{ ...qwen, qkvBias: false }, /qwen2 config\.json cannot describe attention biases other than on q, k and v/],
    [{ ...llama, norm: 'layernorm' }, /llama config\.json cannot describe layernorm/],
    [{ ...gpt2, mlpBias: false }, /gpt2 config\.json cannot describe projections without biases/],
    [{ ...gpt2, kvHeads: 2 }, /gpt2 config\.json cannot describe grouped-query heads/],
  ];
  for (const [d, message] of cases) assert.throws(() => hfConfigOfDecoder(d), (e: unknown) => e instanceof ModelFolderError && message.test(e.message));
});
