// Collection over a long run: does a run's footprint stay bounded?
// A real Coordinator (src/orchestrator/training/coordinator.ts) on a SQLite file and a
// blob folder, driven by the coordinator tests' fake miners
// (test/orchestrator/helpers.ts) through 200 merge rounds of a gpt-micro run
// of 2 stages × 2 replicas: every round trains 4 microbatches, uploads the
// pseudo-gradients, merges, applies and saves the states (real frames of the
// stage's size), and the injected clock moves a minute, so the collector runs
// from the clock as in production (src/orchestrator/blobs/gc.ts, defaults).
//   scale.gc.rounds200.blob_mb         blob bytes stored after round 200
//   scale.gc.blob_growth_100_200       blob bytes at round 200 / at round 100
//   scale.gc.rounds200.db_mb           live database pages after round 200 (MB)
//   scale.gc.db_growth_100_200         live pages at round 200 / at round 100
//   scale.gc.rounds200.collected_rows  rows of the collected kinds left after
//                                      round 200 (merge rounds, uploads,
//                                      results, microbatches, hop claims)
//   scale.gc.rounds200.work_log_rows   work-log entries left after round 200
//                                      (older ones, once paid, are folded into
//                                      per-miner sums: the ledger's work_totals)
// A ratio near 1 is bounded.
import assert from 'node:assert/strict';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Harness } from '../test/orchestrator/helpers.ts';
import { beatAll, mergeRoundAll, trainMicrobatches } from '../test/orchestrator/flows.ts';
import type { Bench, BenchOptions, BenchResult } from './harness.ts';

const ROUNDS = 200;
const MB = 1024 * 1024;
/** the clock moves this much per round (the collector runs every 30 s, microbatches and claims go after 10 min) */
const ROUND_MS = 60_000;

/** Bytes under a folder. */
function folderBytes(dir: string): number {
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    total += e.isDirectory() ? folderBytes(p) : statSync(p).size;
  }
  return total;
}

interface Footprint {
  blobBytes: number;
  /** (page_count - freelist_count) · page_size: what the rows take, whatever the file's high-water mark */
  dbLiveBytes: number;
  collectedRows: number;
  workLogRows: number;
}

/** Measured through a second, read-only connection (WAL: it sees the last commit). */
function footprint(h: Harness): Footprint {
  const db = new Database(join(h.dir, 'o.sqlite'), { readonly: true });
  try {
    const n = (sql: string): number => (db.prepare(sql).get() as { n: number }).n;
    const pages = n('SELECT page_count AS n FROM pragma_page_count()') - n('SELECT freelist_count AS n FROM pragma_freelist_count()');
    const tables = ['merge_rounds', 'merge_uploads', 'merge_results', 'microbatches', 'hop_claims'];
    const present = new Set((db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[]).map((r) => r.name));
    const missing = tables.filter((t) => !present.has(t));
    assert.deepEqual(missing, [], `tables the bench counts exist (${[...present].join(', ')})`);
    return {
      blobBytes: folderBytes(join(h.dir, 'blobs')),
      dbLiveBytes: pages * n('SELECT page_size AS n FROM pragma_page_size()'),
      collectedRows: tables.reduce((s, t) => s + n(`SELECT COUNT(*) AS n FROM ${t}`), 0),
      workLogRows: n('SELECT COUNT(*) AS n FROM work_log'),
    };
  } finally {
    db.close();
  }
}

async function longRun(log: (line: string) => void): Promise<BenchResult[]> {
  // as an orchestrator without a chain (nobody paid: the work log is folded without waiting for epochs), entries kept 30 min
  const h = await Harness.open({ minerTimeoutMs: 1e12, microbatchDeadlineMs: 1e12, gc: { workRetentionMs: 30 * 60_000, foldUnpaidWork: true } });
  try {
    h.joinMany('m', 4);
    const run = h.createRun({ steps: 4 * (ROUNDS + 1), mergeEvery: 2 });
    beatAll(...h.miners.values());
    const at: Footprint[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      trainMicrobatches(h, run, 4);
      await mergeRoundAll(h, run, round);
      h.advance(ROUND_MS);
      for (const m of h.miners.values()) m.beat(); // miners stay alive across the minute
      h.tick(); // the collector's pass from the clock
      await h.coordinator.gc.settled();
      if (round % 25 === 0) {
        const f = footprint(h);
        at[round] = f;
        log(`round ${round}: blobs ${(f.blobBytes / MB).toFixed(2)} MB, db ${(f.dbLiveBytes / MB).toFixed(2)} MB live, ${f.collectedRows} collectable rows, ${f.workLogRows} work-log rows`);
      }
    }
    assert.deepEqual(h.state.runs.stages(run.id).map((s) => s.round), [ROUNDS, ROUNDS], 'every round completed');
    const [mid, end] = [at[ROUNDS / 2], at[ROUNDS]];
    return [
      { bench: 'scale.gc.rounds200.blob_mb', value: end.blobBytes / MB, unit: 'MB' },
      { bench: 'scale.gc.blob_growth_100_200', value: end.blobBytes / mid.blobBytes, unit: 'ratio' },
      { bench: 'scale.gc.rounds200.db_mb', value: end.dbLiveBytes / MB, unit: 'MB' },
      { bench: 'scale.gc.db_growth_100_200', value: end.dbLiveBytes / mid.dbLiveBytes, unit: 'ratio' },
      { bench: 'scale.gc.rounds200.collected_rows', value: end.collectedRows, unit: 'rows' },
      { bench: 'scale.gc.rounds200.work_log_rows', value: end.workLogRows, unit: 'rows' },
    ];
  } finally {
    await h.close();
  }
}

export const gcBenches: Bench[] = [{ group: 'scale', run: (o: BenchOptions) => longRun(o.log) }];
