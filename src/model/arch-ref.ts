// The inline model reference of a decoder with an arch (./arch.ts): every
// field of its config in one canonical string, so that a run, an assignment
// or a deployment names a Llama, Qwen2 or GPT-2 model as it names the byte
// GPT (`gpt:v…`, ./model-ref.ts):
//
//   llama:v32000.t2048.c2048.l22.h32.k4.d64.i5632.e0.00001.r10000.b000.w0
//   qwen2:v151936.t32768.c896.l24.h14.k2.d64.i4864.e0.000001.r1000000.b100.w1
//   gpt2:v50257.t1024.c768.l12.h12.k12.d64.i3072.e0.00001.b111.w1
//
// v vocabulary, t context, c channels, l layers, h query heads, k key/value
// heads, d head width, i MLP width, e norm eps, r rope theta (rotary
// families), then `s` rope scaling when there is one (`slinear-F`,
// `sllama3-F-LOW-HIGH-ORIGINAL`), b the q/k/v, output and MLP bias flags, w
// a tied head (1) or not (0). The family fixes the norm, the positions and
// the MLP. Numbers are written as JavaScript writes them (String(n)); any
// other spelling is refused, so that one model has one reference.
import { byteGptArch, validateArch, type DecoderArch } from './arch.ts';
import type { GptConfig } from './config.ts';

export const ARCH_FAMILIES = ['llama', 'qwen2', 'gpt2'] as const;
export type ArchFamily = (typeof ARCH_FAMILIES)[number];

const INT = /^[1-9][0-9]{0,7}$/;
const NUM = /^[0-9][0-9.e+-]{0,23}$/;

/** The reference's text of a config with an arch. */
export function archModelRef(c: GptConfig): string {
  const a = c.arch;
  if (!a) throw new Error('archModelRef: the config has no arch');
  const fields = [`v${c.vocabSize}`, `t${c.contextLength}`, `c${c.channels}`, `l${c.layers}`, `h${c.heads}`, `k${a.kvHeads}`, `d${a.headDim}`, `i${a.intermediateSize}`, `e${a.normEps}`];
  if (a.position === 'rope') fields.push(`r${a.ropeTheta}`);
  const s = a.ropeScaling;
  if (s?.kind === 'linear') fields.push(`slinear-${s.factor}`);
  if (s?.kind === 'llama3') fields.push(`sllama3-${s.factor}-${s.lowFreqFactor}-${s.highFreqFactor}-${s.originalContextLength}`);
  fields.push(`b${+a.qkvBias}${+a.attnOutBias}${+a.mlpBias}`, `w${+a.tiedEmbeddings}`);
  return `${a.family}:${fields.join('.')}`;
}

/** Whether a reference is of the inline arch form (its family prefix). */
export function isArchRef(ref: string): boolean {
  return ARCH_FAMILIES.some((f) => ref.startsWith(f + ':'));
}

/** Parses the inline arch form; throws an Error naming the problem (./model-ref.ts wraps it). */
export function parseArchRef(ref: string): GptConfig {
  const colon = ref.indexOf(':');
  const family = ref.slice(0, colon) as ArchFamily;
  if (!ARCH_FAMILIES.includes(family)) throw new Error(`unknown family '${family.slice(0, 16)}'`);
  const fields = ref.slice(colon + 1).split('.');
  // a float such as 0.00001 holds dots of its own: put each back onto its field
  const joined: string[] = [];
  for (const f of fields) {
    if (joined.length > 0 && /^[0-9]/.test(f)) joined[joined.length - 1] += '.' + f;
    else joined.push(f);
  }
  const take = (letter: string, optional = false): string | null => {
    const f = joined[0];
    if (f === undefined || !f.startsWith(letter)) {
      if (optional) return null;
      throw new Error(`field '${letter}' is missing where ${f === undefined ? 'the reference ends' : `'${f.slice(0, 16)}' is`}`);
    }
    joined.shift();
    return f.slice(letter.length);
  };
  const int = (letter: string): number => {
    const t = take(letter)!;
    if (!INT.test(t)) throw new Error(`${letter} '${t.slice(0, 16)}' is not a positive integer (decimal, no leading zero)`);
    return Number(t);
  };
  const num = (text: string, what: string): number => {
    const n = Number(text);
    if (!NUM.test(text) || !Number.isFinite(n) || n <= 0 || String(n) !== text) throw new Error(`${what} '${text.slice(0, 24)}' is not a positive number as String(n) writes it`);
    return n;
  };
  const vocabSize = int('v'), contextLength = int('t'), channels = int('c'), layers = int('l'), heads = int('h');
  const kvHeads = int('k'), headDim = int('d'), intermediateSize = int('i');
  const normEps = num(take('e')!, 'e');
  const rope = family !== 'gpt2';
  const ropeTheta = rope ? num(take('r')!, 'r') : 10000;
  let ropeScaling: DecoderArch['ropeScaling'] = null;
  const s = take('s', true);
  if (s !== null) {
    const [kind, ...args] = s.split('-');
    if (!rope) throw new Error('a gpt2 model has no rope scaling');
    if (kind === 'linear' && args.length === 1) ropeScaling = { kind: 'linear', factor: num(args[0], 'the scaling factor') };
    else if (kind === 'llama3' && args.length === 4) {
      const original = args[3];
      if (!INT.test(original)) throw new Error(`the original context '${original.slice(0, 16)}' is not a positive integer`);
      ropeScaling = { kind: 'llama3', factor: num(args[0], 'the scaling factor'), lowFreqFactor: num(args[1], 'low_freq_factor'), highFreqFactor: num(args[2], 'high_freq_factor'), originalContextLength: Number(original) };
    } else throw new Error(`rope scaling '${s.slice(0, 24)}' is not slinear-F or sllama3-F-LOW-HIGH-ORIGINAL`);
  }
  const b = take('b')!;
  if (!/^[01]{3}$/.test(b)) throw new Error(`b '${b.slice(0, 8)}' is not three bias flags (0 or 1)`);
  const w = take('w')!;
  if (w !== '0' && w !== '1') throw new Error(`w '${w.slice(0, 8)}' is not 0 or 1`);
  if (joined.length > 0) throw new Error(`'${joined[0].slice(0, 16)}' follows the last field`);
  const byte = byteGptArch({ vocabSize, contextLength, channels, heads, mlpRatio: 1 });
  const arch: DecoderArch = {
    ...byte,
    family, kvHeads, headDim, intermediateSize, normEps, ropeTheta, ropeScaling,
    ...(rope ? { norm: 'rmsnorm', position: 'rope', mlp: 'swiglu' } : {}),
    qkvBias: b[0] === '1', attnOutBias: b[1] === '1', mlpBias: b[2] === '1', tiedEmbeddings: w === '1',
  };
  const config: GptConfig = { vocabSize, contextLength, channels, layers, heads, mlpRatio: Math.max(1, Math.round(intermediateSize / channels)), arch };
  validateArch(config);
  return config;
}
