// A model's tokenizer and chat template, from its Hugging Face folder:
// `tokenizer.json` (byte-level BPE as GPT-2, Llama 3 and Qwen2 have, or
// SentencePiece-style BPE with byte fallback as Llama 2 and Mistral have,
// added and special tokens included) run by `@huggingface/tokenizers`;
// `tokenizer_config.json` (special tokens, the chat template) and
// `generation_config.json` (the tokens that end a generation). Chat
// templates are rendered with `@huggingface/jinja`, as transformers renders
// them. Streamed text goes through an IncrementalDecoder, which never emits
// half a UTF-8 character.
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { ModelFolderError } from './decoder-config.ts';
import { readFolderJson } from './model-folder.ts';

/** A model's tokenizer files, as one JSON object (the `tokenizer` metadata of an imported model's file: ./convert.ts). */
export interface TokenizerBundle {
  'tokenizer.json': Record<string, unknown>;
  'tokenizer_config.json'?: Record<string, unknown>;
  'generation_config.json'?: Record<string, unknown>;
}

export interface ChatMessage {
  readonly role: 'system' | 'user' | 'assistant';
  readonly content: string;
}

type Json = Record<string, unknown>;

/** A special token's text: tokenizer_config holds it as a string or as an AddedToken object. */
function tokenText(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (typeof v === 'object' && v !== null && typeof (v as Json).content === 'string') return (v as Json).content as string;
  return null;
}

/** The default chat template of tokenizer_config (a string, or a list of named templates). */
function chatTemplateOf(config: Json): string | null {
  const t = config.chat_template;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const named = t.find((x) => typeof x === 'object' && x !== null && (x as Json).name === 'default');
    if (named && typeof (named as Json).template === 'string') return (named as Json).template as string;
  }
  return null;
}

const ids = (v: unknown): number[] => (typeof v === 'number' ? [v] : Array.isArray(v) ? v.filter((x): x is number => Number.isInteger(x)) : []);

export class TextTokenizer {
  private readonly template: Template | null;

  private constructor(
    private readonly tokenizer: Tokenizer,
    private readonly config: Json,
    /** the chat template's source, or null when the model has none */
    readonly chatTemplate: string | null,
    /** the tokens that end a generation */
    readonly eosTokenIds: readonly number[],
    readonly bosToken: string | null,
    readonly eosToken: string | null,
    /** the largest token id + 1 */
    readonly size: number,
  ) {
    try {
      this.template = chatTemplate === null ? null : new Template(chatTemplate);
    } catch (err) {
      throw new ModelFolderError(`tokenizer_config.json: the chat template does not parse: ${(err as Error).message}`);
    }
  }

  /**
   * Loads a folder's tokenizer. Its vocabulary must fit the model's
   * `vocabSize` (a model may have more rows than tokens: padding rows).
   */
  static fromFolder(dir: string, vocabSize: number): TextTokenizer {
    const json = readFolderJson(dir, 'tokenizer.json', false);
    const config = (readFolderJson(dir, 'tokenizer_config.json', true) ?? {}) as Json;
    const generation = (readFolderJson(dir, 'generation_config.json', true) ?? {}) as Json;
    return TextTokenizer.fromJson(json, config, generation, vocabSize);
  }

  static fromJson(json: unknown, config: Json, generation: Json, vocabSize: number): TextTokenizer {
    if (typeof json !== 'object' || json === null || typeof (json as Json).model !== 'object') throw new ModelFolderError('tokenizer.json: no model section');
    let tokenizer: Tokenizer;
    try {
      tokenizer = new Tokenizer(json, config);
    } catch (err) {
      throw new ModelFolderError(`tokenizer.json: cannot be loaded: ${(err as Error).message}`);
    }
    let size = 0;
    for (const id of tokenizer.get_vocab(true).values()) size = Math.max(size, id + 1);
    if (size > vocabSize) throw new ModelFolderError(`tokenizer.json: token ids go up to ${size - 1}, past the model's vocab_size ${vocabSize}`);
    const eosToken = tokenText(config.eos_token);
    const eos = new Set(ids(generation.eos_token_id));
    if (eosToken !== null) {
      const id = tokenizer.token_to_id(eosToken);
      if (id !== undefined) eos.add(id);
    }
    for (const id of eos) if (id < 0 || id >= vocabSize) throw new ModelFolderError(`eos token id ${id} is outside the vocabulary (${vocabSize})`);
    return new TextTokenizer(tokenizer, config, chatTemplateOf(config), [...eos].sort((a, b) => a - b), tokenText(config.bos_token), eosToken, size);
  }

  /** Token ids of `text`; with special tokens (a bos the tokenizer adds) unless told otherwise. */
  encode(text: string, addSpecialTokens = true): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  decode(tokenIds: readonly number[], skipSpecialTokens = false): string {
    if (tokenIds.length === 0) return '';
    return this.tokenizer.decode([...tokenIds], { skip_special_tokens: skipSpecialTokens });
  }

  /** The text of one token id as the vocabulary has it (for logprobs), or null when it is no token. */
  tokenString(id: number): string | null {
    return this.tokenizer.id_to_token(id) ?? null;
  }

  /**
   * The prompt of a conversation, rendered with the model's chat template
   * (the template adds the bos token itself when it wants one, so the prompt
   * is encoded without special tokens).
   */
  renderChat(messages: readonly ChatMessage[], addGenerationPrompt = true): string {
    if (!this.template) throw new ModelFolderError('this model has no chat template (tokenizer_config.json chat_template): use /v1/completions');
    try {
      return this.template.render({
        messages,
        add_generation_prompt: addGenerationPrompt,
        bos_token: this.bosToken ?? '',
        eos_token: this.eosToken ?? '',
        pad_token: tokenText(this.config.pad_token) ?? '',
        unk_token: tokenText(this.config.unk_token) ?? '',
      });
    } catch (err) {
      throw new ModelFolderError(`the chat template failed: ${(err as Error).message}`);
    }
  }

  /** The token ids of a conversation's prompt. */
  encodeChat(messages: readonly ChatMessage[]): number[] {
    return this.encode(this.renderChat(messages), false);
  }

  incremental(skipSpecialTokens = true): IncrementalDecoder {
    return new IncrementalDecoder((t) => this.decode(t, skipSpecialTokens));
  }
}

const REPLACEMENT = '\uFFFD';

/**
 * Text of a token stream as it grows, as vLLM's detokenizer does it: the
 * tokens since a settled prefix are decoded together (a token's bytes may
 * need the next token's to make a character), and text is emitted only when
 * it does not end in a replacement character, so a character split over two
 * tokens comes out whole, once.
 */
export class IncrementalDecoder {
  private tokens: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(private readonly decode: (ids: number[]) => string) {}

  /** The new text `id` completes (possibly empty). */
  push(id: number): string {
    this.tokens.push(id);
    const prefix = this.decode(this.tokens.slice(this.prefixOffset, this.readOffset));
    const text = this.decode(this.tokens.slice(this.prefixOffset));
    if (text.length > prefix.length && !text.endsWith(REPLACEMENT)) {
      const out = text.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.tokens.length;
      return out;
    }
    return '';
  }

  /** What is left at the end of the stream (an incomplete character comes out as U+FFFD). */
  flush(): string {
    const prefix = this.decode(this.tokens.slice(this.prefixOffset, this.readOffset));
    const text = this.decode(this.tokens.slice(this.prefixOffset));
    this.prefixOffset = this.readOffset = this.tokens.length;
    return text.slice(prefix.length);
  }
}
