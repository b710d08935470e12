// A job's own data as one byte corpus (docs/jobs.md, "Data"): a local text
// file, or a folder packed into one byte string, named on the network by its
// content, `sha256:<64 lowercase hex>` (a "dataset id"). `nbcli job run
// --local` and the upload of `nbcli job submit` use the same packing, so
// local and network runs train on identical bytes.
//
// Packing a folder:
//   - its files, walked recursively, in the byte order of their UTF-8
//     relative paths with `/` separators (`a/b.txt` < `a/c.txt` < `b.txt`);
//   - names starting with `.` (files and folders) are skipped;
//   - text files only: a file that contains a NUL byte or is not valid UTF-8
//     is skipped (and listed as skipped), as is anything that is not a regular
//     file (sockets, devices);
//   - a symbolic link is followed when its target is inside the folder, and
//     refused (the whole packing fails) when it leads out of it; a link to a
//     folder already being walked (a loop) is refused too;
//   - the files' bytes are joined with a blank line ("\n\n") between two files.
// A single file is taken whole, whatever its bytes: a folder holding one
// text file packs to exactly that file's bytes.
//
// Limits: at most MAX_DATASET_BYTES packed and MAX_DATASET_FILES files; at
// least `minCorpusBytes(context)` bytes, so that both the training part and
// the held-out tail (HELDOUT_FRACTION) hold one window of context + 1 bytes.
import { createHash } from 'node:crypto';
import { isUtf8 } from 'node:buffer';
import { lstatSync, readdirSync, readFileSync, realpathSync, statSync, type Stats } from 'node:fs';
import { basename, join, resolve, sep } from 'node:path';
import { NimbleError } from '../protocol/errors.ts';
import { HELDOUT_FRACTION, mobyDickBytes, splitCorpus, splitPoint, type ByteCorpus } from './corpus.ts';

/** Largest packed dataset (the orchestrator refuses larger uploads). */
export const MAX_DATASET_BYTES = 256 << 20;
/** Most files a folder may pack. */
export const MAX_DATASET_FILES = 100_000;
/** What goes between two files of a folder. */
export const FILE_SEPARATOR = '\n\n';
/** Text corpora every miner loads by name (the GPT's byte corpora). */
export const NAMED_CORPORA = ['moby-dick'] as const;

const ID = /^sha256:[0-9a-f]{64}$/;

/** Whether `data` names an uploaded dataset: `sha256:<64 lowercase hex>`. */
export function isDatasetId(data: string): boolean {
  return ID.test(data);
}

/** The dataset id of packed bytes. */
export function datasetId(bytes: Uint8Array): string {
  return `sha256:${sha256Hex(bytes)}`;
}

/** The hex part of a dataset id (also its blob id). */
export function datasetHex(id: string): string {
  if (!isDatasetId(id)) throw new NimbleError('invalid', `'${id.slice(0, 80)}' is not a dataset id (sha256:<64 lowercase hex digits>)`);
  return id.slice('sha256:'.length);
}

export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/**
 * The fewest bytes a corpus needs for a model of `contextLength`: its
 * training part and its held-out tail each hold one window of
 * contextLength + 1 bytes (an input and its next-byte targets).
 */
export function minCorpusBytes(contextLength: number, heldoutFraction = HELDOUT_FRACTION): number {
  const w = contextLength + 1;
  for (let n = 2 * w; ; n++) {
    const cut = splitPoint(n, heldoutFraction);
    if (cut >= w && n - cut >= w) return n;
  }
}

/** Throws a clear error unless `bytes` bytes make a corpus for a model of `contextLength` (`what` names the data). */
export function checkCorpusSize(bytes: number, contextLength: number, what: string): void {
  const min = minCorpusBytes(contextLength);
  if (bytes < min) {
    throw new NimbleError(
      'too_small',
      `${what} has ${bytes} bytes; a model of context ${contextLength} needs at least ${min} (a window of ${contextLength + 1} bytes in the training part and in the held-out last ${HELDOUT_FRACTION * 100}%)`,
    );
  }
  if (bytes > MAX_DATASET_BYTES) throw new NimbleError('too_large', `${what} has ${bytes} bytes; the limit is ${MAX_DATASET_BYTES} (256 MiB)`, 413);
}

/** A local file or folder packed into one corpus. */
export interface PackedDataset {
  /** the path as given */
  path: string;
  bytes: Uint8Array;
  /** `sha256:<hex>` of the bytes */
  id: string;
  /** the files packed, in order (relative to the folder; a file's own name) */
  files: string[];
  /** files of a folder left out, and why */
  skipped: { path: string; why: string }[];
}

/** Packs a local text file or folder (see the top of this file); throws a NimbleError saying what is wrong. */
export function packDataset(path: string, maxBytes = MAX_DATASET_BYTES): PackedDataset {
  let st: Stats;
  try {
    st = statSync(path);
  } catch (err) {
    throw new NimbleError('invalid', `cannot read the data '${path}': ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file or folder' : (err as Error).message}`);
  }
  if (st.isFile()) {
    if (st.size > maxBytes) throw tooLarge(path, st.size, maxBytes);
    const bytes = new Uint8Array(readFileSync(path));
    if (bytes.length > maxBytes) throw tooLarge(path, bytes.length, maxBytes);
    return { path, bytes, id: datasetId(bytes), files: [basename(path)], skipped: [] };
  }
  if (!st.isDirectory()) throw new NimbleError('invalid', `the data '${path}' is neither a file nor a folder`);
  return packFolder(path, maxBytes);
}

