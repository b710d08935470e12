// What the /v1 routes share (./completions.ts, ./chat.ts): answers and
// errors in OpenAI's shape written straight to the socket (so that the
// official `openai` client reads them as it reads OpenAI's), the server-sent
// event stream of chunks, the usage, and the paid generation both run.
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { Usage } from '../../api/completions.ts';
import type { TokenLogprob } from '../../inference/logprobs.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { InferenceBilling } from '../serving/billing.ts';
import { type CompletionRequest, OpenAiError } from '../serving/completion-request.ts';
import type { CompletionResult, Completions } from '../serving/completions.ts';
import type { ApiKeyRecord } from '../state/api-keys.ts';
import type { DeploymentRecord } from '../state/deployments.ts';

/** the most a /v1 body may hold */
export const BODY_LIMIT = 1 << 20;

export function writeJson(res: ServerResponse, status: number, value: unknown): void {
  const json = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}

/** Any error as an OpenAI error (a 5xx says no more than "internal error" unless it is ours). */
export function openAi(err: unknown): OpenAiError {
  if (err instanceof OpenAiError) return err;
  if (err instanceof NimbleError) return new OpenAiError(err.status, err.status >= 500 ? 'internal error' : err.message, err.code);
  const e = err as { statusCode?: number; message?: string; code?: string; validation?: { instancePath?: string; message?: string }[] };
  if (e.validation) {
    // a body that breaks the schema: name the field, as OpenAI does
    const first = e.validation[0];
    const param = first?.instancePath?.split('/')[1] || null;
    return new OpenAiError(400, `${param ?? 'the body'}: ${first?.message ?? 'does not match the schema'}`, 'invalid_value', param);
  }
  if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    return new OpenAiError(e.statusCode, e.statusCode === 413 ? `the body is over ${BODY_LIMIT} bytes` : (e.message ?? 'bad request'), e.statusCode === 413 ? 'too_large' : 'invalid_body');
  }
  return new OpenAiError(500, 'internal error', 'internal');
}

export function fail(reply: FastifyReply, err: unknown): void {
  const e = openAi(err);
  if (!reply.sent) reply.hijack();
  if (!reply.raw.headersSent) writeJson(reply.raw, e.status, e.body());
  else reply.raw.end();
}

/** The usage of a finished generation, in OpenAI's shape. */
export const usageOf = (out: CompletionResult): Usage => ({ prompt_tokens: out.promptTokens, completion_tokens: out.completionTokens, total_tokens: out.promptTokens + out.completionTokens });

/**
 * A server-sent event stream of /v1 chunks: headers sent with the first
 * chunk, `data: [DONE]` at the end, an error after the first chunk sent as an
 * error event (the openai client throws it), one before it thrown again so
 * that it is answered as a plain 4xx/5xx.
 */
export class EventStream {
  closed = false;
  constructor(private readonly res: ServerResponse) {
    res.on('close', () => (this.closed = true));
  }
  send(value: unknown): void {
    if (!this.res.headersSent) this.res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    this.res.write(`data: ${JSON.stringify(value)}\n\n`);
  }
  done(): void {
    this.res.write('data: [DONE]\n\n');
    this.res.end();
  }
  fail(err: unknown): void {
    if (!this.res.headersSent) throw err;
    if (!this.closed) this.res.end(`data: ${JSON.stringify(openAi(err).body())}\n\n`);
  }
}

export interface ServingRouteKit {
  completions: Completions;
  billing: InferenceBilling;
  keys: WeakMap<object, ApiKeyRecord>;
  errorHandler: (err: Error, req: unknown, reply: FastifyReply) => void;
  onRequest: (req: { headers: { authorization?: string }; raw: object }) => Promise<void>;
  fail: (reply: FastifyReply, err: unknown) => void;
  paidGenerate: PaidGenerate;
  writeJson: (res: ServerResponse, status: number, value: unknown) => void;
}

export type PaidGenerate = (
  key: ApiKeyRecord, d: DeploymentRecord, r: CompletionRequest, onBytes?: (bytes: Uint8Array, logprobs: TokenLogprob[]) => void, aborted?: () => boolean, onId?: (id: string) => void,
) => Promise<CompletionResult>;

