// Downloading a file to disk: written to `<out>.part` as it arrives, resumed
// from what is there after an interruption (an HTTP range request, when the
// part file is of the same sha256), checked against the expected sha256 before
// it is renamed into place; a file that does not match is deleted, never
// left as `out`. Used for a job's checkpoint (its sha256 from the
// orchestrator) and a published model (its sha256 from the chain).
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { NimbleError } from '../protocol/errors.ts';
import type { JobClient } from './job-client.ts';
import type { CheckpointView } from './jobs.ts';

/** What to download and what it must be. */
export interface DownloadSource {
  /** the sha256 the whole file must have (hex) */
  sha256: string;
  bytes: number;
  /** the file, from `offset` on */
  open(offset: number, signal?: AbortSignal): Promise<Response>;
  /** names the file in errors (e.g. "checkpoint") */
  what: string;
  /** where the expected sha256 comes from, for the mismatch error (e.g. "the sha256 registered on chain") */
  origin?: string;
}

export interface DownloadProgress {
  done: number;
  total: number;
  /** bytes that were already there when this download began */
  resumedFrom: number;
}

export interface DownloadResult {
  path: string;
  bytes: number;
  sha256: string;
  resumedFrom: number;
}

/** Downloads `checkpoint` of job `jobId` to `out`, resuming a part file of the same checkpoint. */
export function downloadCheckpoint(
  jobs: JobClient,
  checkpoint: CheckpointView,
  out: string,
  onProgress: (p: DownloadProgress) => void = () => {},
  signal?: AbortSignal,
): Promise<DownloadResult> {
  const source: DownloadSource = {
    sha256: checkpoint.sha256,
    bytes: checkpoint.bytes,
    what: 'checkpoint',
    open: (offset, s) => jobs.openCheckpoint(checkpoint.jobId, checkpoint.step, offset, s),
  };
  return downloadVerified(source, out, onProgress, signal);
}

/** Downloads `source` to `out`, resuming a part file of the same sha256; `out` appears only once the whole file matched. */
export async function downloadVerified(source: DownloadSource, out: string, onProgress: (p: DownloadProgress) => void = () => {}, signal?: AbortSignal): Promise<DownloadResult> {
  mkdirSync(dirname(out), { recursive: true });
  const part = `${out}.part`;
  const meta = `${part}.json`;
  // a part file of another file (or without its record) starts over
  const same = existsSync(part) && existsSync(meta) && readMeta(meta) === source.sha256;
  if (!same) {
    rmSync(part, { force: true });
    writeFileSync(meta, JSON.stringify({ sha256: source.sha256 }));
  }
  let offset = existsSync(part) ? statSync(part).size : 0;
  if (offset > source.bytes) {
    rmSync(part, { force: true });
    offset = 0;
  }
  const resumedFrom = offset;
  if (offset < source.bytes) {
    const res = await source.open(offset, signal);
    // a server that ignores the range sends everything: start the file over
    if (offset > 0 && res.status !== 206) offset = 0;
    const fd = openSync(part, offset === 0 ? 'w' : 'a');
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        if (offset + chunk.length > source.bytes) throw new NimbleError('corrupt', `the server sent more than the ${source.bytes} bytes of the ${source.what}`);
        writeSync(fd, chunk);
        offset += chunk.length;
        onProgress({ done: offset, total: source.bytes, resumedFrom });
      }
    } finally {
      closeSync(fd);
    }
  }
  if (offset !== source.bytes) throw new NimbleError('unreachable', `the download stopped at ${offset} of ${source.bytes} bytes; run the same command again to resume`, 502);
  const sha256 = await sha256OfFile(part);
  if (sha256 !== source.sha256) {
    rmSync(part, { force: true });
    rmSync(meta, { force: true });
    throw new NimbleError('corrupt', `the downloaded ${source.what} has sha256 ${sha256}, not ${source.sha256}${source.origin ? ` (${source.origin})` : ''}; it was deleted, download it again`);
  }
  renameSync(part, out);
  rmSync(meta, { force: true });
  return { path: out, bytes: offset, sha256, resumedFrom };
}

function readMeta(path: string): string | null {
  try {
    const v: unknown = JSON.parse(readFileSync(path, 'utf8'));
    return v && typeof v === 'object' && typeof (v as { sha256?: unknown }).sha256 === 'string' ? (v as { sha256: string }).sha256 : null;
  } catch {
    return null;
  }
}

/** The sha256 of a file, read as a stream. */
export async function sha256OfFile(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}
