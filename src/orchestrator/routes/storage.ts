// What storing costs and how long a stored model stays (docs/security.md,
// "Storage"; the rules in ../blobs/store-budget.ts): anyone reads a quote
// (`GET /storage/quote?bytes=&days=`: the price, the payee, how full the
// store, the free allowance and the disk are); a stored model's owner keeps
// it longer, paid first on a paid network (`POST /models/:sha256/keep`, a NIM
// transfer of the quote, as `checkpoint keep` pays) and deletes it
// (`DELETE /models/:sha256`) unless a deployment of it is live. Its name
// stays its owner's.
import { Type } from '@sinclair/typebox';
import { KeepModelRequest, Sha256, StorageQuoteQuery, StorageQuoteView, StoredModelView } from '../../api/models.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { StoragePayments, StoreBudget } from '../blobs/store-budget.ts';
import type { JobPayments } from '../jobs/job-payments.ts';
import { storedModelView } from '../models/models.ts';
import type { ModelRecord } from '../state/models.ts';
import type { Coordinator } from '../training/coordinator.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ sha256: Sha256 });

/** The chain half of storage prices: the job payments' price per GB-day and payment check (null: an unpaid network). */
export function storagePaymentsOf(payments: JobPayments | null): StoragePayments | null {
  if (!payments) return null;
  const payee = payments.terms().payee;
  return {
    payee,
    price: (bytes, days) => payments.storagePrice(bytes, days),
    check: (txHash, payer, price, what, days) => payments.checkStoragePayment(txHash, payer, price, { jobId: what, days }),
  };
}

export function storageRoutes(app: HttpServer, c: Coordinator, budget: StoreBudget): void {
  /** The stored model, which only its owner keeps or deletes. */
  const owned = (sha256: string, signer: string, what: string): ModelRecord => {
    const m = c.state.models.get(sha256);
    if (!m) throw new NimbleError('not_found', `no stored model ${sha256}`);
    if (m.owner.toLowerCase() !== signer.toLowerCase()) throw new NimbleError('forbidden', `model ${sha256} ('${m.name}') is ${m.owner}'s: only its owner may ${what} it`);
    return m;
  };

  app.get('/storage/quote', { schema: { querystring: StorageQuoteQuery, response: { 200: StorageQuoteView } } }, async (req) => budget.quote(req.query.bytes, req.query.days));

  app.post('/models/:sha256/keep', { config: developer, schema: { params: Params, body: KeepModelRequest, response: { 200: StoredModelView } } }, async (req) => {
    const m = owned(req.params.sha256, signerOf(req), 'keep');
    const from = budget.expiresAt(m) ?? Date.now();
    const until = await budget.pay(m.owner, `model ${m.sha256}`, m.bytes, req.body.days, req.body.payment, from);
    c.state.models.keep(m.sha256, until);
    return storedModelView(c.state.models.get(m.sha256)!, budget);
  });

  app.delete('/models/:sha256', { config: developer, schema: { params: Params, response: { 200: StoredModelView } } }, async (req) => {
    const m = owned(req.params.sha256, signerOf(req), 'delete');
    const live = c.state.deployments.liveOf(m.sha256);
    if (live) throw new NimbleError('conflict', `model ${m.sha256} ('${m.name}') is deployed (${live.id}): undeploy it first (nbcli model undeploy)`);
    budget.remove(m.sha256);
    return storedModelView(m, budget);
  });
}
