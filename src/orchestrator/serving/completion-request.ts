// An OpenAI-style completion request on the orchestrator (docs/inference.md,
// "Serve"): the checks of a request body (model, prompt as text or token ids,
// max_tokens, temperature, top_p, seed, stop, stream, stream_options, n,
// logprobs, vLLM's return_tokens_as_token_ids) and the error in OpenAI's
// shape that every refusal is answered with. A text prompt is held as bytes
// (the byte tokenizer's ids) and as text, encoded again with the model's own
// tokenizer once the model is known (`withTokenizer`). The serving path is
// ./completions.ts.
import { MAX_COMPLETION_TOKENS, MAX_LOGPROBS, MAX_PROMPT_BYTES, MAX_PROMPT_TOKENS, MAX_STOP_BYTES, MAX_STOPS, MAX_TEMPERATURE, type OpenAiErrorBody } from '../../api/completions.ts';
import { stopSequences } from '../../inference/sampling.ts';
import type { ServingTokenizer } from '../../inference/tokenizer.ts';
import { NimbleError } from '../../protocol/errors.ts';

/** A checked request. */
export interface CompletionRequest {
  model: string;
  /** token ids (a text prompt: its UTF-8 bytes until `withTokenizer` encodes it with the model's tokenizer) */
  prompt: ArrayLike<number>;
  /** the prompt's text when it came as text (null: it came as token ids) */
  promptText?: string | null;
  /** top alternatives per token to report (0 … MAX_LOGPROBS), null: no logprobs */
  logprobs?: number | null;
  /** vLLM's return_tokens_as_token_ids: logprobs' tokens read `token_id:N` */
  tokenIdsInLogprobs?: boolean;
  /** stream_options.include_usage: a last chunk with the usage */
  includeUsage?: boolean;
  maxTokens: number;
  temperature: number;
  topP: number;
  seed: number;
  stop: Uint8Array[];
  stream: boolean;
}

/** An error in the OpenAI shape: `{ error: { message, type, param, code } }`. */
export class OpenAiError extends NimbleError {
  override readonly name = 'OpenAiError';
  constructor(
    status: number,
    message: string,
    code: string,
    readonly param: string | null = null,
    readonly type: string = status >= 500 ? 'server_error' : 'invalid_request_error',
  ) {
    super(code, message, status);
  }
  body(): OpenAiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

const bad = (param: string, message: string): OpenAiError => new OpenAiError(400, message, 'invalid_value', param);

/** Checks a request body; throws an OpenAiError naming the first problem. */
export function parseCompletionRequest(body: unknown): CompletionRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new OpenAiError(400, 'the body must be a JSON object', 'invalid_body');
  const b = body as Record<string, unknown>;
  const model = b.model;
  if (typeof model !== 'string' || model.length === 0 || model.length > 256) throw bad('model', 'model must be a string of 1 to 256 characters (a deployed model\'s name or sha256)');
  const { prompt, text: promptText } = promptOf(b.prompt);
  const num = (name: string, dflt: number): number => {
    const v = b[name];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(name, `${name} must be a number`);
    return v;
  };
  const maxTokens = num('max_tokens', 16);
  if (!(Number.isInteger(maxTokens) && maxTokens >= 1 && maxTokens <= MAX_COMPLETION_TOKENS)) throw bad('max_tokens', `max_tokens must be an integer in [1, ${MAX_COMPLETION_TOKENS}], got ${maxTokens}`);
  const temperature = num('temperature', 1);
  if (!(temperature >= 0 && temperature <= MAX_TEMPERATURE)) throw bad('temperature', `temperature must be in [0, ${MAX_TEMPERATURE}], got ${temperature}`);
  const topP = num('top_p', 1);
  if (!(topP > 0 && topP <= 1)) throw bad('top_p', `top_p must be in (0, 1], got ${topP}`);
  const seed = num('seed', 0);
  if (!Number.isSafeInteger(seed)) throw bad('seed', `seed must be an integer, got ${seed}`);
  const n = num('n', 1);
  if (n !== 1) throw bad('n', 'only n = 1 is served');
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== 'boolean') throw bad('stream', 'stream must be a boolean');
  let stops: unknown[] = [];
  if (typeof b.stop === 'string') stops = [b.stop];
  else if (Array.isArray(b.stop)) stops = b.stop;
  else if (b.stop !== undefined && b.stop !== null) throw bad('stop', 'stop must be a string or an array of strings');
  if (stops.length > MAX_STOPS) throw bad('stop', `at most ${MAX_STOPS} stop sequences`);
  for (const s of stops) {
    if (typeof s !== 'string' || s.length === 0 || !wellFormed(s)) throw bad('stop', 'each stop sequence must be a non-empty string of valid Unicode');
    if (new TextEncoder().encode(s).length > MAX_STOP_BYTES) throw bad('stop', `a stop sequence is at most ${MAX_STOP_BYTES} bytes of UTF-8`);
  }
  const logprobs = b.logprobs === undefined || b.logprobs === null || b.logprobs === false ? null : b.logprobs === true ? 0 : b.logprobs;
  if (logprobs !== null && !(Number.isInteger(logprobs) && (logprobs as number) >= 0 && (logprobs as number) <= MAX_LOGPROBS)) {
    throw bad('logprobs', `logprobs must be an integer in [0, ${MAX_LOGPROBS}] (the top alternatives reported per token), got ${JSON.stringify(logprobs)}`);
  }
  const asIds = b.return_tokens_as_token_ids;
  if (asIds !== undefined && asIds !== null && typeof asIds !== 'boolean') throw bad('return_tokens_as_token_ids', 'return_tokens_as_token_ids must be a boolean');
  return {
    model, prompt, promptText, maxTokens, temperature, topP, seed, stop: stopSequences(stops as string[]), stream: b.stream === true,
    logprobs: logprobs as number | null, tokenIdsInLogprobs: asIds === true, includeUsage: streamOptions(b.stream_options),
  };
}

