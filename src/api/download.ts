// Downloading a job's checkpoint to a file: written to `<out>.part` as it
// arrives, resumed from what is there after an interruption (an HTTP range
// request, when the part file is of the same checkpoint), checked against the
// checkpoint's sha256 before it is renamed into place.
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { NimbleError } from '../protocol/errors.ts';
import type { JobClient } from './job-client.ts';
import type { CheckpointView } from './jobs.ts';

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
export async function downloadCheckpoint(
  jobs: JobClient,
  checkpoint: CheckpointView,
  out: string,
  onProgress: (p: DownloadProgress) => void = () => {},
  signal?: AbortSignal,
): Promise<DownloadResult> {
  mkdirSync(dirname(out), { recursive: true });
  const part = `${out}.part`;
  const meta = `${part}.json`;
  // a part file of another checkpoint (or without its record) starts over
  const sameCheckpoint = existsSync(part) && existsSync(meta) && readMeta(meta) === checkpoint.sha256;
  if (!sameCheckpoint) {
    rmSync(part, { force: true });
    writeFileSync(meta, JSON.stringify({ sha256: checkpoint.sha256 }));
  }
  let offset = existsSync(part) ? statSync(part).size : 0;
  if (offset > checkpoint.bytes) {
    rmSync(part, { force: true });
    offset = 0;
  }
  const resumedFrom = offset;
  if (offset < checkpoint.bytes) {
    const res = await jobs.openCheckpoint(checkpoint.jobId, checkpoint.step, offset, signal);
    // a server that ignores the range sends everything: start the file over
    if (offset > 0 && res.status !== 206) offset = 0;
    const fd = openSync(part, offset === 0 ? 'w' : 'a');
    try {
      for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
        if (offset + chunk.length > checkpoint.bytes) throw new NimbleError('corrupt', `the server sent more than the checkpoint's ${checkpoint.bytes} bytes`);
        writeSync(fd, chunk);
        offset += chunk.length;
        onProgress({ done: offset, total: checkpoint.bytes, resumedFrom });
      }
    } finally {
      closeSync(fd);
    }
  }
  if (offset !== checkpoint.bytes) throw new NimbleError('unreachable', `the download stopped at ${offset} of ${checkpoint.bytes} bytes; run the same command again to resume`, 502);
  const sha256 = await sha256OfFile(part);
  if (sha256 !== checkpoint.sha256) {
    rmSync(part, { force: true });
    rmSync(meta, { force: true });
    throw new NimbleError('corrupt', `the downloaded checkpoint's sha256 is ${sha256}, not ${checkpoint.sha256}; it was deleted, download it again`);
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
