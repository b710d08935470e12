// The trust bench's read figures (issue 33, "Who may read what"): on a paid
// local network of real processes (an orchestrator on its anvil chain, two
// miners), a developer's blobs of every kind (test/helpers/blob-reads.ts: a
// dataset, a checkpoint, a run's initial state, an unpublished model, a
// stage's merged state, a merge round's slice and merged partition), and an
// outsider's and a throwaway-key miner's attempts to read each over every
// route that serves blob bytes. Figures:
//   trust.blob_reads_refused            refused attempts over attempts (must be 1)
//   trust.blob_reads_attempted          the attempts: both attackers, every kind, every route
//   trust.blob_reads_refused.outsider   refused over attempted, the outsider's
//   trust.blob_reads_refused.miner      refused over attempted, the miner's
import { attemptBlobReads, buildBlobWorld, joinAttackers } from '../test/helpers/blob-reads.ts';
import { Cluster } from '../test/network/helpers.ts';
import type { Bench, BenchResult } from './harness.ts';

export const blobReadsBench: Bench = {
  group: 'trust',
  async run(o): Promise<BenchResult[]> {
    const cluster = new Cluster();
    try {
      process.env.NIMBLE_CHAIN_RPC = '';
      await cluster.startOrchestrator(['--min-stake', '0', '--miner-timeout-ms', '4000'], { chain: true });
      await Promise.all(['m1', 'm2'].map((n) => cluster.startMiner(n)));
      o.log('a developer uploads a dataset, trains a job on it, upgrades it onto 1 stage × 2 replicas, stores a model it does not publish');
      const world = await buildBlobWorld(cluster, o.log);
      const attempts = await attemptBlobReads(cluster.url, world, await joinAttackers(cluster.url));
      const share = (who?: 'outsider' | 'miner'): number => {
        const mine = attempts.filter((a) => !who || a.who === who);
        return mine.filter((a) => a.status < 200 || a.status >= 300).length / mine.length;
      };
      for (const a of attempts.filter((x) => x.status >= 200 && x.status < 300)) o.log(`READ: ${a.who} ${a.kind} by ${a.route} (${a.bytes} bytes)`);
      const kinds = [...new Set(attempts.map((a) => a.kind))];
      o.log(`${attempts.length} reads of ${kinds.length} kinds (${kinds.join(', ')}) over ${new Set(attempts.map((a) => a.route)).size} routes`);
      return [
        { bench: 'trust.blob_reads_refused', value: share(), unit: `share of ${attempts.length} attempts` },
        { bench: 'trust.blob_reads_attempted', value: attempts.length, unit: 'reads' },
        { bench: 'trust.blob_reads_refused.outsider', value: share('outsider'), unit: `share of ${attempts.filter((a) => a.who === 'outsider').length}` },
        { bench: 'trust.blob_reads_refused.miner', value: share('miner'), unit: `share of ${attempts.filter((a) => a.who === 'miner').length}` },
      ];
    } finally {
      await cluster.stopGracefully();
    }
  },
};
