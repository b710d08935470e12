// The inference-payment half of the orchestrator's API (routes in
// src/orchestrator/routes/credits.ts, contracts in ./credits.ts): a wallet's
// API keys and its prepaid credit. Everything but the terms is signed with the
// wallet key through the OrchestratorClient, and every answer is checked
// against its schema.
import { parseJson } from '../protocol/messages.ts';
import type { OrchestratorClient } from './client.ts';
import { ApiKeyList, ApiKeyView, CreatedApiKey, CreditTerms, CreditView } from './credits.ts';

export class CreditClient {
  constructor(private readonly api: OrchestratorClient) {}

  /** A new API key for the signing wallet: `key` is shown this once. */
  async createKey(name?: string): Promise<CreatedApiKey> {
    return (await this.api.signed()).postJson('/api-keys', name === undefined ? {} : { name }, CreatedApiKey, 'API key');
  }

  async listKeys(): Promise<ApiKeyView[]> {
    return parseJson(ApiKeyList, await (await this.api.signed()).request('GET', '/api-keys'), 'API key list');
  }

  async revokeKey(id: string): Promise<ApiKeyView> {
    return parseJson(ApiKeyView, await (await this.api.signed()).request('POST', `/api-keys/${encodeURIComponent(id)}/revoke`), 'API key');
  }

  /** Where credit is escrowed (null: an unpaid network) and how payments are split. */
  terms(): Promise<CreditTerms> {
    return this.api.http.get('/credits/terms', CreditTerms, 'credit terms');
  }

  /** Adds an escrow the signing wallet opened on JobEscrow to its balance. */
  async add(escrowId: string): Promise<CreditView> {
    return (await this.api.signed()).postJson('/credits', { escrowId }, CreditView, 'credit');
  }

  async balance(): Promise<CreditView> {
    return parseJson(CreditView, await (await this.api.signed()).request('GET', '/credits'), 'credit');
  }

  /** Ends the wallet's credit: each escrow is closed and the rest refunded once what it owes is paid. */
  async withdraw(): Promise<CreditView> {
    return parseJson(CreditView, await (await this.api.signed()).request('POST', '/credits/withdraw'), 'credit');
  }
}
