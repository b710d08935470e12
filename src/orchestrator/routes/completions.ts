// The OpenAI-compatible subset (docs/inference.md, "Serve"): `POST
// /v1/completions` (model, prompt, max_tokens, temperature, top_p, seed, stop,
// stream: server-sent events) and `GET /v1/models` (the deployed models).
// The contracts are ../../api/completions.ts. A completion is paid with an
// API key (`Authorization: Bearer nk-…`, checked before the body is read):
// its most is reserved from the key's wallet before generating and what was
// processed is charged after, even when the client left
// (../serving/billing.ts, docs/inference.md "Payment").
// Answers, errors included, are in OpenAI's shape
// (`{ error: { message, type, param, code } }`), written straight to the
// socket so that the official `openai` client reads them as it reads
// OpenAI's; the rules are in ../completions.ts.
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import { Completion, CompletionBody, ModelList } from '../../api/completions.ts';
import type { HttpServer } from '../../http/server.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { type CompletionRequest, OpenAiError, parseCompletionRequest } from '../serving/completion-request.ts';
import { type CompletionResult, Completions, deploymentFor } from '../serving/completions.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { InferenceBilling } from '../serving/billing.ts';
import type { ApiKeyRecord } from '../state/api-keys.ts';
import type { DeploymentRecord } from '../state/deployments.ts';

const BODY_LIMIT = 1 << 20;

function writeJson(res: ServerResponse, status: number, value: unknown): void {
  const json = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
  res.end(json);
}

/** Any error as an OpenAI error (a 5xx says no more than "internal error" unless it is ours). */
function openAi(err: unknown): OpenAiError {
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

function fail(reply: FastifyReply, err: unknown): void {
  const e = openAi(err);
  if (!reply.sent) reply.hijack();
  if (!reply.raw.headersSent) writeJson(reply.raw, e.status, e.body());
  else reply.raw.end();
}

export function completionRoutes(app: HttpServer, c: Coordinator, completions = new Completions(c), billing = new InferenceBilling(c.state, null, null)): void {
  const errorHandler = (err: Error, _req: unknown, reply: FastifyReply): void => fail(reply, err);
  const keys = new WeakMap<object, ApiKeyRecord>();

  /** Generates for `key` with the request reserved before and charged after (what it processed, once). */
  const paidGenerate = async (
    key: ApiKeyRecord, d: DeploymentRecord, r: CompletionRequest, onBytes?: (bytes: Uint8Array) => void, aborted?: () => boolean, onId?: (id: string) => void,
  ): Promise<CompletionResult> => {
    const reservation = await billing.reserve(key, d, r);
    let id: string | null = null;
    let result: CompletionResult | null = null;
    try {
      result = await completions.generate(d, r, onBytes, aborted, (cid) => {
        id = cid;
        billing.track(reservation, cid);
        onId?.(cid);
      });
      return result;
    } finally {
      billing.settle(reservation, id, result);
    }
  };

  // a path under /v1 that is no route is answered as OpenAI answers one
  void app.register(
    async (v1) => {
      v1.setNotFoundHandler((req, reply) => {
        const path = req.url.split('?')[0];
        fail(reply, new OpenAiError(404, `no route ${req.method} ${path.length > 200 ? `${path.slice(0, 200)}…` : path}`, 'unknown_url'));
      });
    },
    { prefix: '/v1' },
  );

  app.get('/v1/models', { errorHandler, schema: { response: { 200: ModelList } } }, async (_req, reply) => {
    reply.hijack();
    writeJson(reply.raw, 200, {
      object: 'list',
      data: c.state.deployments.live().map((d) => ({ id: d.name, object: 'model', created: Math.floor(d.createdAt / 1000), owned_by: d.owner, sha256: d.sha256, status: d.status })),
    });
  });

  // the key before the body is read: a request without a valid one costs nothing to refuse
  const onRequest = async (req: { headers: { authorization?: string }; raw: object }): Promise<void> => {
    keys.set(req.raw, billing.authorize(req.headers.authorization));
  };
  app.post('/v1/completions', { bodyLimit: BODY_LIMIT, errorHandler, onRequest, schema: { body: CompletionBody, response: { 200: Completion } } }, async (req, reply) => {
    let r: CompletionRequest;
    try {
      const key = keys.get(req.raw) ?? billing.authorize(req.headers.authorization);
      r = parseCompletionRequest(req.body);
      const d = deploymentFor(c, r.model);
      const created = Math.floor(Date.now() / 1000);
      reply.hijack();
      const res = reply.raw;
      if (!r.stream) {
        const out = await paidGenerate(key, d, r);
        writeJson(res, 200, {
          id: out.id, object: 'text_completion', created, model: r.model,
          choices: [{ text: new TextDecoder().decode(out.bytes), index: 0, logprobs: null, finish_reason: out.finishReason }],
          usage: { prompt_tokens: out.promptTokens, completion_tokens: out.completionTokens, total_tokens: out.promptTokens + out.completionTokens },
        });
        return;
      }
      // streamed: the first chunk goes once the first token is known, so an error before it is still a plain 4xx/5xx answer
      let closed = false;
      res.on('close', () => (closed = true));
      const decoder = new TextDecoder();
      let id = '';
      const chunk = (text: string, finish: string | null): void => {
        if (!res.headersSent) res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
        res.write(`data: ${JSON.stringify({ id, object: 'text_completion', created, model: r.model, choices: [{ text, index: 0, logprobs: null, finish_reason: finish }] })}\n\n`);
      };
      try {
        const out = await paidGenerate(
          key, d, r,
          (bytes) => {
            const text = decoder.decode(bytes, { stream: true });
            if (text) chunk(text, null);
          },
          () => closed,
          (cid) => (id = cid),
        );
        chunk(decoder.decode(), out.finishReason);
        res.write('data: [DONE]\n\n');
        res.end();
      } catch (err) {
        if (!res.headersSent) throw err;
        // mid-stream: an error event (the openai client throws it), then the end
        if (!closed) res.end(`data: ${JSON.stringify(openAi(err).body())}\n\n`);
      }
    } catch (err) {
      fail(reply, err);
    }
  });
}
