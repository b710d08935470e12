// OpenAI's chat contract as the orchestrator serves it (docs/inference.md,
// "Chat"): the body of `POST /v1/chat/completions`, a chat completion, and
// the `chat.completion.chunk` events of a streamed one. The checks a schema
// cannot say (valid Unicode, lengths in bytes, the roles served) are the
// orchestrator's (src/orchestrator/serving/chat-request.ts); the prompt is the
// messages rendered with the model's chat template.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { MAX_COMPLETION_TOKENS, MAX_STOPS, MAX_TEMPERATURE, Usage } from './completions.ts';

/** Messages of a conversation at most, and the UTF-8 bytes of their contents together. */
export const MAX_CHAT_MESSAGES = 256;
export const MAX_CHAT_BYTES = 65_536;
/** The roles a message may have. */
export const CHAT_ROLES = ['system', 'user', 'assistant'] as const;

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });

/** A message's content: text, or parts of which only text parts are served. */
const Content = Type.Union([Type.String(), Type.Array(Type.Object({ type: Type.String(), text: Type.Optional(Type.String()) }, { additionalProperties: true }), { maxItems: 64 })]);

export const ChatMessageBody = Type.Object(
  { role: Type.String(), content: Nullable(Content), name: Type.Optional(Type.String({ maxLength: 64 })) },
  { additionalProperties: true },
);

/** `POST /v1/chat/completions`. */
export const ChatCompletionBody = Type.Object(
  {
    /** a deployed model's name or sha256 */
    model: Type.String({ minLength: 1, maxLength: 256 }),
    messages: Type.Array(ChatMessageBody, { minItems: 1, maxItems: MAX_CHAT_MESSAGES }),
    /** max_completion_tokens (OpenAI's newer name) wins over max_tokens */
    max_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_COMPLETION_TOKENS }))),
    max_completion_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_COMPLETION_TOKENS }))),
    temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: MAX_TEMPERATURE }))),
    top_p: Type.Optional(Nullable(Type.Number({ exclusiveMinimum: 0, maximum: 1 }))),
    seed: Type.Optional(Nullable(Type.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER }))),
    n: Type.Optional(Nullable(Type.Literal(1))),
    stream: Type.Optional(Nullable(Type.Boolean())),
    stream_options: Type.Optional(Nullable(Type.Object({ include_usage: Type.Optional(Nullable(Type.Boolean())) }, { additionalProperties: true }))),
    stop: Type.Optional(Nullable(Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { maxItems: MAX_STOPS })]))),
  },
  { additionalProperties: true },
);
export type ChatCompletionBody = Static<typeof ChatCompletionBody>;

const FinishReason = Nullable(Type.Union([Type.Literal('stop'), Type.Literal('length')]));

/** A chat completion. */
export const ChatCompletion = Type.Object({
  id: Type.String(),
  object: Type.Literal('chat.completion'),
  created: Count,
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Literal(0),
      message: Type.Object({ role: Type.Literal('assistant'), content: Type.String() }),
      logprobs: Type.Null(),
      finish_reason: FinishReason,
    }),
    { minItems: 1, maxItems: 1 },
  ),
  usage: Usage,
});
export type ChatCompletion = Static<typeof ChatCompletion>;

/**
 * One event of a streamed chat completion: the first carries the role, the
 * next ones content, the last of them the finish reason; with
 * stream_options.include_usage a last chunk with no choice carries the usage.
 * Then `data: [DONE]`.
 */
export const ChatCompletionChunk = Type.Object({
  id: Type.String(),
  object: Type.Literal('chat.completion.chunk'),
  created: Count,
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Literal(0),
      delta: Type.Object({ role: Type.Optional(Type.Literal('assistant')), content: Type.Optional(Type.String()) }),
      logprobs: Type.Null(),
      finish_reason: FinishReason,
    }),
    { maxItems: 1 },
  ),
  usage: Type.Optional(Nullable(Usage)),
});
export type ChatCompletionChunk = Static<typeof ChatCompletionChunk>;
