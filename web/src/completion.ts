// The playground's client of the orchestrator's POST /v1/completions and POST
// /v1/chat/completions: streams a completion as its server-sent events arrive (read with
// src/api/event-stream.ts, as the CLI's client reads them), the API key the
// user typed sent in the Authorization header only (never in a URL, never
// stored, no cookie sent), and an error answer in OpenAI's shape turned into
// its message.
import { readEvents } from '../../src/api/event-stream.ts';

export interface PlaygroundRequest {
  model: string;
  prompt: string;
  max_tokens: number;
  temperature: number;
  seed: number;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export interface PlaygroundChatRequest {
  model: string;
  messages: ChatMessage[];
  max_tokens: number;
  temperature: number;
  seed: number;
}

export interface Streamed {
  text: string;
  finishReason: string | null;
  /** chunks received (about one per token) */
  chunks: number;
}

export class CompletionError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

/** The message of an OpenAI-shaped error body, or null. */
function errorMessage(v: unknown): string | null {
  if (!v || typeof v !== 'object' || !('error' in v)) return null;
  const e = (v as { error: unknown }).error;
  return e && typeof e === 'object' && typeof (e as { message?: unknown }).message === 'string' ? (e as { message: string }).message : 'the orchestrator sent an error';
}

/** Streams the completion of `r`, calling `onText` with each piece of text as it arrives. */
export function streamCompletion(r: PlaygroundRequest, apiKey: string, onText: (text: string) => void, signal: AbortSignal): Promise<Streamed> {
  return streamFrom('/v1/completions', r, (choice) => (choice as { text?: unknown }).text, apiKey, onText, signal);
}

/** Streams the assistant's answer to `r`'s conversation (the model's chat template), calling `onText` with each piece. */
export function streamChat(r: PlaygroundChatRequest, apiKey: string, onText: (text: string) => void, signal: AbortSignal): Promise<Streamed> {
  return streamFrom('/v1/chat/completions', r, (choice) => {
    const delta = (choice as { delta?: { content?: unknown } }).delta;
    return delta && typeof delta === 'object' ? (delta.content ?? '') : undefined;
  }, apiKey, onText, signal);
}

async function streamFrom(path: string, r: object, textOf: (choice: object) => unknown, apiKey: string, onText: (text: string) => void, signal: AbortSignal): Promise<Streamed> {
  const res = await fetch(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ ...r, stream: true }),
    credentials: 'omit',
    signal,
  });
  if (!res.ok || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    const body: unknown = await res.json().catch(() => null);
    throw new CompletionError(res.status, errorMessage(body) ?? `the orchestrator answered HTTP ${res.status}`);
  }
  const out: Streamed = { text: '', finishReason: null, chunks: 0 };
  for await (const e of readEvents(res)) {
    if (e.data === '[DONE]') return out;
    let v: unknown;
    try {
      v = JSON.parse(e.data);
    } catch {
      throw new CompletionError(502, 'the orchestrator sent a chunk that is not JSON');
    }
    const err = errorMessage(v);
    if (err !== null) throw new CompletionError(502, err);
    const choice = (v as { choices?: { finish_reason?: unknown }[] }).choices?.[0];
    const text = choice ? textOf(choice) : undefined;
    if (!choice || typeof text !== 'string') throw new CompletionError(502, 'the orchestrator sent a chunk that is not a completion');
    out.chunks++;
    out.text += text;
    if (text) onText(text);
    if (typeof choice.finish_reason === 'string') out.finishReason = choice.finish_reason;
  }
  throw new CompletionError(502, 'the stream ended before [DONE]');
}
