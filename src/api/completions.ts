// The OpenAI-compatible subset's contracts (docs/inference.md, "Serve"): the
// body of `POST /v1/completions`, its answers (a completion, or a stream of
// chunks of the same shape), `GET /v1/models`, and OpenAI's error shape. The
// schema holds the types and ranges; the orchestrator's parse
// (src/orchestrator/serving/completion-request.ts) adds what a schema cannot
// say (valid Unicode, UTF-8 lengths, token ids in the model's vocabulary).
// Other OpenAI fields (`user`, …) are accepted and ignored, as clients send
// them. The chat contract is ./chat.ts.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

/** Limits of a request. */
export const MAX_PROMPT_BYTES = 16_384;
/** token ids of a prompt given as ids */
export const MAX_PROMPT_TOKENS = 16_384;
/** top alternatives per token `logprobs` may ask for */
export const MAX_LOGPROBS = 5;
export const MAX_COMPLETION_TOKENS = 4_096;
export const MAX_STOPS = 4;
export const MAX_STOP_BYTES = 64;
export const MAX_TEMPERATURE = 2;

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });

/** `POST /v1/completions`. */
export const CompletionBody = Type.Object(
  {
    /** a deployed model's name or sha256 */
    model: Type.String({ minLength: 1, maxLength: 256 }),
    /** text (encoded with the model's tokenizer), one text in an array, or token ids (one array of them in an array) */
    prompt: Type.Union([
      Type.String(),
      Type.Array(Type.String(), { minItems: 1, maxItems: 1 }),
      Type.Array(Type.Integer({ minimum: 0 }), { maxItems: MAX_PROMPT_TOKENS * 4 }),
      Type.Array(Type.Array(Type.Integer({ minimum: 0 }), { maxItems: MAX_PROMPT_TOKENS * 4 }), { minItems: 1, maxItems: 1 }),
    ]),
    max_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_COMPLETION_TOKENS }))),
    temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: MAX_TEMPERATURE }))),
    top_p: Type.Optional(Nullable(Type.Number({ exclusiveMinimum: 0, maximum: 1 }))),
    seed: Type.Optional(Nullable(Type.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER }))),
    n: Type.Optional(Nullable(Type.Literal(1))),
    stream: Type.Optional(Nullable(Type.Boolean())),
    stop: Type.Optional(Nullable(Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { maxItems: MAX_STOPS })]))),
    stream_options: Type.Optional(Nullable(Type.Object({ include_usage: Type.Optional(Nullable(Type.Boolean())) }, { additionalProperties: true }))),
    /** the top alternatives to report per token, 0 … MAX_LOGPROBS */
    logprobs: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: MAX_LOGPROBS }))),
    /** vLLM's extension: logprobs' tokens read `token_id:N` */
    return_tokens_as_token_ids: Type.Optional(Nullable(Type.Boolean())),
  },
  { additionalProperties: true },
);
export type CompletionBody = Static<typeof CompletionBody>;

/**
 * Logprobs of a completion's tokens, in OpenAI's shape: each token's text
 * (`token_id:N` with return_tokens_as_token_ids), its log-probability under
 * the model (the raw logits' log-softmax, before temperature and top_p), the
 * `logprobs` most likely tokens and the sampled one, and where each token's
 * text starts in the completion's text (UTF-16 units).
 */
export const Logprobs = Type.Object({
  tokens: Type.Array(Type.String()),
  token_logprobs: Type.Array(Type.Number()),
  top_logprobs: Type.Array(Type.Record(Type.String(), Type.Number())),
  text_offset: Type.Array(Count),
});
export type Logprobs = Static<typeof Logprobs>;

const Choice = Type.Object({
  text: Type.String(),
  index: Type.Literal(0),
  logprobs: Nullable(Logprobs),
  finish_reason: Nullable(Type.Union([Type.Literal('stop'), Type.Literal('length')])),
});

export const Usage = Type.Object({ prompt_tokens: Count, completion_tokens: Count, total_tokens: Count });
export type Usage = Static<typeof Usage>;

/** A completion; a streamed one sends chunks of this shape (without usage) as server-sent events, then `[DONE]`. */
export const Completion = Type.Object({
  id: Type.String(),
  object: Type.Literal('text_completion'),
  created: Count,
  model: Type.String(),
  /** one choice; none in the last chunk of a stream with stream_options.include_usage, which carries the usage */
  choices: Type.Array(Choice, { maxItems: 1 }),
  usage: Type.Optional(Nullable(Usage)),
});
export type Completion = Static<typeof Completion>;

/** `GET /v1/models`: the live deployments. */
export const ModelList = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(
    Type.Object({ id: Type.String(), object: Type.Literal('model'), created: Count, owned_by: Type.String(), sha256: Type.String(), status: Type.String() }),
  ),
});
export type ModelList = Static<typeof ModelList>;

/** Every error of the /v1 routes, as OpenAI writes them. */
export const OpenAiErrorBody = Type.Object({
  error: Type.Object({ message: Type.String(), type: Type.String(), param: Nullable(Type.String()), code: Type.String() }),
});
export type OpenAiErrorBody = Static<typeof OpenAiErrorBody>;
