// Generation with continuous batching: greedy output is the recompute path's
// argmax token by token; a session's tokens do not depend on who shares its
// batch, on when it joined, or on how the model is cut into stages; stop
// sequences, max tokens and the context window's restart; the text API from a
// checkpoint file.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { encodeStage } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { partCount, splitEvenly } from '../../src/model/parts.ts';
import { Generator, type GenerationRequest } from '../../src/inference/generator.ts';
import { generateCached, generateFromStage } from '../../src/inference/generate.ts';
import { inferenceFromCheckpoint, inferenceFromStage } from '../../src/inference/load.ts';
import { argmax } from '../../src/inference/sampling.ts';

let engine: Engine;
let model: GptStage;
const config = gptConfig('gpt-micro');
before(async () => {
  engine = await Engine.create({ threads: 2 });
  model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 4 });
});
after(async () => {
  model.release();
  await engine.close();
});

const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);

/** Greedy tokens by the recompute path (the whole window through GptStage.forward per token), without passing the context. */
function recomputeGreedy(prompt: Uint8Array, n: number): number[] {
  const seq = Array.from(prompt);
  const out: number[] = [];
  const V = config.vocabSize;
  for (let i = 0; i < n; i++) {
    const logits = model.forward(Int32Array.from(seq), 1, seq.length) as Float32Array;
    const next = argmax(logits.subarray((seq.length - 1) * V));
    out.push(next);
    seq.push(next);
  }
  return out;
}

function alone(request: GenerationRequest): number[] {
  const inf = inferenceFromStage(engine, model);
  const g = new Generator([inf]);
  g.add(request);
  const [result] = g.runToEnd();
  inf.release();
  return result.tokens;
}

test('greedy generation is the recompute path\'s argmax, token by token', () => {
  const prompt = bytes('Call me ');
  const n = config.contextLength - prompt.length + 1; // the last token is sampled from a full window
  assert.deepEqual(alone({ prompt, maxTokens: n, sampling: { temperature: 0 } }), recomputeGreedy(prompt, n));
});

test('a session\'s tokens do not depend on its batch, on when it joined, or on the stage cut', () => {
  const requests: GenerationRequest[] = Array.from({ length: 8 }, (_, i) => ({
    prompt: bytes(['a', 'Call me Ishmael', 'whale', 'x', 'The sea, the sea', 'Ahab', '', 'Queequeg!'][i]),
    maxTokens: 10 + 4 * i,
    sampling: { temperature: 0.8, topP: 0.95, seed: 100 + i },
  }));
  const want = requests.map(alone);
  // all at once, on a stage with room for 3: the rest join as others finish
  const inf = inferenceFromStage(engine, model, { maxSessions: 3 });
  const g = new Generator([inf]);
  const ids = requests.map((r) => g.add(r));
  let maxActive = 0;
  const done = new Map<string, number[]>();
  while (g.load.active || g.load.waiting) {
    for (const r of g.step().finished) done.set(r.id, r.tokens);
    maxActive = Math.max(maxActive, g.load.active);
  }
  assert.equal(maxActive, 3);
  ids.forEach((id, i) => assert.deepEqual(done.get(id), want[i], `request ${i}`));
  inf.release();
  // the model in 2 stages and in 3
  for (const cut of [2, 3]) {
    const stages = splitEvenly(config, cut).map((r) => inferenceFromCheckpoint(engine, encodeStage(model), r));
    const chain = new Generator(stages);
    const chainIds = requests.map((r) => chain.add(r));
    const results = new Map(chain.runToEnd().map((r) => [r.id, r.tokens]));
    chainIds.forEach((id, i) => assert.deepEqual(results.get(id), want[i], `${cut} stages, request ${i}`));
    for (const s of stages) s.release();
  }
});

test('stop sequences and max tokens end a generation; the window restarts past the context', () => {
  const prompt = bytes('Call me Ishmael.');
  const inf = inferenceFromStage(engine, model);
  const run = (request: GenerationRequest, keep?: number) => {
    const g = new Generator([inf], { keep });
    g.add(request);
    return g.runToEnd()[0];
  };
  const free = run({ prompt, maxTokens: 40, sampling: { temperature: 0.7, seed: 1 } });
  assert.equal(free.finishReason, 'length');
  assert.equal(free.tokens.length, 40);
  // 16 prompt tokens fill the context of 16: every 8 tokens the window restarts from the last 8
  assert.equal(free.windowRestarts, 5);
  const stop = Uint8Array.from(free.tokens.slice(5, 7));
  const cut = free.tokens.findIndex((_, i) => i >= 1 && free.tokens[i - 1] === stop[0] && free.tokens[i] === stop[1]) - 1;
  const stopped = run({ prompt, maxTokens: 40, sampling: { temperature: 0.7, seed: 1 }, stop: [stop, 'never'] });
  assert.equal(stopped.finishReason, 'stop');
  assert.deepEqual(stopped.tokens, free.tokens.slice(0, cut));
  assert.equal(stopped.sampledTokens, cut + 2);
  // the window after a restart is the last `keep` tokens: its first token is the recompute's argmax over them
  const g = run({ prompt: bytes('abcdefghijklmnopqrstuvwxyz'), maxTokens: 1, sampling: { temperature: 0 } }, 5);
  assert.equal(g.windowRestarts, 0, 'a long prompt starts from its last tokens without a restart');
  assert.deepEqual(g.tokens, recomputeGreedy(bytes('vwxyz'), 1));
  assert.throws(() => new Generator([inf], { keep: 17 }), /keep must be an integer in \[1, 16\]/);
  assert.throws(() => new Generator([inf]).add({ prompt, maxTokens: 0 }), /maxTokens/);
  assert.throws(() => new Generator([inf]).add({ prompt: [300], maxTokens: 1 }), /outside the vocabulary/);
  const [r0] = splitEvenly(config, 2);
  const first = inferenceFromCheckpoint(engine, encodeStage(model), r0);
  assert.throws(() => new Generator([first]), new RegExp(`cover parts \\[0, ${r0.to}\\) of 4`));
  first.release();
  inf.release();
});

test('generateCached from a checkpoint file gives what the model in memory gives', () => {
  const options = { maxTokens: 30, temperature: 0.8, seed: 3 };
  const a = generateCached(engine, encodeStage(model), 'Call me Ishmael. ', options);
  const b = generateFromStage(engine, model, 'Call me Ishmael. ', options);
  assert.deepEqual(a, b);
  assert.equal(a.bytes.length, 30);
  assert.equal(a.promptTokens, 17);
  assert.equal(typeof a.text, 'string');
  assert.throws(() => generateCached(engine, new Uint8Array(10), 'x', options));
});
