// The model store half of the orchestrator's public API (routes in
// src/orchestrator/routes/models.ts, contracts in ./models.ts): store a
// checkpoint to publish it (signed with the developer's wallet key through the
// OrchestratorClient) and get the orchestrator's attestation; list the stored
// models; open a model's file from an offset (a published model's is public;
// until then its owner's, so a client with a key signs the request).
import type { OrchestratorClient } from './client.ts';
import { PublishTicket, StorageQuoteView, StoredModelList, StoredModelView } from './models.ts';
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
