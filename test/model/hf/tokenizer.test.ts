// Tokenizers of Hugging Face folders (src/model/hf/tokenizer.ts) on the two
// kinds real models ship, made by test/helpers/hf-tokenizers.ts: encoding then
// decoding gives the text back, special tokens are single ids, chat templates
// render as transformers renders them, eos ids come from both configs, and
// streamed text never carries half a UTF-8 character.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { IncrementalDecoder, TextTokenizer } from '../../../src/model/hf/tokenizer.ts';
import { byteLevelBpe, sentencePieceBpe } from '../../helpers/hf-tokenizers.ts';

const CORPUS = 'Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world. '.repeat(3);
const TEXTS = ['Call me Ishmael.', 'naïve café — 東京 🐳 and ünïcödé', '  spaces   and\ttabs\nnew lines ', ''];

for (const [kind, files] of [['byte-level BPE', byteLevelBpe(CORPUS)], ['SentencePiece BPE with byte fallback', sentencePieceBpe(CORPUS)]] as const) {
  test(`${kind}: encode then decode gives the text back, unknown characters included`, () => {
    const tok = TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, {}, 4096);
    for (const text of TEXTS) {
      const ids = tok.encode(text, false);
      assert.equal(tok.decode(ids), text, JSON.stringify(text));
      assert.ok(ids.every((id) => Number.isInteger(id) && id >= 0 && id < tok.size));
    }
    // the merges learned from the corpus make common words fewer tokens than bytes
    assert.ok(tok.encode('Call me Ishmael.', false).length < 'Call me Ishmael.'.length / 2);
  });

  test(`${kind}: streamed text is the decoded text, and never half a character`, () => {
    const tok = TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, {}, 4096);
    const text = 'whale 🐳 東京 ünï';
    const ids = tok.encode(text, false);
    const dec = tok.incremental();
    const parts = ids.map((id) => dec.push(id));
    parts.push(dec.flush());
    assert.equal(parts.join(''), text);
    for (const p of parts) assert.ok(!p.includes('\uFFFD'), JSON.stringify(parts));
    // a multi-byte character is split over several byte tokens here, and comes out in one piece
    assert.ok(parts.some((p) => p.includes('🐳')));
  });
}

test('special tokens are single ids; the chat template renders ChatML; eos from tokenizer_config and generation_config', () => {
  const files = byteLevelBpe(CORPUS);
  const tok = TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, { eos_token_id: [0, 5] }, 4096);
  const imEnd = tok.encode('<|im_end|>', false);
  assert.equal(imEnd.length, 1);
  assert.deepEqual(tok.eosTokenIds, [0, 5, imEnd[0]].sort((a, b) => a - b));
  const prompt = tok.renderChat([
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Who is Ishmael?' },
  ]);
  assert.equal(prompt, '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho is Ishmael?<|im_end|>\n<|im_start|>assistant\n');
  const ids = tok.encodeChat([{ role: 'user', content: 'hi' }]);
  assert.equal(ids.filter((id) => id === imEnd[0]).length, 1);
  assert.equal(tok.decode(ids), '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
  assert.equal(tok.decode(ids, true), 'user\nhi\nassistant\n');
});

test('SentencePiece: the bos is added by the post-processor, and the Llama 2 template puts it first', () => {
  const files = sentencePieceBpe(CORPUS);
  const tok = TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, {}, 4096);
  assert.deepEqual(tok.encode('me', true).slice(0, 1), [1]);
  assert.notEqual(tok.encode('me', false)[0], 1);
  assert.deepEqual(tok.eosTokenIds, [2]);
  const prompt = tok.renderChat([{ role: 'user', content: 'Who?' }]);
  assert.equal(prompt, '<s>[INST] Who? [/INST]');
  assert.equal(tok.encodeChat([{ role: 'user', content: 'Who?' }])[0], 1);
});

test('a vocabulary larger than the model, a model without a template, a broken template: one clear line each', () => {
  const files = byteLevelBpe(CORPUS);
  assert.throws(() => TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, {}, 300), /token ids go up to \d+, past the model's vocab_size 300/);
  const plain = TextTokenizer.fromJson(files.tokenizerJson, { ...files.tokenizerConfig, chat_template: undefined }, {}, 4096);
  assert.equal(plain.chatTemplate, null);
  assert.throws(() => plain.renderChat([{ role: 'user', content: 'x' }]), /no chat template/);
  assert.throws(() => TextTokenizer.fromJson(files.tokenizerJson, { ...files.tokenizerConfig, chat_template: '{% for %}' }, {}, 4096), /chat template does not parse/);
  assert.throws(() => TextTokenizer.fromJson({ nope: 1 }, {}, {}, 4096), /tokenizer.json: no model section/);
  assert.throws(() => TextTokenizer.fromJson(files.tokenizerJson, files.tokenizerConfig, { eos_token_id: 99999 }, 4096), /eos token id 99999 is outside/);
});

test('IncrementalDecoder holds back a character until its last byte arrives', () => {
  const bytes = [...new TextEncoder().encode('a🐳b')];
  const dec = new IncrementalDecoder((ids) => new TextDecoder().decode(new Uint8Array(ids)));
  const out = bytes.map((b) => dec.push(b));
  assert.deepEqual(out, ['a', '', '', '', '🐳', 'b']);
  const cut = new IncrementalDecoder((ids) => new TextDecoder().decode(new Uint8Array(ids)));
  assert.equal(cut.push(0xf0), '');
  assert.equal(cut.flush(), '\uFFFD');
});
