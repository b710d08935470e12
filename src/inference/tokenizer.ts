// The tokenizer a served model is spoken to with (docs/inference.md,
// "Tokenizers"): text to token ids, token ids back to text as they stream,
// each token's own text (logprobs), the tokens that end a generation, and the
// chat template when the model has one. Two kinds:
//
// - ByteTokenizer, the byte-level GPT's: a token is a byte of UTF-8, no eos,
//   no chat template (what the serving path always did);
// - HfTokenizer, over a Hugging Face tokenizer (src/model/hf/tokenizer.ts:
//   tokenizer.json, tokenizer_config.json, generation_config.json), from the
//   model store's tokenizer bundle (`tokenizerFromBundle`).
//
// Streamed output is handed on as UTF-8 bytes: the byte tokenizer's decoder
// passes each byte through (the client's UTF-8 decoder joins characters, as
// before), the Hugging Face one emits whole characters only.
import { NimbleError } from '../protocol/errors.ts';
import { TextTokenizer, type ChatMessage, type TokenizerBundle } from '../model/hf/tokenizer.ts';

export type { ChatMessage } from '../model/hf/tokenizer.ts';

/** Text of a token stream as it grows, as UTF-8 bytes ready to show. */
export interface TokenDecoder {
  /** the bytes token `id` completes (possibly none) */
  push(id: number): Uint8Array;
  /** what is left at the end */
  flush(): Uint8Array;
}

export interface ServingTokenizer {
  readonly kind: 'bytes' | 'hf';
  /** the model's vocabulary: every id the model takes is in [0, vocabSize) */
  readonly vocabSize: number;
  /** the tokens that end a generation (finish_reason 'stop'); empty: only max_tokens and stop strings end it */
  readonly eosTokenIds: readonly number[];
  /** whether chatPrompt can render a conversation */
  readonly hasChatTemplate: boolean;
  /** token ids of a completion prompt (never empty: an empty text gives the tokenizer's start token) */
  encode(text: string): number[];
  /** token ids of a conversation, rendered with the chat template (a 'no_chat_template' error when there is none) */
  chatPrompt(messages: readonly ChatMessage[]): number[];
  /** a decoder for one generation's stream */
  decoder(): TokenDecoder;
  /** the text of one token alone (logprobs' `tokens`) */
  tokenString(id: number): string;
}

const utf8 = new TextEncoder();

/** The byte-level GPT's tokenizer: UTF-8 bytes, 256 tokens, no eos, no chat template. */
export class ByteTokenizer implements ServingTokenizer {
  readonly kind = 'bytes';
  readonly vocabSize = 256;
  readonly eosTokenIds: readonly number[] = [];
  readonly hasChatTemplate = false;
  private readonly single = new TextDecoder();

  /** An empty prompt is a newline (the byte GPT needs a token to start from). */
  encode(text: string): number[] {
    const bytes = utf8.encode(text);
    return bytes.length ? Array.from(bytes) : [10];
  }

  chatPrompt(): number[] {
    throw new NimbleError('no_chat_template', 'this model is a byte-level GPT with no chat template: use /v1/completions');
  }

  decoder(): TokenDecoder {
    return { push: (id) => Uint8Array.of(id), flush: () => new Uint8Array(0) };
  }

  tokenString(id: number): string {
    return this.single.decode(Uint8Array.of(id));
  }
}

/** A Hugging Face tokenizer as the serving path uses it. */
export class HfTokenizer implements ServingTokenizer {
  readonly kind = 'hf';

  constructor(readonly text: TextTokenizer, readonly vocabSize: number) {}

  get eosTokenIds(): readonly number[] {
    return this.text.eosTokenIds;
  }

  get hasChatTemplate(): boolean {
    return this.text.chatTemplate !== null;
  }

  encode(text: string): number[] {
    const ids = this.text.encode(text);
    if (ids.length) return ids;
    // an empty prompt starts from the bos token, else the first eos
    const start = this.text.bosToken === null ? undefined : this.text.encode(this.text.bosToken, false)[0];
    return [start ?? this.text.eosTokenIds[0] ?? 0];
  }

  chatPrompt(messages: readonly ChatMessage[]): number[] {
    if (!this.hasChatTemplate) throw new NimbleError('no_chat_template', 'this model has no chat template (its tokenizer_config.json has no chat_template): use /v1/completions');
    const ids = this.text.encodeChat(messages);
    return ids.length ? ids : this.encode('');
  }

  decoder(): TokenDecoder {
    const d = this.text.incremental(true);
    return { push: (id) => utf8.encode(d.push(id)), flush: () => utf8.encode(d.flush()) };
  }

  tokenString(id: number): string {
    return this.text.decode([id], false);
  }
}

/** The one byte tokenizer (it holds no state). */
export const BYTE_TOKENIZER: ServingTokenizer = new ByteTokenizer();

/** A tokenizer bundle as the model store keeps it: one JSON object holding the three files. */
export type { TokenizerBundle };

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The tokenizer of a bundle (its bytes, JSON, or the object) for a model of
 * `vocabSize` rows; a 'corrupt' error when it is not one.
 */
export function tokenizerFromBundle(bundle: Uint8Array | string | TokenizerBundle, vocabSize: number): HfTokenizer {
  let v: unknown = bundle;
  if (typeof bundle === 'string' || bundle instanceof Uint8Array) {
    try {
      v = JSON.parse(typeof bundle === 'string' ? bundle : new TextDecoder().decode(bundle));
    } catch (err) {
      throw new NimbleError('corrupt', `the tokenizer bundle is not JSON: ${(err as Error).message}`);
    }
  }
  if (!isObject(v) || !isObject(v['tokenizer.json'])) throw new NimbleError('corrupt', 'the tokenizer bundle holds no "tokenizer.json" object');
  const config = v['tokenizer_config.json'] ?? {};
  const generation = v['generation_config.json'] ?? {};
  if (!isObject(config) || !isObject(generation)) throw new NimbleError('corrupt', 'the tokenizer bundle\'s "tokenizer_config.json" and "generation_config.json" must be objects');
  try {
    return new HfTokenizer(TextTokenizer.fromJson(v['tokenizer.json'], config, generation, vocabSize), vocabSize);
  } catch (err) {
    throw new NimbleError('corrupt', `the tokenizer bundle does not load: ${(err as Error).message}`);
  }
}
