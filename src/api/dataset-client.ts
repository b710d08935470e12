// The dataset half of the orchestrator's public API (routes in
// src/orchestrator/routes/datasets.ts, contracts in ./datasets.ts): whether
// a dataset is stored (for its uploader), the upload of packed bytes (signed
// with the developer's wallet key, streamed with progress; paid past the
// network's free store), the list, keeping one longer and deleting one.
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { errorOf } from '../http/client.ts';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';
import type { OrchestratorClient } from './client.ts';
import { DatasetList, DatasetView, UploadedDataset } from './datasets.ts';

/** Bytes written per chunk of an upload (progress moves at this grain). */
const CHUNK_BYTES = 1 << 20;
/** An upload on which nothing moves for this long is abandoned. */
const IDLE_TIMEOUT_MS = 60_000;
/** Times an upload refused because another one is under way (429) is tried again. */
const BUSY_RETRIES = 8;

export class DatasetClient {
  constructor(private readonly api: OrchestratorClient) {}

  /** `owner`'s dataset of this sha256 (any owner's when not given), or null when there is none. */
  async get(sha256: string, owner?: string): Promise<DatasetView | null> {
    try {
      return await this.api.http.get(`/datasets/${encodeURIComponent(sha256)}${owner ? `?owner=${encodeURIComponent(owner)}` : ''}`, DatasetView, 'dataset');
    } catch (err) {
      if (err instanceof NimbleError && err.status === 404) return null;
      throw err;
    }
  }

  list(owner?: string): Promise<DatasetView[]> {
    return this.api.http.get(`/datasets${owner ? `?owner=${encodeURIComponent(owner)}` : ''}`, DatasetList, 'dataset list');
  }

  /**
   * Uploads packed bytes, stating their sha256 (the orchestrator hashes them
   * itself and refuses a mismatch). `onProgress` hears the bytes sent so far;
   * `keep`: stored paid for that many days (past the network's free store).
   */
  async upload(bytes: Uint8Array, sha256: string, onProgress: (sent: number, total: number) => void = () => {}, keep?: { days: number; payment?: string }): Promise<UploadedDataset> {
    const signed = await this.api.signed();
    const query = new URLSearchParams({ sha256, ...(keep ? { keepDays: String(keep.days), ...(keep.payment ? { payment: keep.payment } : {}) } : {}) });
    const path = `/datasets?${query.toString()}`;
    for (let attempt = 0; ; attempt++) {
      const headers = { ...(await signed.signer.sign('POST', path, bytes)), 'content-type': 'application/octet-stream', 'content-length': String(bytes.length) };
      try {
        const { status, body } = await send(new URL(path, signed.baseUrl), headers, bytes, onProgress);
        if (status < 200 || status >= 300) throw errorOf(status, '', body, `POST /datasets`);
        return parseJson(UploadedDataset, body, 'uploaded dataset');
      } catch (err) {
        if (!(err instanceof NimbleError && err.status === 429) || attempt >= BUSY_RETRIES) throw err;
        await new Promise((r) => setTimeout(r, Math.min(8000, 250 * 2 ** attempt) * (0.5 + Math.random())));
      }
    }
  }

  /** Keeps one of the developer's datasets `days` more (`payment`: the NIM transfer of the quote, on a paid network). */
  async keep(sha256: string, days: number, payment?: string): Promise<DatasetView> {
    return (await this.api.signed()).postJson(`/datasets/${encodeURIComponent(sha256)}/keep`, payment ? { days, payment } : { days }, DatasetView, 'dataset');
  }

  /** Deletes one of the developer's datasets (refused while a job of theirs uses it). */
  async remove(sha256: string): Promise<DatasetView> {
    return parseJson(DatasetView, await (await this.api.signed()).request('DELETE', `/datasets/${encodeURIComponent(sha256)}`), 'dataset');
  }
}

/** POSTs `bytes` in chunks (waiting for the socket to drain), reporting progress; resolves with the answer. */
function send(url: URL, headers: Record<string, string>, bytes: Uint8Array, onProgress: (sent: number, total: number) => void): Promise<{ status: number; body: Uint8Array }> {
  return new Promise((resolve, reject) => {
    const req = (url.protocol === 'https:' ? httpsRequest : httpRequest)(url, { method: 'POST', headers });
    const fail = (err: Error): void => reject(new NimbleError('unreachable', `cannot upload to the orchestrator at ${url.origin}: ${err.message}`, 502, { cause: err }));
    req.setTimeout(IDLE_TIMEOUT_MS, () => req.destroy(new Error(`nothing moved for ${IDLE_TIMEOUT_MS / 1000} s`)));
    let answered = false;
    // an answer before the whole body went (a refusal from the headers) wins over the write errors that follow it
    req.on('error', (err) => answered || fail(err));
    req.on('response', (res: IncomingMessage) => {
      answered = true;
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('error', fail);
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, body: new Uint8Array(Buffer.concat(parts)) });
        if (at < bytes.length) req.destroy(); // the rest of the body is not wanted
      });
    });
    let at = 0;
    const write = (): void => {
      while (at < bytes.length && !answered) {
        const end = Math.min(bytes.length, at + CHUNK_BYTES);
        const more = req.write(bytes.subarray(at, end));
        at = end;
        onProgress(at, bytes.length);
        if (!more) {
          req.once('drain', write);
          return;
        }
      }
      if (!answered) req.end();
    };
    write();
  });
}
