// Small tokenizer.json files of the two kinds real models ship, made here
// (nothing is downloaded): a byte-level BPE as GPT-2, Llama 3 and Qwen2 have
// (GPT-2's byte-to-unicode alphabet, merges learned greedily from a text,
// special tokens as added tokens), and a SentencePiece-style BPE with byte
// fallback as Llama 2 and Mistral have (▁ for spaces, <0xNN> byte tokens).

/** GPT-2's map from bytes to printable characters (bytes_to_unicode). */
export function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const out: string[] = new Array(256);
  bs.forEach((b, i) => (out[b] = String.fromCodePoint(cs[i])));
  return out;
}

/** Greedy BPE merges over `words` (each a list of symbols): the `count` most frequent pairs, in order. */
function learnMerges(words: string[][], count: number): [string, string][] {
  const merges: [string, string][] = [];
  const ws = words.map((w) => [...w]);
  for (let m = 0; m < count; m++) {
    const freq = new Map<string, number>();
    for (const w of ws) for (let i = 0; i + 1 < w.length; i++) freq.set(w[i] + '\u0000' + w[i + 1], (freq.get(w[i] + '\u0000' + w[i + 1]) ?? 0) + 1);
    let best = '';
    let bestN = 1;
    for (const [k, n] of freq) if (n > bestN || (n === bestN && best !== '' && k < best)) [best, bestN] = [k, n];
    if (best === '') break;
    const [a, b] = best.split('\u0000');
    merges.push([a, b]);
    for (const w of ws) {
      for (let i = 0; i + 1 < w.length; i++) {
        if (w[i] === a && w[i + 1] === b) w.splice(i, 2, a + b);
      }
    }
  }
  return merges;
}

export interface TokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
}

const CHATML =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** A byte-level BPE (GPT-2 / Qwen2 style) learned from `text`, with ChatML special tokens. */
export function byteLevelBpe(text: string, merges = 200): TokenizerFiles {
  const b2u = bytesToUnicode();
  const enc = new TextEncoder();
  const pieces = text.match(/'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu) ?? [];
  const words = pieces.map((p) => [...enc.encode(p)].map((b) => b2u[b]));
  const learned = learnMerges(words, merges);
  const vocab: Record<string, number> = {};
  for (let b = 0; b < 256; b++) vocab[b2u[b]] = b;
  for (const [a, c] of learned) if (!(a + c in vocab)) vocab[a + c] = Object.keys(vocab).length;
  const specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  const base = Object.keys(vocab).length;
  return {
    tokenizerJson: {
      version: '1.0',
      added_tokens: specials.map((content, i) => ({ id: base + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
      normalizer: null,
      pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
      post_processor: null,
      decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab, merges: learned.map(([a, c]) => `${a} ${c}`) },
    },
    tokenizerConfig: { bos_token: null, eos_token: '<|im_end|>', pad_token: '<|endoftext|>', chat_template: CHATML, add_prefix_space: false },
  };
}

const LLAMA2_CHAT =
  "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}";

/** A SentencePiece-style BPE with byte fallback (Llama 2 / Mistral style) learned from `text`. */
export function sentencePieceBpe(text: string, merges = 200): TokenizerFiles {
  const words = text
    .replace(/ /g, '▁')
    .split(/(?=▁)/u)
    .map((w) => [...w]);
  const vocab: Record<string, number> = { '<unk>': 0, '<s>': 1, '</s>': 2 };
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = 3 + b;
  const chars = new Set(words.flat());
  for (const c of [...chars].sort()) if (!(c in vocab)) vocab[c] = Object.keys(vocab).length;
  const learned = learnMerges(words, merges);
  for (const [a, c] of learned) if (!(a + c in vocab)) vocab[a + c] = Object.keys(vocab).length;
  return {
    tokenizerJson: {
      version: '1.0',
      added_tokens: [
        { id: 0, content: '<unk>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        { id: 1, content: '<s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        { id: 2, content: '</s>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      ],
      normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
      pre_tokenizer: null,
      post_processor: {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } },
      },
      decoder: {
        type: 'Sequence',
        decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }],
      },
      model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges: learned.map(([a, c]) => `${a} ${c}`) },
    },
    tokenizerConfig: { bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>', add_bos_token: true, add_eos_token: false, legacy: false, chat_template: LLAMA2_CHAT },
  };
}