/** stream_options: `{ include_usage?: boolean }` or nothing; whether a last chunk carries the usage. */
export function streamOptions(v: unknown): boolean {
  if (v === undefined || v === null) return false;
  if (typeof v !== 'object' || Array.isArray(v)) throw bad('stream_options', 'stream_options must be an object');
  const u = (v as Record<string, unknown>).include_usage;
  if (u !== undefined && u !== null && typeof u !== 'boolean') throw bad('stream_options', 'stream_options.include_usage must be a boolean');
  return u === true;
}

/**
 * The prompt: a string, an array of one string, an array of token ids, or an
 * array of one array of token ids. Text is held as its UTF-8 bytes (the byte
 * tokenizer's ids) and as text; ids are checked against the model's
 * vocabulary by `withTokenizer`.
 */
function promptOf(p: unknown): { prompt: ArrayLike<number>; text: string | null } {
  if (Array.isArray(p) && p.length === 1 && (typeof p[0] === 'string' || Array.isArray(p[0]))) p = p[0];
  if (typeof p === 'string') {
    if (!wellFormed(p)) throw bad('prompt', 'prompt is not valid Unicode (a lone surrogate)');
    if (p.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is over ${MAX_PROMPT_BYTES} bytes of UTF-8`, 'prompt_too_long', 'prompt');
    const bytes = new TextEncoder().encode(p);
    if (bytes.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is ${bytes.length} bytes of UTF-8, over ${MAX_PROMPT_BYTES}`, 'prompt_too_long', 'prompt');
    return { prompt: bytes, text: p };
  }
  if (Array.isArray(p)) {
    if (p.length > MAX_PROMPT_TOKENS) throw new OpenAiError(400, `prompt is ${p.length} tokens, over ${MAX_PROMPT_TOKENS}`, 'prompt_too_long', 'prompt');
    if (!p.every((t) => Number.isSafeInteger(t) && t >= 0)) throw bad('prompt', 'a prompt of tokens holds token ids: integers ≥ 0');
    return { prompt: (p as number[]).slice(), text: null };
  }
  throw bad('prompt', 'prompt must be a string, an array of one string, or an array of token ids');
}

/**
 * The request with its prompt in the model's tokens: a text prompt encoded
 * with `tokenizer`, token ids checked to be in its vocabulary.
 */
export function withTokenizer(r: CompletionRequest, tokenizer: ServingTokenizer): CompletionRequest {
  if (typeof r.promptText === 'string') return { ...r, prompt: tokenizer.encode(r.promptText) };
  const V = tokenizer.vocabSize;
  for (let i = 0; i < r.prompt.length; i++) {
    const t = r.prompt[i];
    if (!(Number.isInteger(t) && t >= 0 && t < V)) throw bad('prompt', `prompt token ${i} is ${t}, outside the model's vocabulary [0, ${V})`);
  }
  return r;
}

/** No lone surrogate (what TextEncoder would silently replace). */
function wellFormed(s: string): boolean {
  return !/\p{Cs}/u.test(s);
}
