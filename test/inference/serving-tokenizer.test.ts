// The serving tokenizer seam (src/inference/tokenizer.ts), the text of a
// generation as its tokens come (text-output.ts), logprobs (logprobs.ts), the
// orchestrator's tokenizer per model (serving/tokenizers.ts) and the request
// checks of token-id prompts, logprobs and chat messages.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { tokenLogprob } from '../../src/inference/logprobs.ts';
import { TextOutput } from '../../src/inference/text-output.ts';
import { BYTE_TOKENIZER, tokenizerFromBundle } from '../../src/inference/tokenizer.ts';
import { stopSequences } from '../../src/inference/sampling.ts';
import { gptModelRef } from '../../src/model/model-ref.ts';
import { parseChatRequest, withChatPrompt } from '../../src/orchestrator/serving/chat-request.ts';
import { OpenAiError, parseCompletionRequest, withTokenizer } from '../../src/orchestrator/serving/completion-request.ts';
import { ServingTokenizers } from '../../src/orchestrator/serving/tokenizers.ts';
import { byteLevelBpe } from '../helpers/hf-tokenizers.ts';

const files = byteLevelBpe('Call me Ishmael. Some years ago, never mind how long precisely, the whale. 🐳 café', 60);
const special = (content: string): number => (files.tokenizerJson.added_tokens as { id: number; content: string }[]).find((t) => t.content === content)!.id;
const bundle = { 'tokenizer.json': files.tokenizerJson, 'tokenizer_config.json': files.tokenizerConfig, 'generation_config.json': { eos_token_id: special('<|endoftext|>') } };
const hf = tokenizerFromBundle(JSON.stringify(bundle), 400);

const decodeAll = (t: typeof hf | typeof BYTE_TOKENIZER, ids: number[]): string => {
  const d = t.decoder();
  const parts = ids.map((id) => d.push(id));
  parts.push(d.flush());
  return new TextDecoder().decode(Buffer.concat(parts));
};

