// An OpenAI chat completion request on the orchestrator (docs/inference.md,
// "Chat"): the messages checked (roles system, user and assistant; text
// content; bounded), and the sampling fields checked as a completion's
// (./completion-request.ts). The prompt is the messages rendered with the
// model's chat template, once the model is known (`withChatPrompt`).
import { CHAT_ROLES, MAX_CHAT_BYTES, MAX_CHAT_MESSAGES } from '../../api/chat.ts';
import { MAX_PROMPT_TOKENS } from '../../api/completions.ts';
import type { ChatMessage, ServingTokenizer } from '../../inference/tokenizer.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { type CompletionRequest, OpenAiError, parseCompletionRequest } from './completion-request.ts';

export interface ChatRequest {
  /** the sampling and stream fields; its prompt is empty until withChatPrompt */
  request: CompletionRequest;
  messages: ChatMessage[];
}

const bad = (param: string, message: string): OpenAiError => new OpenAiError(400, message, 'invalid_value', param);
const ROLES: ReadonlySet<string> = new Set(CHAT_ROLES);

/** Checks a chat request body; throws an OpenAiError naming the first problem. */
export function parseChatRequest(body: unknown): ChatRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new OpenAiError(400, 'the body must be a JSON object', 'invalid_body');
  const b = body as Record<string, unknown>;
  const messages = parseMessages(b.messages);
  if (b.logprobs === true) throw bad('logprobs', 'logprobs are not served on /v1/chat/completions: ask /v1/completions with the prompt as token ids');
  if (b.tools !== undefined && b.tools !== null) throw bad('tools', 'tools are not served');
  const maxTokens = b.max_completion_tokens ?? b.max_tokens;
  // the sampling fields are a completion's; the prompt comes from the messages
  const { messages: _m, max_completion_tokens: _c, logprobs: _l, top_logprobs: _t, ...rest } = b;
  const request = parseCompletionRequest({ ...rest, prompt: [], max_tokens: maxTokens, return_tokens_as_token_ids: null });
  return { request: { ...request, promptText: null }, messages };
}

function parseMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw bad('messages', 'messages must be a non-empty array of {role, content}');
  if (v.length > MAX_CHAT_MESSAGES) throw bad('messages', `at most ${MAX_CHAT_MESSAGES} messages`);
  let bytes = 0;
  return v.map((m, i) => {
    const param = `messages[${i}]`;
    if (typeof m !== 'object' || m === null || Array.isArray(m)) throw bad(param, `${param} must be an object {role, content}`);
    const { role, content } = m as Record<string, unknown>;
    if (typeof role !== 'string' || !ROLES.has(role)) throw bad(`${param}.role`, `${param}.role must be one of ${CHAT_ROLES.join(', ')}, got ${JSON.stringify(role)?.slice(0, 40)}`);
    const text = contentText(content, `${param}.content`);
    if (/\p{Cs}/u.test(text)) throw bad(`${param}.content`, `${param}.content is not valid Unicode (a lone surrogate)`);
    bytes += Buffer.byteLength(text, 'utf8');
    if (bytes > MAX_CHAT_BYTES) throw new OpenAiError(400, `the messages hold over ${MAX_CHAT_BYTES} bytes of UTF-8`, 'prompt_too_long', 'messages');
    return { role: role as ChatMessage['role'], content: text };
  });
}

/** A message's text: a string, null (an empty assistant turn), or text parts joined. */
function contentText(c: unknown, param: string): string {
  if (typeof c === 'string') return c;
  if (c === null || c === undefined) return '';
  if (Array.isArray(c)) {
    return c
      .map((p, j) => {
        const part = p as Record<string, unknown> | null;
        if (typeof part !== 'object' || part === null || part.type !== 'text' || typeof part.text !== 'string') throw bad(`${param}[${j}]`, `${param}[${j}] must be a text part {type: 'text', text}: only text is served`);
        return part.text;
      })
      .join('');
  }
  throw bad(param, `${param} must be a string or an array of text parts`);
}

/** The request with its prompt: the messages rendered with the model's chat template (a 400 when it has none). */
export function withChatPrompt(chat: ChatRequest, tokenizer: ServingTokenizer, model: string): CompletionRequest {
  if (!tokenizer.hasChatTemplate) throw new OpenAiError(400, `model '${model}' has no chat template (a byte-level GPT, or a tokenizer_config.json without chat_template): use /v1/completions`, 'no_chat_template', 'model');
  let prompt: number[];
  try {
    prompt = tokenizer.chatPrompt(chat.messages);
  } catch (err) {
    if (err instanceof NimbleError) throw new OpenAiError(400, `the chat template of model '${model}' refused the messages: ${err.message}`.slice(0, 600), 'invalid_value', 'messages');
    throw err;
  }
  if (prompt.length > MAX_PROMPT_TOKENS) throw new OpenAiError(400, `the messages are ${prompt.length} tokens, over ${MAX_PROMPT_TOKENS}`, 'prompt_too_long', 'messages');
  return { ...chat.request, prompt };
}
