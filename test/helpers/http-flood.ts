// Clients that misbehave on purpose, for the fuzz and flood tests and the
// flood bench: huge uploads streamed chunk by chunk (how far did the client
// get when the server's answer came?), requests with forged signature headers,
// and the resident memory of a process, read from /proc.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { AUTH_HEADERS, bodySha256 } from '../../src/protocol/signing.ts';

/** What became of one streamed upload. */
export interface UploadResult {
  /** the answer's status, or null when none came */
  status: number | null;
  /** the error code of the answer's body, if it had one */
  code: string | null;
  /** the body the request announced */
  size: number;
  /** body bytes handed to the socket when the answer arrived (or when the connection failed) */
  written: number;
  /** why the connection failed without an answer */
  error: string | null;
}

const CHUNK = Buffer.alloc(64 << 10);

/**
 * POSTs a body of `size` zero bytes (announced in content-length) to `url`,
 * one 64 KiB chunk at a time as the socket takes them, and stops sending as
 * soon as an answer arrives. Never throws.
 */
export function streamUpload(url: string, size: number, headers: Record<string, string> = {}): Promise<UploadResult> {
  return new Promise((resolve) => {
    const u = new URL(url);
    let written = 0;
    let answeredAt = -1;
    let done = false;
    const finish = (r: Omit<UploadResult, 'size'>): void => {
      if (done) return;
      done = true;
      req.destroy();
      resolve({ ...r, size });
    };
    const req = request({
      host: u.hostname,
      port: u.port,
      path: u.pathname + u.search,
      method: 'POST',
      agent: false,
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size), ...headers },
    });
    req.on('response', (res) => {
      answeredAt = written;
      const parts: Buffer[] = [];
      res.on('data', (d: Buffer) => parts.push(d));
      const end = (): void => {
        let code: string | null = null;
        try {
          code = (JSON.parse(Buffer.concat(parts).toString('utf8')) as { code?: string }).code ?? null;
        } catch {
          // not JSON
        }
        finish({ status: res.statusCode ?? null, code, written: answeredAt, error: null });
      };
      res.on('end', end);
      res.on('error', end);
      res.on('close', end);
    });
    req.on('error', (err) => finish({ status: null, code: null, written, error: (err as NodeJS.ErrnoException).code ?? err.message }));
    // one chunk per turn of the event loop, so that an answer is seen as soon as it arrives
    const pump = (): void => {
      if (answeredAt >= 0 || done) return;
      if (written >= size) return void req.end();
      const n = Math.min(CHUNK.length, size - written);
      written += n;
      if (req.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) setImmediate(pump);
      else req.once('drain', pump);
    };
    pump();
  });
}

/** Signature headers of the right form whose signature is random: the session scheme's, or the wallet's. */
export function forgedHeaders(scheme: 'session' | 'wallet', address: string, body?: Uint8Array): Record<string, string> {
  const signature = scheme === 'session' ? `ed25519.${randomBytes(64).toString('base64url')}` : `0x${randomBytes(65).toString('hex')}`;
  return {
    [AUTH_HEADERS.address]: address,
    [AUTH_HEADERS.timestamp]: String(Date.now()),
    [AUTH_HEADERS.nonce]: randomBytes(16).toString('hex'),
    [AUTH_HEADERS.contentSha256]: bodySha256(body),
    [AUTH_HEADERS.signature]: signature,
  };
}

/** A random checksummed-looking address (0x + 40 hex). */
export function randomAddress(): string {
  return `0x${randomBytes(20).toString('hex')}`;
}

/** Resident memory of a process (Linux: VmRSS of /proc/<pid>/status), bytes. */
export function rssOf(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS for process ${pid}`);
  return Number(m[1]) * 1024;
}

/** Samples `read` every `everyMs` until stopped; `max` is the largest value seen. */
export function sampleMax(read: () => number, everyMs = 50): { max: () => number; stop: () => number } {
  let max = read();
  const timer = setInterval(() => {
    try {
      max = Math.max(max, read());
    } catch {
      // the process is gone: the caller's liveness checks say so
    }
  }, everyMs);
  return {
    max: () => max,
    stop: () => {
      clearInterval(timer);
      return max;
    },
  };
}
