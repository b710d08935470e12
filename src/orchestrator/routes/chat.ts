// `POST /v1/chat/completions` (docs/inference.md, "Chat"): the messages
// rendered with the model's chat template (../serving/chat-request.ts), then
// generated, paid and streamed exactly as a completion is (./completions.ts:
// the same API key, reservation and charge per token, admission, batching and
// failover). The contract is ../../api/chat.ts.
import { ChatCompletion, ChatCompletionBody } from '../../api/chat.ts';
import type { HttpServer } from '../../http/server.ts';
import { parseChatRequest, withChatPrompt } from '../serving/chat-request.ts';
import { deploymentFor } from '../serving/completions.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { BODY_LIMIT, EventStream, usageOf, type ServingRouteKit } from './openai-answers.ts';

export function chatRoutes(app: HttpServer, c: Coordinator, kit: ServingRouteKit): void {
  const { completions, billing, keys, errorHandler, onRequest, fail, paidGenerate, writeJson } = kit;
  app.post('/v1/chat/completions', { bodyLimit: BODY_LIMIT, errorHandler, onRequest, schema: { body: ChatCompletionBody, response: { 200: ChatCompletion } } }, async (req, reply) => {
    try {
      const key = keys.get(req.raw) ?? billing.authorize(req.headers.authorization);
      const chat = parseChatRequest(req.body);
      const d = deploymentFor(c, chat.request.model);
      const r = withChatPrompt(chat, await completions.tokenizers.of(d), d.name);
      const created = Math.floor(Date.now() / 1000);
      reply.hijack();
      const res = reply.raw;
      const model = r.model;
      if (!r.stream) {
        const out = await paidGenerate(key, d, r);
        writeJson(res, 200, {
          id: chatId(out.id), object: 'chat.completion', created, model,
          choices: [{ index: 0, message: { role: 'assistant', content: new TextDecoder().decode(out.bytes) }, logprobs: null, finish_reason: out.finishReason }],
          usage: usageOf(out),
        });
        return;
      }
      const stream = new EventStream(res);
      const decoder = new TextDecoder();
      let id = '';
      const chunk = (delta: { role?: 'assistant'; content?: string }, finish: string | null): void =>
        stream.send({ id, object: 'chat.completion.chunk', created, model, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] });
      let started = false;
      /** the first chunk names the role, as OpenAI's does */
      const content = (text: string): void => {
        if (!started) chunk({ role: 'assistant', content: '' }, null);
        started = true;
        if (text) chunk({ content: text }, null);
      };
      try {
        const out = await paidGenerate(
          key, d, r,
          (bytes) => {
            const text = decoder.decode(bytes, { stream: true });
            if (text) content(text);
          },
          () => stream.closed,
          (cid) => (id = chatId(cid)),
        );
        content(decoder.decode());
        chunk({}, out.finishReason);
        if (r.includeUsage) stream.send({ id, object: 'chat.completion.chunk', created, model, choices: [], usage: usageOf(out) });
        stream.done();
      } catch (err) {
        stream.fail(err);
      }
    } catch (err) {
      fail(reply, err);
    }
  });
}

/** A chat completion's id: the generation's (`cmpl-…`, the session on the miners and in the billing log) as `chatcmpl-…`. */
const chatId = (id: string): string => `chat${id}`;