interface FolderFile {
  rel: string;
  abs: string;
  size: number;
}

function packFolder(path: string, maxBytes: number): PackedDataset {
  const root = realpathSync(path);
  const files: FolderFile[] = [];
  const skipped: { path: string; why: string }[] = [];
  const walking = new Set<string>();
  const inside = (real: string): boolean => real === root || real.startsWith(root.endsWith(sep) ? root : root + sep);
  const walk = (dir: string, rel: string): void => {
    const real = realpathSync(dir);
    if (walking.has(real)) throw new NimbleError('invalid', `the data folder '${path}' has a link loop at ${rel}`);
    walking.add(real);
    for (const name of readdirSync(dir)) {
      if (name.startsWith('.')) continue;
      const abs = join(dir, name);
      const r = rel ? `${rel}/${name}` : name;
      let st = lstatSync(abs);
      if (st.isSymbolicLink()) {
        let target: string;
        try {
          target = realpathSync(abs);
        } catch {
          throw new NimbleError('invalid', `the link ${r} in the data folder '${path}' leads nowhere`);
        }
        if (!inside(target)) throw new NimbleError('invalid', `the link ${r} in the data folder '${path}' leads out of it (to ${target}); copy the file in instead`);
        st = statSync(abs);
      }
      if (st.isDirectory()) walk(abs, r);
      else if (st.isFile()) files.push({ rel: r, abs, size: st.size });
      else skipped.push({ path: r, why: 'not a regular file' });
      if (files.length > MAX_DATASET_FILES) throw new NimbleError('too_large', `the data folder '${path}' has more than ${MAX_DATASET_FILES} files`, 413);
    }
    walking.delete(real);
  };
  walk(path, '');
  files.sort((a, b) => Buffer.compare(Buffer.from(a.rel), Buffer.from(b.rel)));
  const upper = files.reduce((n, f) => n + f.size, 0) + FILE_SEPARATOR.length * Math.max(0, files.length - 1);
  if (upper > maxBytes) throw tooLarge(path, upper, maxBytes);
  const out = Buffer.allocUnsafe(upper);
  const taken: string[] = [];
  let at = 0;
  for (const f of files) {
    const bytes = readFileSync(f.abs);
    if (bytes.includes(0) || !isUtf8(bytes)) {
      skipped.push({ path: f.rel, why: 'not text (a NUL byte, or not UTF-8)' });
      continue;
    }
    if (taken.length) at += out.write(FILE_SEPARATOR, at, 'latin1');
    if (at + bytes.length > upper) throw new NimbleError('conflict', `${f.rel} in the data folder '${path}' grew while it was being read`);
    at += bytes.copy(out, at);
    taken.push(f.rel);
  }
  if (taken.length === 0) throw new NimbleError('invalid', `the data folder '${path}' has no text files${skipped.length ? ` (skipped: ${skipped.slice(0, 3).map((s) => s.path).join(', ')}${skipped.length > 3 ? ', …' : ''})` : ''}`);
  const bytes = new Uint8Array(out.buffer, out.byteOffset, at);
  return { path, bytes, id: datasetId(bytes), files: taken, skipped };
}

function tooLarge(path: string, size: number, max: number): NimbleError {
  return new NimbleError('too_large', `the data '${path}' packs to ${size} bytes; the limit is ${max} (${(max / 2 ** 20).toFixed(0)} MiB)`, 413);
}

/** A corpus every miner loads by name; anything else (a path above all) is refused. */
export function loadNamedCorpus(name: string): ByteCorpus {
  if (name === 'moby-dick') return splitCorpus(name, mobyDickBytes());
  if (isDatasetId(name)) throw new NimbleError('invalid', `the dataset ${name} is loaded from its downloaded bytes, not by name`);
  throw new NimbleError('invalid', `'${name.slice(0, 200)}' is not a data set miners load: they load ${NAMED_CORPORA.map((n) => `'${n}'`).join(', ')} or an uploaded dataset (sha256:…), never a path`);
}

/** The corpus of an uploaded dataset from its bytes, checked against its id. */
export function datasetCorpus(id: string, bytes: Uint8Array): ByteCorpus {
  const actual = sha256Hex(bytes);
  if (actual !== datasetHex(id)) throw new NimbleError('corrupt', `the bytes of dataset ${id} hash to sha256:${actual}`);
  return splitCorpus(id, bytes);
}

/**
 * The corpus of a job run locally (`job run --local`): a named corpus, or a
 * local file or folder packed as for an upload (a relative path is taken
 * from `baseDir`, the spec file's folder), at least big enough for
 * `contextLength`.
 */
export function loadLocalCorpus(data: string, baseDir: string, contextLength: number): ByteCorpus {
  if ((NAMED_CORPORA as readonly string[]).includes(data)) return loadNamedCorpus(data);
  if (isDatasetId(data)) throw new NimbleError('invalid', `${data} names a dataset uploaded to a network; --local needs the local file or folder it was packed from`);
  const packed = packDataset(resolve(baseDir, data));
  checkCorpusSize(packed.bytes.length, contextLength, `the data '${data}'`);
  return splitCorpus(data, packed.bytes);
}
