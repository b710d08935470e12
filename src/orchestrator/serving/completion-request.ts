// An OpenAI-style completion request on the orchestrator (docs/inference.md,
// "Serve"): the checks of a request body (model, prompt as bytes, max_tokens,
// temperature, top_p, seed, stop, stream, n) and the error in OpenAI's shape
// that every refusal is answered with. The serving path is ./completions.ts.
import { MAX_COMPLETION_TOKENS, MAX_PROMPT_BYTES, MAX_STOP_BYTES, MAX_STOPS, MAX_TEMPERATURE, type OpenAiErrorBody } from '../../api/completions.ts';
import { stopSequences } from '../../inference/sampling.ts';
import { NimbleError } from '../../protocol/errors.ts';

/** A checked request. */
export interface CompletionRequest {
  model: string;
  prompt: Uint8Array;
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
  const prompt = promptBytes(b.prompt);
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
  return { model, prompt, maxTokens, temperature, topP, seed, stop: stopSequences(stops as string[]), stream: b.stream === true };
}

/** The prompt as bytes (the tokenizer is bytes): a string (UTF-8), an array of one string, or an array of byte tokens. */
function promptBytes(p: unknown): Uint8Array {
  if (Array.isArray(p) && p.length === 1 && typeof p[0] === 'string') p = p[0];
  let bytes: Uint8Array;
  if (typeof p === 'string') {
    if (!wellFormed(p)) throw bad('prompt', 'prompt is not valid Unicode (a lone surrogate)');
    if (p.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is over ${MAX_PROMPT_BYTES} bytes of UTF-8`, 'prompt_too_long', 'prompt');
    bytes = new TextEncoder().encode(p);
  } else if (Array.isArray(p)) {
    if (p.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is over ${MAX_PROMPT_BYTES} tokens`, 'prompt_too_long', 'prompt');
    if (!p.every((t) => Number.isInteger(t) && t >= 0 && t <= 255)) throw bad('prompt', 'a prompt of tokens holds byte values (integers in [0, 255]): the tokenizer is bytes');
    bytes = Uint8Array.from(p as number[]);
  } else throw bad('prompt', 'prompt must be a string, an array of one string, or an array of byte tokens');
  if (bytes.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is ${bytes.length} bytes of UTF-8, over ${MAX_PROMPT_BYTES}`, 'prompt_too_long', 'prompt');
  return bytes;
}

/** No lone surrogate (what TextEncoder would silently replace). */
function wellFormed(s: string): boolean {
  return !/\p{Cs}/u.test(s);
}
