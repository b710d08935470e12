// OpenAI's chat and completions contract on a model with a real tokenizer,
// end to end: an orchestrator (in this process, so that the test can name the
// model's tokenizer bundle: the model store's field is the import's to fill)
// and 2 real miner processes serving the 2 stages of a GPT whose vocabulary
// is a byte-level BPE's (test/helpers/hf-tokenizers.ts, ChatML template, eos
// <|im_end|>). The official `openai` client calls /v1/chat/completions and
// /v1/completions, streamed and not: the chat's tokens are the in-process
// Generator's on the chat template's prompt, cut into the same stages with
// f16 rows between them, decoded with the tokenizer and ended at its eos;
// completions take the prompt as token ids, with logprobs in OpenAI's shape
// and vLLM's `token_id:N`. Bad requests get OpenAI-shaped 400s.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { Engine } from '../../src/engine/engine.ts';
import { Generator } from '../../src/inference/generator.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { tokenizerFromBundle, type HfTokenizer, type TokenizerBundle } from '../../src/inference/tokenizer.ts';
import type { GptConfig } from '../../src/model/config.ts';
import { gptModelRef } from '../../src/model/model-ref.ts';
import { blobId } from '../../src/orchestrator/blobs/blobs.ts';
import { startOrchestrator, type RunningOrchestrator } from '../../src/orchestrator/server.ts';
import type { StageRange } from '../../src/model/parts.ts';
import { byteLevelBpe } from '../helpers/hf-tokenizers.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const TEXT = 'Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.';
const files = byteLevelBpe(TEXT, 100);
const bundle: TokenizerBundle = { 'tokenizer.json': files.tokenizerJson, 'tokenizer_config.json': files.tokenizerConfig, 'generation_config.json': {} };
const config: GptConfig = { vocabSize: 360, contextLength: 48, channels: 16, layers: 2, heads: 2, mlpRatio: 4 };
const checkpoint = wholeModelBytes(5, 300, config);
const sha256 = blobId(checkpoint);
const tokenizer: HfTokenizer = tokenizerFromBundle(bundle, config.vocabSize);
const cluster = new Cluster();
let orch: RunningOrchestrator;
let engine: Engine;
let openai: OpenAI;
let apiKey = '';
let cuts: StageRange[] = [];

