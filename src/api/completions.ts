// The OpenAI-compatible subset's contracts (docs/inference.md, "Serve"): the
// body of `POST /v1/completions`, its answers (a completion, or a stream of
// chunks of the same shape), `GET /v1/models`, and OpenAI's error shape. The
// schema holds the types and ranges; the orchestrator's parse
// (src/orchestrator/serving/completions.ts) adds what a schema cannot say (valid
// Unicode, UTF-8 lengths). Other OpenAI fields (`user`, `logprobs`, …) are
// accepted and ignored, as clients send them.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

/** Limits of a request. */
export const MAX_PROMPT_BYTES = 16_384;
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
    /** text (UTF-8 bytes are the tokens), one text in an array, or byte tokens */
    prompt: Type.Union([
      Type.String(),
      Type.Array(Type.String(), { minItems: 1, maxItems: 1 }),
      Type.Array(Type.Integer({ minimum: 0, maximum: 255 }), { maxItems: MAX_PROMPT_BYTES * 4 }),
    ]),
    max_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_COMPLETION_TOKENS }))),
    temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: MAX_TEMPERATURE }))),
    top_p: Type.Optional(Nullable(Type.Number({ exclusiveMinimum: 0, maximum: 1 }))),
    seed: Type.Optional(Nullable(Type.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER }))),
    n: Type.Optional(Nullable(Type.Literal(1))),
    stream: Type.Optional(Nullable(Type.Boolean())),
    stop: Type.Optional(Nullable(Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { maxItems: MAX_STOPS })]))),
  },
  { additionalProperties: true },
);
export type CompletionBody = Static<typeof CompletionBody>;

const Choice = Type.Object({
  text: Type.String(),
  index: Type.Literal(0),
  logprobs: Type.Null(),
  finish_reason: Nullable(Type.Union([Type.Literal('stop'), Type.Literal('length')])),
});

/** A completion; a streamed one sends chunks of this shape (without usage) as server-sent events, then `[DONE]`. */
export const Completion = Type.Object({
  id: Type.String(),
  object: Type.Literal('text_completion'),
  created: Count,
  model: Type.String(),
  choices: Type.Array(Choice, { minItems: 1, maxItems: 1 }),
  usage: Type.Optional(Type.Object({ prompt_tokens: Count, completion_tokens: Count, total_tokens: Count })),
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
