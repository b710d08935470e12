// The trust bench's storage figures (issue 33, "Storage"): on a paid local
// network (an orchestrator on its anvil chain), what the orchestrator quotes
// for keeping one GB one day (GET /storage/quote, the price a paid store or
// `nbcli model keep` transfers), and the free allowance and global bound it
// keeps for the whole network (src/orchestrator/blobs/store-budget.ts).
//   trust.storage.cost_per_gb_day      NIM quoted for 1e9 bytes over 1 day
//   trust.storage.free_allowance_gib   the network's free store (all keys together)
//   trust.storage.limit_gib            the store's global bound
import { formatUnits } from 'viem';
import type { StorageQuoteView } from '../src/api/models.ts';
import { Cluster } from '../test/network/helpers.ts';
import type { Bench, BenchResult } from './harness.ts';

export const storageCostBench: Bench = {
  group: 'trust',
  async run(o): Promise<BenchResult[]> {
    const cluster = new Cluster();
    try {
      process.env.NIMBLE_CHAIN_RPC = '';
      await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
      const res = await fetch(`${cluster.url}/storage/quote?bytes=1000000000&days=1`);
      const q = (await res.json()) as StorageQuoteView;
      if (res.status !== 200) throw new Error(`GET /storage/quote: ${res.status} ${JSON.stringify(q)}`);
      o.log(`quote for 1 GB-day: ${formatUnits(BigInt(q.price), 18)} NIM to ${q.payee}; free store ${q.free.used}/${q.free.limit} bytes, store ${q.store.used}/${q.store.limit}`);
      return [
        { bench: 'trust.storage.cost_per_gb_day', value: Number(formatUnits(BigInt(q.price), 18)), unit: 'NIM per GB-day' },
        { bench: 'trust.storage.free_allowance_gib', value: q.free.limit / 2 ** 30, unit: 'GiB for the whole network' },
        { bench: 'trust.storage.limit_gib', value: q.store.limit / 2 ** 30, unit: 'GiB' },
      ];
    } finally {
      await cluster.stopGracefully();
    }
  },
};
