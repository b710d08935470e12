// The in-process reference of a chat completion served through miners: the
// model file run in the test's own process, cut into the deployment's stages
// with f16 rows between them (what the orchestrator sends between miners),
// the folder's chat template and eos tokens; and the same conversation asked
// of a network with the official `openai` client, streamed. A test on real
// processes compares the two token for token (test/network/hf-models.test.ts,
// test/network/up-models.test.ts).
import { readFileSync } from 'node:fs';
import type OpenAI from 'openai';
import type { DeploymentView } from '../../src/api/deployments.ts';
import { Engine } from '../../src/engine/engine.ts';
import { Generator } from '../../src/inference/generator.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import { HfTokenizer } from '../../src/inference/tokenizer.ts';
import { TextTokenizer } from '../../src/model/hf/tokenizer.ts';
import type { StageRange } from '../../src/model/parts.ts';

export interface ChatMessageInput {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** The conversation both tests ask. */
export const SAILOR_CHAT: ChatMessageInput[] = [
  { role: 'system', content: 'You are a sailor.' },
  { role: 'user', content: 'Call me Ishmael.' },
];

export interface ChatSampling {
  maxTokens: number;
  temperature: number;
  topP: number;
  seed: number;
}

export interface ChatReference {
  /** the rendered chat template's token ids */
  prompt: number[];
  /** every generated token, the eos included when one came */
  tokens: number[];
  /** where the first eos token is (-1: none, the generation ran to maxTokens) */
  eos: number;
  /** the text before the eos */
  expected: string;
  /** what the API's finish_reason must be */
  finishReason: 'stop' | 'length';
  /** what usage.completion_tokens must be */
  completionTokens: number;
}

/** The stage cuts of a deployment, as its view lists them. */
export function cutsOf(d: DeploymentView): StageRange[] {
  return d.stages.map((s) => ({ from: s.parts[0], to: s.parts[1] }));
}

/** Generates the chat completion in this process from the model file `file` (made from `folder`), cut at `cuts`. */
export async function chatReference(file: string, folder: string, vocabSize: number, cuts: StageRange[], messages: ChatMessageInput[], s: ChatSampling): Promise<ChatReference> {
  const bytes = new Uint8Array(readFileSync(file));
  const tokenizer = new HfTokenizer(TextTokenizer.fromFolder(folder, vocabSize), vocabSize);
  const prompt = tokenizer.chatPrompt(messages);
  const engine = await Engine.create({ threads: 1 });
  let tokens: number[];
  try {
    const stages = cuts.map((range) => inferenceFromCheckpoint(engine, bytes, range, { maxSessions: 1 }));
    const g = new Generator(stages, { activations: 'f16' });
    g.add({ prompt, maxTokens: s.maxTokens, sampling: { temperature: s.temperature, topP: s.topP, seed: s.seed } });
    tokens = g.runToEnd()[0].tokens;
    for (const stage of stages) stage.release();
  } finally {
    await engine.close();
  }
  const eos = tokens.findIndex((t) => tokenizer.eosTokenIds.includes(t));
  const expected = tokenizer.text.decode(eos < 0 ? tokens : tokens.slice(0, eos), true);
  return { prompt, tokens, eos, expected, finishReason: eos < 0 ? 'length' : 'stop', completionTokens: eos < 0 ? tokens.length : eos + 1 };
}

export interface StreamedChat {
  text: string;
  finishReason: string | null;
  usage: { completion_tokens: number; prompt_tokens: number } | null;
  chunks: number;
}

/** Asks `model` for the chat completion with the openai client, streamed with usage, and gathers it. */
export async function streamChat(openai: OpenAI, model: string, messages: ChatMessageInput[], s: ChatSampling): Promise<StreamedChat> {
  const stream = await openai.chat.completions.create({
    model, messages, max_tokens: s.maxTokens, temperature: s.temperature, top_p: s.topP, seed: s.seed, stream: true, stream_options: { include_usage: true },
  });
  const out: StreamedChat = { text: '', finishReason: null, usage: null, chunks: 0 };
  for await (const chunk of stream) {
    out.chunks++;
    out.text += chunk.choices[0]?.delta.content ?? '';
    out.finishReason = chunk.choices[0]?.finish_reason ?? out.finishReason;
    if (chunk.usage) out.usage = chunk.usage;
  }
  return out;
}
