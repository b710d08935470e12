// A client of the OpenAI-compatible `POST /v1/completions`
// (./completions.ts): streams a completion's text as server-sent events
// arrive, checking each chunk against the contract, and turns an error answer
// (OpenAI's shape) into a NimbleError that says what the orchestrator said.
// What `nbcli generate` and `nbcli up` use; any OpenAI client works too.
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { NimbleError } from '../protocol/errors.ts';
import { ChatCompletionChunk, type ChatCompletionBody } from './chat.ts';
import { Completion, type CompletionBody, OpenAiErrorBody } from './completions.ts';
import { readEvents } from './event-stream.ts';

const checkChunk = TypeCompiler.Compile(Completion);
const checkChatChunk = TypeCompiler.Compile(ChatCompletionChunk);
const checkError = TypeCompiler.Compile(OpenAiErrorBody);

export interface StreamedCompletion {
  id: string;
  text: string;
  finishReason: 'stop' | 'length' | null;
  chunks: number;
}

export interface CompletionClientOptions {
  /** `Authorization: Bearer …` when set */
  apiKey?: string;
  /** abort when no byte arrives for this long (default 120 s) */
  idleTimeoutMs?: number;
}

/** What an orchestrator's error answer (or event) means, as a NimbleError of the same status. */
function answerError(status: number, body: unknown, raw: string): NimbleError {
  if (checkError.Check(body)) return new NimbleError(body.error.code, `the orchestrator refused the completion: ${body.error.message}`, status);
  return new NimbleError('unreachable', `the orchestrator answered HTTP ${status}: ${raw.slice(0, 200)}`, status >= 400 ? status : 502);
}

function parseJson(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}

/** Streams a completion from `baseUrl` (the orchestrator), calling `onText` with each piece of text as it arrives. */
export function streamCompletion(baseUrl: string, body: CompletionBody, onText: (text: string) => void, options: CompletionClientOptions = {}): Promise<StreamedCompletion> {
  return streamChunks(baseUrl, '/v1/completions', body, (v) => {
    if (!checkChunk.Check(v)) return null;
    const c = v.choices[0];
    return { id: v.id, text: c?.text ?? '', finish: c?.finish_reason ?? null };
  }, onText, options);
}

/** Streams a chat completion (POST /v1/chat/completions) from `baseUrl`, calling `onText` with each piece of the assistant's text. */
export function streamChatCompletion(baseUrl: string, body: ChatCompletionBody, onText: (text: string) => void, options: CompletionClientOptions = {}): Promise<StreamedCompletion> {
  return streamChunks(baseUrl, '/v1/chat/completions', body, (v) => {
    if (!checkChatChunk.Check(v)) return null;
    const c = v.choices[0];
    return { id: v.id, text: c?.delta.content ?? '', finish: c?.finish_reason ?? null };
  }, onText, options);
}

/** A chunk's id, text and finish reason; null when it is not a chunk of the contract. */
type ReadChunk = (v: unknown) => { id: string; text: string; finish: 'stop' | 'length' | null } | null;

async function streamChunks(
  baseUrl: string, path: string, body: object, read: ReadChunk, onText: (text: string) => void, options: CompletionClientOptions,
): Promise<StreamedCompletion> {
  const controller = new AbortController();
  const idleMs = options.idleTimeoutMs ?? 120_000;
  let timer = setTimeout(() => controller.abort(), idleMs);
  const touch = (): void => {
    clearTimeout(timer);
    timer = setTimeout(() => controller.abort(), idleMs);
  };
  const headers: Record<string, string> = { 'content-type': 'application/json', accept: 'text/event-stream' };
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  try {
    let res: Response;
    try {
      res = await fetch(new URL(path, baseUrl), { method: 'POST', headers, body: JSON.stringify({ ...body, stream: true }), signal: controller.signal });
    } catch (err) {
      throw new NimbleError('unreachable', `cannot reach the orchestrator at ${baseUrl}: ${(err as Error).message}`);
    }
    if (!res.ok || !(res.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
      const raw = await res.text();
      throw answerError(res.ok ? 502 : res.status, parseJson(raw), raw);
    }
    const out: StreamedCompletion = { id: '', text: '', finishReason: null, chunks: 0 };
    let done = false;
    for await (const e of readEvents(res)) {
      touch();
      if (e.data === '[DONE]') {
        done = true;
        break;
      }
      const v = parseJson(e.data);
      if (checkError.Check(v)) throw answerError(502, v, e.data);
      const chunk = read(v);
      if (!chunk) throw new NimbleError('corrupt', `the orchestrator sent a chunk that is not a completion's: ${e.data.slice(0, 200)}`);
      out.id = chunk.id;
      out.chunks++;
      if (chunk.text) {
        out.text += chunk.text;
        onText(chunk.text);
      }
      out.finishReason = chunk.finish ?? out.finishReason;
    }
    if (!done) throw new NimbleError('unreachable', 'the completion stream ended before [DONE]');
    return out;
  } catch (err) {
    if (controller.signal.aborted) throw new NimbleError('unreachable', `no byte of the completion for ${idleMs / 1000} s`);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}
