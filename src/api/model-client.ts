// The model store half of the orchestrator's public API (routes in
// src/orchestrator/routes/models.ts, contracts in ./models.ts): store a
// checkpoint to publish it (signed with the developer's wallet key through the
// OrchestratorClient) and get the orchestrator's attestation; list the stored
// models; open a model's file from an offset (a published model's is public;
// until then its owner's, so a client with a key signs the request).
import { open, stat } from 'node:fs/promises';
import type { OrchestratorClient } from './client.ts';
import { PublishTicket, STORE_ANSWER_MS, StorageQuoteView, StoredModelList, StoredModelView, UploadView } from './models.ts';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';

/** What the attestation will say besides the hash and the owner. */
export interface PublishTermsInput {
  name: string;
  /** NIM base units per 1,000 generated tokens */
  pricePer1kTokens: bigint;
  /** default: the orchestrator's `GET /models/:sha256` */
  metadataURI?: string;
}

export class ModelClient {
  constructor(private readonly api: OrchestratorClient) {}

  /** Stores a checkpoint of one of the developer's jobs (the last one unless `step`). */
  async storeFromJob(job: string, step: number | undefined, terms: PublishTermsInput): Promise<PublishTicket> {
    return (await this.api.signed()).postJson('/models', { job, ...(step === undefined ? {} : { step }), ...wireTerms(terms) }, PublishTicket, 'publish ticket');
  }

  /** Uploads a whole-model safetensors file (`keep`: paid for that many days, past the free allowance). */
  async storeFile(bytes: Uint8Array, terms: PublishTermsInput, keep?: { days: number; payment?: string }): Promise<PublishTicket> {
    const query = new URLSearchParams({ ...wireTerms(terms), ...(keep ? { keepDays: String(keep.days), ...(keep.payment ? { payment: keep.payment } : {}) } : {}) });
    return (await this.api.signed()).postBytes(`/models/file?${query}`, bytes, PublishTicket, 'publish ticket');
  }

  /**
   * Uploads a large model file in chunks (POST /models/uploads, PUT each
   * chunk, then store): read from disk one chunk at a time, and resumed from
   * where the orchestrator says the upload is when a chunk fails to arrive.
   */
  async storeLargeFile(path: string, sha256: string, terms: PublishTermsInput, keep?: { days: number; payment?: string }, progress: (done: number, total: number) => void = () => {}): Promise<PublishTicket> {
    const signed = await this.api.signed();
    const bytes = (await stat(path)).size;
    let u = await signed.postJson('/models/uploads', { bytes, sha256 }, UploadView, 'upload');
    const fh = await open(path, 'r');
    try {
      let failures = 0;
      while (u.received < u.bytes) {
        const n = Math.min(u.chunkBytes, u.bytes - u.received);
        const chunk = Buffer.allocUnsafe(n);
        const { bytesRead } = await fh.read(chunk, 0, n, u.received);
        if (bytesRead !== n) throw new NimbleError('invalid', `${path} changed while it was uploaded`);
        try {
          u = parseJson(UploadView, await signed.request('PUT', `/models/uploads/${u.id}?offset=${u.received}`, chunk, 'application/octet-stream', 300_000), 'upload');
          failures = 0;
        } catch (err) {
          // a chunk cut short (or answered lost) is sent again from where the orchestrator is
          if (!(err instanceof NimbleError && (err.code === 'unreachable' || err.status === 409)) || ++failures > 4) throw err;
          await new Promise((r) => setTimeout(r, 500 * 2 ** failures));
          u = parseJson(UploadView, await signed.request('GET', `/models/uploads/${u.id}`), 'upload');
        }
        progress(u.received, u.bytes);
      }
    } finally {
      await fh.close();
    }
    const query = new URLSearchParams({ ...wireTerms(terms), ...(keep ? { keepDays: String(keep.days), ...(keep.payment ? { payment: keep.payment } : {}) } : {}) });
    return parseJson(PublishTicket, await signed.request('POST', `/models/uploads/${u.id}/store?${query}`, new Uint8Array(0), 'application/octet-stream', STORE_ANSWER_MS), 'publish ticket');
  }

  list(owner?: string): Promise<StoredModelView[]> {
    return this.api.http.get(`/models${owner ? `?owner=${encodeURIComponent(owner)}` : ''}`, StoredModelList, 'model list');
  }

  get(sha256: string): Promise<StoredModelView> {
    return this.api.http.get(`/models/${encodeURIComponent(sha256)}`, StoredModelView, 'stored model');
  }

  /** What keeping `bytes` for `days` costs, and how full the store is. */
  quote(bytes: number, days: number): Promise<StorageQuoteView> {
    return this.api.http.get(`/storage/quote?bytes=${bytes}&days=${days}`, StorageQuoteView, 'storage quote');
  }

  /** Keeps one of the developer's stored models `days` more (`payment`: the NIM transfer of the quote, on a paid network). */
  async keep(sha256: string, days: number, payment?: string): Promise<StoredModelView> {
    return (await this.api.signed()).postJson(`/models/${encodeURIComponent(sha256)}/keep`, payment ? { days, payment } : { days }, StoredModelView, 'stored model');
  }

  /** Deletes one of the developer's stored models (refused while deployed). */
  async remove(sha256: string): Promise<StoredModelView> {
    return parseJson(StoredModelView, await (await this.api.signed()).request('DELETE', `/models/${encodeURIComponent(sha256)}`), 'stored model');
  }

  /** Opens a model's file from `offset` on (a resumed download asks for the rest); signed when the client has a key. */
  async openFile(sha256: string, offset = 0, signal?: AbortSignal): Promise<Response> {
    const path = `/models/${encodeURIComponent(sha256)}/file`;
    const headers: Record<string, string> = offset > 0 ? { range: `bytes=${offset}-` } : {};
    return this.api.canSign ? (await this.api.signed()).open(path, headers, signal) : this.api.http.open(path, headers, signal);
  }
}

function wireTerms(t: PublishTermsInput): { name: string; pricePer1kTokens: string; metadataURI?: string } {
  return { name: t.name, pricePer1kTokens: t.pricePer1kTokens.toString(), ...(t.metadataURI === undefined ? {} : { metadataURI: t.metadataURI }) };
}
