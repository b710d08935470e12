// The OpenAI-compatible subset (docs/inference.md, "Serve"): `POST
// /v1/completions` (model, prompt as text or token ids, max_tokens,
// temperature, top_p, seed, stop, logprobs, stream: server-sent events),
// `POST /v1/chat/completions` (./chat.ts) and `GET /v1/models` (the deployed
// models). The contracts are ../../api/completions.ts and ../../api/chat.ts.
// A completion is paid with an API key (`Authorization: Bearer nk-…`, checked before the body is read):
// its most is reserved from the key's wallet before generating and what was
// processed is charged after, even when the client left
// (../serving/billing.ts, docs/inference.md "Payment").
// Answers, errors included, are in OpenAI's shape
// (`{ error: { message, type, param, code } }`), written straight to the
// socket so that the official `openai` client reads them as it reads
// OpenAI's (./openai-answers.ts).
import type { FastifyReply } from 'fastify';
import { Completion, CompletionBody, type Logprobs, ModelList } from '../../api/completions.ts';
import type { TokenLogprob } from '../../inference/logprobs.ts';
import type { ServingTokenizer } from '../../inference/tokenizer.ts';
import type { HttpServer } from '../../http/server.ts';
import { OpenAiError, parseCompletionRequest, withTokenizer } from '../serving/completion-request.ts';
import { chatRoutes } from './chat.ts';
import { type CompletionResult, Completions, deploymentFor } from '../serving/completions.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { InferenceBilling } from '../serving/billing.ts';
import type { ApiKeyRecord } from '../state/api-keys.ts';
import { BODY_LIMIT, EventStream, fail, type PaidGenerate, usageOf, writeJson } from './openai-answers.ts';

/** Logprobs of `list` in OpenAI's completions shape; text offsets from `offset` (a stream's chunks carry on from the last). */
export function openAiLogprobs(list: readonly TokenLogprob[], tokenizer: ServingTokenizer, asIds: boolean, offset: number): { logprobs: Logprobs; end: number } {
  const name = (id: number): string => (asIds ? `token_id:${id}` : tokenizer.tokenString(id));
  const out: Logprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const t of list) {
    const token = name(t.id);
    out.tokens.push(token);
    out.token_logprobs.push(t.logprob);
    const top: Record<string, number> = {};
    for (const a of t.top) top[name(a.id)] ??= a.logprob;
    top[token] ??= t.logprob;
    out.top_logprobs.push(top);
    out.text_offset.push(offset);
    // offsets count each token's text (its id's `token_id:N` form counts as the text it stands for)
    offset += (asIds ? tokenizer.tokenString(t.id) : token).length;
  }
  return { logprobs: out, end: offset };
}

export function completionRoutes(app: HttpServer, c: Coordinator, completions = new Completions(c), billing = new InferenceBilling(c.state, null, null)): void {
  const errorHandler = (err: Error, _req: unknown, reply: FastifyReply): void => fail(reply, err);
  const keys = new WeakMap<object, ApiKeyRecord>();

  /** Generates for `key` with the request reserved before and charged after (what it processed, once). */
  const paidGenerate: PaidGenerate = async (key, d, r, onBytes, aborted, onId) => {
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
    try {
      const key = keys.get(req.raw) ?? billing.authorize(req.headers.authorization);
      const parsed = parseCompletionRequest(req.body);
      const d = deploymentFor(c, parsed.model);
      const tokenizer = await completions.tokenizers.of(d);
      const r = withTokenizer(parsed, tokenizer);
      const created = Math.floor(Date.now() / 1000);
      let offset = 0;
      /** the logprobs of `list` (null: not asked for), their text offsets carrying on from the last call's */
      const logprobsOf = (list: TokenLogprob[] | null | undefined): Logprobs | null => {
        if (r.logprobs === null || r.logprobs === undefined) return null;
        const out = openAiLogprobs(list ?? [], tokenizer, r.tokenIdsInLogprobs === true, offset);
        offset = out.end;
        return out.logprobs;
      };
      reply.hijack();
      const res = reply.raw;
      if (!r.stream) {
        const out = await paidGenerate(key, d, r);
        writeJson(res, 200, {
          id: out.id, object: 'text_completion', created, model: r.model,
          choices: [{ text: new TextDecoder().decode(out.bytes), index: 0, logprobs: logprobsOf(out.logprobs), finish_reason: out.finishReason }],
          usage: usageOf(out),
        });
        return;
      }
      // streamed: the first chunk goes once the first token is known, so an error before it is still a plain 4xx/5xx answer
      const stream = new EventStream(res);
      const decoder = new TextDecoder();
      let id = '';
      const chunk = (text: string, logprobs: Logprobs | null, finish: string | null): void =>
        stream.send({ id, object: 'text_completion', created, model: r.model, choices: [{ text, index: 0, logprobs, finish_reason: finish }] });
      try {
        const out = await paidGenerate(
          key, d, r,
          (bytes, lps) => {
            const text = decoder.decode(bytes, { stream: true });
            const logprobs = logprobsOf(lps);
            if (text || logprobs) chunk(text, logprobs, null);
          },
          () => stream.closed,
          (cid) => (id = cid),
        );
        chunk(decoder.decode(), null, out.finishReason);
        if (r.includeUsage) stream.send({ id, object: 'text_completion', created, model: r.model, choices: [], usage: usageOf(out) });
        stream.done();
      } catch (err) {
        stream.fail(err);
      }
    } catch (err) {
      fail(reply, err);
    }
  });

  chatRoutes(app, c, { completions, billing, keys, errorHandler, onRequest, fail, paidGenerate, writeJson });
}
