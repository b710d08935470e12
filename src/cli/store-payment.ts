// Paying the orchestrator's store for keeping a model or a dataset
// (docs/security.md, "Storage"; the orchestrator's rules in
// src/orchestrator/blobs/store-budget.ts): the quote first (GET
// /storage/quote), refused here when the store or its disk would refuse the
// bytes anyway, so nothing is paid for a store that cannot happen; then a
// NIM transfer of the price to the payee, whose hash goes with the store or
// keep request. `nbcli model publish|keep` and `nbcli dataset upload|keep`
// pay through here.
import { getAddress, type PrivateKeyAccount } from 'viem';
import type { StorageQuoteView } from '../api/models.ts';
import { signerFor, type ChainClient } from '../chain/client.ts';
import { ensureGas, transferNim } from '../chain/token.ts';
import { NimbleError } from '../protocol/errors.ts';

/** A keep paid for `days`: the transfer's hash and what it paid (none when the quote costs nothing). */
export interface PaidKeep {
  days: number;
  payment?: string;
  /** wei of NIM paid */
  price?: bigint;
}

/**
 * Pays the quote for keeping `bytes` `days`. `fresh`: the bytes are not in
 * the store yet, so the store's bound and the disk must take them first.
 */
export async function payStore(
  client: ChainClient, quoteOf: (bytes: number, days: number) => Promise<StorageQuoteView>, account: PrivateKeyAccount, bytes: number, days: number, fresh = true,
): Promise<PaidKeep> {
  const quote = await quoteOf(bytes, days);
  if (fresh) {
    // refused before paying: what the store would refuse anyway
    if (quote.store.used + bytes > quote.store.limit) throw new NimbleError('store_full', `the orchestrator's model and dataset store holds ${quote.store.used} of its ${quote.store.limit} bytes: ${bytes} more do not fit (nothing was paid)`);
    if (quote.disk.free !== null && quote.disk.free - bytes < quote.disk.reserve) throw new NimbleError('disk_full', `the orchestrator's disk has ${quote.disk.free} bytes free, under its reserve with ${bytes} more (nothing was paid)`);
  }
  if (BigInt(quote.price) === 0n || !quote.payee) return { days };
  await ensureGas(client, account.address);
  const tx = await transferNim(client, signerFor(client, account), getAddress(quote.payee), BigInt(quote.price));
  return { days, payment: tx.hash, price: BigInt(quote.price) };
}