before(async () => {
  engine = await Engine.create({ threads: 1 });
  orch = await startOrchestrator({ dataDir: join(cluster.dir, 'orch'), tokenizerBundle: (s) => (s === sha256 ? new TextEncoder().encode(JSON.stringify(bundle)) : null) });
  cluster.url = orch.url;
  const { state, blobs } = orch.coordinator;
  assert.equal(await blobs.put(checkpoint), sha256);
  const owner = '0x' + 'ab'.repeat(20);
  const { record } = state.models.claim({ sha256, owner, name: 'chat-micro', bytes: checkpoint.length, kind: 'gpt', model: gptModelRef(config), config, jobId: null, step: 300 }, Date.now());
  // a model stored without a tokenizer, for the byte tokenizer's refusal of chat
  const plain = wholeModelBytes(6, 300);
  const plainSha = await blobs.put(plain);
  const { record: plainRecord } = state.models.claim({ sha256: plainSha, owner, name: 'byte-micro', bytes: plain.length, kind: 'gpt', model: 'gpt-micro', config: { vocabSize: 256, contextLength: 16, channels: 16, layers: 2, heads: 2, mlpRatio: 4 }, jobId: null, step: 300 }, Date.now());
  await Promise.all(['a', 'b', 'c'].map((n) => cluster.startMiner(n, ['--serve', 'inference'])));
  const d = orch.coordinator.deployments.deploy({ model: record, owner, registry: null, stages: 2 });
  const p = orch.coordinator.deployments.deploy({ model: plainRecord, owner, registry: null, stages: 1 });
  for (const id of [d.id, p.id]) {
    const end = Date.now() + 60_000;
    while (state.deployments.get(id)?.status !== 'serving') {
      if (Date.now() > end) throw new Error(`deployment ${id} does not serve: ${JSON.stringify(state.deployments.get(id))}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  cuts = state.deployments.stages(d.id).map((s) => ({ from: s.fromPart, to: s.toPart }));
  apiKey = orch.billing.createKey(owner, 'chat-test').key;
  openai = new OpenAI({ baseURL: `${orch.url}/v1`, apiKey, maxRetries: 0 });
});

after(async () => {
  await orch?.close();
  await engine?.close();
  await cluster.stop();
});

/** The in-process reference: `maxTokens` tokens after `prompt` through the deployment's cut, f16 rows between the stages. */
function referenceTokens(prompt: number[], maxTokens: number, sampling: { temperature: number; topP?: number; seed: number }): number[] {
  const stages = cuts.map((range) => inferenceFromCheckpoint(engine, checkpoint, range, { maxSessions: 1 }));
  try {
    const g = new Generator(stages, { activations: 'f16' });
    g.add({ prompt, maxTokens, sampling });
    return g.runToEnd()[0].tokens;
  } finally {
    for (const s of stages) s.release();
  }
}

/** The reference's text: up to its first eos token, decoded as the server decodes (special tokens skipped). */
function referenceText(tokens: number[]): { text: string; count: number; finish: 'stop' | 'length' } {
  const eos = tokens.findIndex((t) => tokenizer.eosTokenIds.includes(t));
  const kept = eos < 0 ? tokens : tokens.slice(0, eos);
  return { text: tokenizer.text.decode(kept, true), count: eos < 0 ? tokens.length : eos + 1, finish: eos < 0 ? 'length' : 'stop' };
}

const messages = [
  { role: 'system' as const, content: 'You are a sailor.' },
  { role: 'user' as const, content: 'Call me Ishmael.' },
];

test('a chat completion with the openai client, streamed and not, is the reference generation on the chat template\'s prompt; usage counts the tokens', { timeout: 120_000 }, async () => {
  const prompt = tokenizer.chatPrompt(messages);
  assert.match(tokenizer.text.decode(prompt), /<\|im_start\|>assistant\n$/);
  for (const sampling of [{ temperature: 0, seed: 0 }, { temperature: 0.9, top_p: 0.95, seed: 7 }]) {
    const ref = referenceText(referenceTokens(prompt, 40, { temperature: sampling.temperature, topP: sampling.top_p, seed: sampling.seed }));
    const plain = await openai.chat.completions.create({ model: 'chat-micro', messages, max_tokens: 40, ...sampling });
    assert.equal(plain.object, 'chat.completion');
    assert.equal(plain.choices[0].message.role, 'assistant');
    assert.equal(plain.choices[0].message.content, ref.text, JSON.stringify(sampling));
    assert.equal(plain.choices[0].finish_reason, ref.finish);
    assert.deepEqual(plain.usage, { prompt_tokens: prompt.length, completion_tokens: ref.count, total_tokens: prompt.length + ref.count });

    const stream = await openai.chat.completions.create({ model: 'chat-micro', messages, max_completion_tokens: 40, stream: true, stream_options: { include_usage: true }, ...sampling });
    let text = '';
    let role: string | undefined;
    let finish: string | null = null;
    let usage: unknown = null;
    let chunks = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunks++ === 0) role = chunk.choices[0].delta.role;
      if (chunk.usage) usage = chunk.usage;
      const c = chunk.choices[0];
      if (!c) continue;
      text += c.delta.content ?? '';
      finish = c.finish_reason ?? finish;
    }
    assert.equal(role, 'assistant', 'the first chunk names the role');
    assert.equal(text, ref.text);
    assert.equal(finish, ref.finish);
    assert.deepEqual(usage, plain.usage, 'stream_options.include_usage: a last chunk with the usage');
  }
});

test('a completion with the prompt as token ids and logprobs: OpenAI\'s shape, vLLM\'s token_id:N; streamed, the same tokens', { timeout: 60_000 }, async () => {
  const prompt = tokenizer.encode('Call me Ishmael. Some years ago');
  const ref = referenceText(referenceTokens(prompt, 12, { temperature: 0, seed: 0 }));
  const out = await openai.completions.create({ model: 'chat-micro', prompt, max_tokens: 12, temperature: 0, logprobs: 3 });
  const choice = out.choices[0];
  assert.equal(choice.text, ref.text);
  const lp = choice.logprobs!;
  assert.equal(lp.tokens!.length, ref.count);
  assert.equal(lp.token_logprobs!.length, ref.count);
  for (let i = 0; i < ref.count; i++) {
    const top = lp.top_logprobs![i];
    const values = Object.values(top);
    assert.ok(values.length >= 1 && values.length <= 4, 'the 3 most likely and the sampled one');
    // greedy: the sampled token is the most likely one
    assert.equal(lp.token_logprobs![i], Math.max(...values));
    assert.ok(lp.token_logprobs![i] <= 0);
  }
  assert.equal(lp.text_offset![0], 0);
  const ids = await openai.completions.create({ model: 'chat-micro', prompt, max_tokens: 12, temperature: 0, logprobs: 0, return_tokens_as_token_ids: true } as OpenAI.CompletionCreateParamsNonStreaming);
  const idTokens = ids.choices[0].logprobs!.tokens!;
  assert.ok(idTokens.every((t) => /^token_id:\d+$/.test(t)), idTokens.join(' '));
  const sampled = idTokens.map((t) => Number(t.slice('token_id:'.length)));
  assert.equal(tokenizer.text.decode(sampled.filter((t) => !tokenizer.eosTokenIds.includes(t)), true), ref.text);
  assert.deepEqual(ids.choices[0].logprobs!.top_logprobs!.map((t) => Object.keys(t).length), sampled.map(() => 1), 'logprobs 0: the sampled token alone');

  const stream = await openai.completions.create({ model: 'chat-micro', prompt: tokenizer.text.decode(prompt), max_tokens: 12, temperature: 0, stream: true, logprobs: 1, stream_options: { include_usage: true } });
  let text = '';
  const tokens: string[] = [];
  let usage: OpenAI.CompletionUsage | undefined;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    text += c.text;
    tokens.push(...(c.logprobs?.tokens ?? []));
  }
  assert.equal(text, ref.text, 'a text prompt is encoded with the model\'s tokenizer');
  assert.equal(tokens.length, ref.count);
  assert.equal(usage?.completion_tokens, ref.count);
  assert.equal(usage?.prompt_tokens, prompt.length);
});

/** The OpenAI error of a call that must fail. */
async function refused(call: Promise<unknown>, status: number, code: RegExp): Promise<void> {
  await assert.rejects(call, (err: unknown) => {
    const e = err as { status?: number; code?: string; message?: string };
    assert.equal(e.status, status, e.message);
    assert.match(String(e.code), code, e.message);
    return true;
  });
}

test('bad requests get OpenAI-shaped 400s: token ids outside the vocabulary, oversized prompts, malformed messages, unknown roles, logprobs out of range, chat on a model with no template', { timeout: 60_000 }, async () => {
  await refused(openai.completions.create({ model: 'chat-micro', prompt: [1, 2, config.vocabSize] }), 400, /invalid_value/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: [1, -2] }), 400, /invalid_value/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: [1.5] }), 400, /invalid_value/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: new Array(16_385).fill(1) }), 400, /prompt_too_long/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: 'x'.repeat(20_000) }), 400, /prompt_too_long/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: 'x', logprobs: 6 }), 400, /invalid_value/);
  await refused(openai.completions.create({ model: 'chat-micro', prompt: 'x', logprobs: -1 }), 400, /invalid_value/);
  const chat = (body: Record<string, unknown>) => openai.chat.completions.create({ model: 'chat-micro', messages, ...body } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming);
  await refused(chat({ messages: [] }), 400, /invalid_value/);
  await refused(chat({ messages: [{ role: 'tool', content: 'x', tool_call_id: 'a' }] }), 400, /invalid_value/);
  await refused(chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, /invalid_value/);
  await refused(chat({ messages: [{ role: 'user', content: 42 }] }), 400, /invalid_value/);
  await refused(chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }] }), 400, /invalid_value/);
  await refused(chat({ messages: ['hello'] }), 400, /invalid_value/);
  await refused(chat({ messages: [{ role: 'user', content: 'x'.repeat(70_000) }] }), 400, /prompt_too_long/);
  await refused(chat({ messages: new Array(257).fill({ role: 'user', content: 'x' }) }), 400, /invalid_value/);
  await refused(chat({ max_tokens: 0 }), 400, /invalid_value/);
  await refused(chat({ temperature: 3 }), 400, /invalid_value/);
  await refused(chat({ model: 'byte-micro' }), 400, /no_chat_template/);
  await refused(chat({ model: 'nope' }), 404, /model_not_found/);
  await refused(new OpenAI({ baseURL: `${orch.url}/v1`, apiKey: `nk-${'0'.repeat(48)}`, maxRetries: 0 }).chat.completions.create({ model: 'chat-micro', messages }), 401, /invalid_api_key/);
  // text parts are served, joined
  const parts = await chat({ messages: [{ role: 'user', content: [{ type: 'text', text: 'Call me ' }, { type: 'text', text: 'Ishmael.' }] }], max_tokens: 4, temperature: 0 });
  const whole = await chat({ messages: [{ role: 'user', content: 'Call me Ishmael.' }], max_tokens: 4, temperature: 0 });
  assert.equal(parts.choices[0].message.content, whole.choices[0].message.content);
  // the byte-level GPT still serves completions as before
  const bytes = await openai.completions.create({ model: 'byte-micro', prompt: 'Call', max_tokens: 5, temperature: 0 });
  assert.equal(bytes.usage?.prompt_tokens, 4);
  assert.equal(bytes.usage?.completion_tokens, 5);
});

test('nbcli generate --chat: a conversation of --system, --message and --prompt, the same text as the openai client\'s', { timeout: 60_000 }, async () => {
  const conversation = [
    { role: 'system' as const, content: 'You are a sailor.' },
    { role: 'user' as const, content: 'Who are you?' },
    { role: 'assistant' as const, content: 'Ishmael.' },
    { role: 'user' as const, content: 'Call me Ishmael.' },
  ];
  const viaClient = await openai.chat.completions.create({ model: 'chat-micro', messages: conversation, max_tokens: 10, temperature: 0.8, seed: 3 });
  const home = join(cluster.dir, 'cli');
  const out = await cluster.nbcli(
    ['generate', '--chat', '--model', 'chat-micro', '--system', 'You are a sailor.', '--message', 'user:Who are you?', '--message', 'assistant:Ishmael.', '--prompt', 'Call me Ishmael.',
      '--max-tokens', '10', '--temperature', '0.8', '--seed', '3', '--api-key', apiKey, '--orchestrator', orch.url],
    home,
  );
  assert.equal(out.code, 0, out.stderr);
  const line = out.out.at(-1) as { text: string; finishReason: string; messages: unknown[] };
  assert.equal(line.text, viaClient.choices[0].message.content);
  assert.equal(line.finishReason, viaClient.choices[0].finish_reason);
  assert.deepEqual(line.messages, conversation);
  const wrong = await cluster.nbcli(['generate', '--chat', '--model', 'chat-micro', '--message', 'wizard:x', '--prompt', 'y', '--api-key', apiKey, '--orchestrator', orch.url], home);
  assert.notEqual(wrong.code, 0);
  assert.match(wrong.stderr, /--message must read ROLE:TEXT/);
  const plain = await cluster.nbcli(['generate', '--chat', '--model', 'byte-micro', '--prompt', 'y', '--api-key', apiKey, '--orchestrator', orch.url], home);
  assert.notEqual(plain.code, 0);
  assert.match(plain.stderr, /no chat template/);
});

test('the dashboard playground in chat mode: a system message and two turns, each answer the openai client\'s for the same conversation', { timeout: 90_000 }, async () => {
  const [{ default: chromium }, { default: pw }, { chromiumExecutablePath }] = await Promise.all([import('@sparticuz/chromium'), import('playwright-core'), import('../../src/engine/webgpu/chromium-unpack.ts')]);
  const browser = await pw.chromium.launch({ executablePath: await chromiumExecutablePath(chromium), args: chromium.args, headless: true });
  try {
    const page = await (await browser.newContext({ locale: 'en-US' })).newPage();
    await page.goto(`${orch.url}/#/playground`);
    await page.waitForFunction(() => [...document.querySelectorAll('#pg-model option')].some((o) => o.textContent === 'chat-micro'), null, { timeout: 30_000 });
    await page.selectOption('#pg-model', 'chat-micro');
    await page.selectOption('#pg-mode', 'chat');
    await page.fill('#pg-system', 'You are a sailor.');
    await page.fill('#pg-max-tokens', '8');
    await page.fill('#pg-temperature', '0.7');
    await page.fill('#pg-seed', '5');
    await page.fill('#pg-key', apiKey);
    const history: { role: 'system' | 'user' | 'assistant'; content: string }[] = [{ role: 'system', content: 'You are a sailor.' }];
    for (const say of ['Who are you?', 'Call me Ishmael.']) {
      history.push({ role: 'user', content: say });
      const expected = (await openai.chat.completions.create({ model: 'chat-micro', messages: history, max_tokens: 8, temperature: 0.7, seed: 5 })).choices[0].message.content ?? '';
      await page.fill('#pg-prompt', say);
      await page.evaluate(() => document.querySelector('#pg-output')?.removeAttribute('data-state'));
      await page.click('#pg-generate');
      await page.waitForFunction(() => document.querySelector('#pg-output')?.getAttribute('data-state') === 'done', null, { timeout: 60_000 });
      assert.equal(await page.textContent('#pg-output'), expected, say);
      history.push({ role: 'assistant', content: expected });
    }
    assert.equal(await page.locator('#pg-conversation .turn').count(), 4);
  } finally {
    await browser.close();
  }
});