test('the byte tokenizer is UTF-8 bytes, no eos, no chat template; the Hugging Face one round-trips and never streams half a character', () => {
  assert.deepEqual(BYTE_TOKENIZER.encode('hé'), [104, 0xc3, 0xa9]);
  assert.deepEqual(BYTE_TOKENIZER.encode(''), [10]);
  assert.deepEqual(BYTE_TOKENIZER.eosTokenIds, []);
  assert.equal(BYTE_TOKENIZER.hasChatTemplate, false);
  assert.throws(() => BYTE_TOKENIZER.chatPrompt([{ role: 'user', content: 'x' }]), /no chat template/);
  assert.deepEqual(Array.from(BYTE_TOKENIZER.decoder().push(0xc3)), [0xc3], 'bytes pass through, as the byte path always did');
  const text = 'Call me Ishmael. 🐳 café';
  const ids = hf.encode(text);
  assert.equal(decodeAll(hf, ids), text);
  // byte tokens of the emoji one by one: nothing shows until the character is whole
  const emoji = [...new TextEncoder().encode('🐳')].map((b) => hf.encode(String.fromCharCode(b))[0]);
  const d = hf.decoder();
  const shown = emoji.map((id) => d.push(id).length);
  assert.ok(shown.slice(0, -1).every((n) => n === 0) || shown.every((n) => n === 0), JSON.stringify(shown));
  assert.ok(hf.hasChatTemplate);
  assert.ok(hf.eosTokenIds.includes(special('<|im_end|>')), '<|im_end|>, tokenizer_config\'s eos');
  assert.ok(hf.eosTokenIds.includes(special('<|endoftext|>')), "generation_config's eos_token_id");
  assert.match(hf.text.decode(hf.chatPrompt([{ role: 'user', content: 'hi' }])), /^<\|im_start\|>user\nhi<\|im_end\|>\n<\|im_start\|>assistant\n$/);
  assert.throws(() => tokenizerFromBundle('{"tokenizer.json": 3}', 400), /no "tokenizer.json"/);
  assert.throws(() => tokenizerFromBundle('not json', 400), /not JSON/);
  assert.throws(() => tokenizerFromBundle(bundle, 200), /past the model's vocab_size/);
});

test('TextOutput: ends at an eos token or the first stop sequence, holds a stop back until it cannot start, byte for byte as stopAt', () => {
  const o = new TextOutput(BYTE_TOKENIZER, stopSequences(['lo w']));
  const shown: string[] = [];
  let done = false;
  for (const b of new TextEncoder().encode('hello world')) {
    done = o.push(b);
    shown.push(new TextDecoder().decode(o.take()));
    if (done) break;
  }
  assert.ok(done);
  assert.equal(o.finishReason, 'stop');
  assert.equal(new TextDecoder().decode(o.text()), 'hel');
  assert.equal(shown.join(''), 'hel');
  const eos = hf.eosTokenIds[0];
  const e = new TextOutput(hf, []);
  for (const id of hf.encode('the whale')) assert.equal(e.push(id), false);
  assert.equal(e.push(eos), true);
  assert.equal(e.finishReason, 'stop');
  assert.equal(new TextDecoder().decode(e.text()), 'the whale');
  const l = new TextOutput(hf, []);
  for (const id of hf.encode('the whale')) l.push(id);
  l.finish();
  assert.equal(l.finishReason, 'length');
});

test('tokenLogprob: log-softmax of the raw logits, the top k most likely first, lower id first on ties', () => {
  const logits = Float32Array.from([1, 3, 3, 0, 2]);
  const norm = Math.log([1, 3, 3, 0, 2].reduce((a, x) => a + Math.exp(x), 0));
  const t = tokenLogprob(logits, 4, 3);
  assert.ok(Math.abs(t.logprob - (2 - norm)) < 1e-6);
  assert.deepEqual(t.top.map((x) => x.id), [1, 2, 4]);
  assert.deepEqual(tokenLogprob(logits, 0, 0).top, []);
});

test('the orchestrator\'s tokenizers: the byte tokenizer without a bundle (a 400 for a vocabulary that is not bytes), a bundle loaded once per sha256', async () => {
  let asked = 0;
  const t = new ServingTokenizers((sha) => (asked++, sha === 'b'.repeat(64) ? new TextEncoder().encode(JSON.stringify(bundle)) : null));
  const gpt = (vocabSize: number) => gptModelRef({ vocabSize, contextLength: 16, channels: 16, layers: 2, heads: 2, mlpRatio: 4 });
  assert.equal(await t.of({ sha256: 'a'.repeat(64), model: 'gpt-micro', name: 'm' }), BYTE_TOKENIZER);
  await assert.rejects(t.of({ sha256: 'c'.repeat(64), model: gpt(400), name: 'x' }), (e: unknown) => e instanceof OpenAiError && e.status === 400 && e.code === 'unsupported_model');
  const a = await t.of({ sha256: 'b'.repeat(64), model: gpt(400), name: 'hf' });
  const b = await t.of({ sha256: 'b'.repeat(64), model: gpt(400), name: 'hf' });
  assert.equal(a, b);
  assert.equal(a.kind, 'hf');
  assert.equal(asked, 3);
});

test('request checks: token ids in the vocabulary, bounded; logprobs 0 to 5; stream_options; chat messages and roles', () => {
  const refuse = (f: () => unknown, param: string | null, code = 'invalid_value') =>
    assert.throws(f, (e: unknown) => e instanceof OpenAiError && e.status === 400 && e.param === param && e.code === code, String(param));
  const ids = parseCompletionRequest({ model: 'm', prompt: [[5, 399]], logprobs: 5, return_tokens_as_token_ids: true, stream_options: { include_usage: true } });
  assert.deepEqual(Array.from(withTokenizer(ids, hf).prompt), [5, 399]);
  assert.equal(ids.logprobs, 5);
  assert.equal(ids.tokenIdsInLogprobs, true);
  assert.equal(ids.includeUsage, true);
  refuse(() => withTokenizer(parseCompletionRequest({ model: 'm', prompt: [400] }), hf), 'prompt');
  refuse(() => withTokenizer(parseCompletionRequest({ model: 'm', prompt: [256] }), BYTE_TOKENIZER), 'prompt');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: new Array(16_385).fill(0) }), 'prompt', 'prompt_too_long');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: [0.5] }), 'prompt');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: 'x', logprobs: 6 }), 'logprobs');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: 'x', logprobs: 1.5 }), 'logprobs');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: 'x', stream_options: 'yes' }), 'stream_options');
  refuse(() => parseCompletionRequest({ model: 'm', prompt: 'x', return_tokens_as_token_ids: 1 }), 'return_tokens_as_token_ids');
  assert.deepEqual(Array.from(withTokenizer(parseCompletionRequest({ model: 'm', prompt: 'the whale' }), hf).prompt), hf.encode('the whale'));
  const chat = parseChatRequest({ model: 'm', messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: [{ type: 'text', text: 'hi' }] }], max_completion_tokens: 7, max_tokens: 99 });
  assert.equal(chat.request.maxTokens, 7, 'max_completion_tokens wins');
  assert.deepEqual(Array.from(withChatPrompt(chat, hf, 'm').prompt), hf.chatPrompt([{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }]));
  refuse(() => withChatPrompt(chat, BYTE_TOKENIZER, 'm'), 'model', 'no_chat_template');
  refuse(() => parseChatRequest({ model: 'm', messages: [] }), 'messages');
  refuse(() => parseChatRequest({ model: 'm', messages: [{ role: 'tool', content: 'x' }] }), 'messages[0].role');
  refuse(() => parseChatRequest({ model: 'm', messages: [{ role: 'user' }, { role: 'user', content: 3 }] }), 'messages[1].content');
  refuse(() => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: '\ud800' }] }), 'messages[0].content');
  refuse(() => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: 'x' }], logprobs: true }), 'logprobs');
  refuse(() => parseChatRequest({ model: 'm', messages: [{ role: 'user', content: 'x' }], n: 2 }), 'n');
});
