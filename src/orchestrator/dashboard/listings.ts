// Each stored model's listing on the chain's ModelRegistry as the Models page
// shows it (docs/dashboard.md): whether it is published, its id, its price
// per 1,000 tokens and the registry's deployed flag, read in the background
// by a ChainReadCache (./chain-reads.ts): a model's at most every 30 s.
import { formatEther, type Hex } from 'viem';
import type { ModelListing } from '../../api/dashboard.ts';
import type { ChainClient } from '../../chain/client.ts';
import { modelOfSha256 } from '../../chain/registry.ts';
import { ChainReadCache, type ChainReadOptions } from './chain-reads.ts';

/** What the models section reads listings from (a ListingCache; a fake in tests). */
export interface ListingSource {
  /** The last listing read of `sha256` (null: none yet); a read is queued if the last one is old. */
  get(sha256: string): ModelListing | null;
}

/** Reads a model's registry entry by its checkpoint's sha256 (null: not published). */
export type ListingReader = (sha256: string) => Promise<{ id: bigint; pricePer1kTokens: bigint; deployed: boolean } | null>;

const SHA256 = /^[0-9a-f]{64}$/;

export class ListingCache extends ChainReadCache<ModelListing> implements ListingSource {
  constructor(read: ListingReader, options: ChainReadOptions = {}) {
    super(
      'the registry listing of',
      async (sha256): Promise<ModelListing> => {
        const m = await read(sha256);
        if (!m) return { published: false };
        return { published: true, modelId: m.id.toString(), priceWei: m.pricePer1kTokens.toString(), price: formatEther(m.pricePer1kTokens), deployed: m.deployed };
      },
      (sha256) => SHA256.test(sha256),
      options,
    );
  }

  /** A cache reading the ModelRegistry of `client`. */
  static ofChain(client: ChainClient, options: ChainReadOptions = {}): ListingCache {
    return new ListingCache((sha256) => modelOfSha256(client, `0x${sha256}` as Hex), options);
  }
}
