// Merge rounds of a stage's replicas, the pseudo-gradient partitions they
// upload and the merged partitions their mergers upload.
//
// A round is uploading → merging → applying → done (or straight to applying
// when the stage has one replica). `replicas` are the miners taking part (a
// replica that vanishes is dropped); `plan` holds the mergers of each
// partition, the merged blob every replica applies once chosen, and when the
// current phase began.
import { Type, type Static } from '@sinclair/typebox';
import { MergePhase } from '../../api/schemas.ts';
import { Aggregator } from '../../protocol/messages.ts';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const MERGE_ROUND_MIGRATIONS: Migrations = {
  store: 'merge_rounds',
  steps: [
    `CREATE TABLE IF NOT EXISTS merge_rounds (
      run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, status TEXT NOT NULL,
      partitions INTEGER NOT NULL, replicas TEXT NOT NULL, assignment TEXT NOT NULL, started_at INTEGER NOT NULL,
      state_blob TEXT,
      PRIMARY KEY (run_id, stage, round)
    );
    CREATE TABLE IF NOT EXISTS merge_uploads (
      run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, miner_id TEXT NOT NULL,
      partition INTEGER NOT NULL, blob TEXT NOT NULL, samples INTEGER NOT NULL,
      PRIMARY KEY (run_id, stage, round, miner_id, partition)
    );
    CREATE TABLE IF NOT EXISTS merge_results (
      run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, partition INTEGER NOT NULL,
      miner_id TEXT NOT NULL, blob TEXT NOT NULL,
      PRIMARY KEY (run_id, stage, round, partition, miner_id)
    )`,
    // the L2 norm of each uploaded pseudo-gradient slice, which bounds the others'
    'ALTER TABLE merge_uploads ADD COLUMN norm REAL NOT NULL DEFAULT 0',
  ],
};

const BlobId = Type.String({ pattern: '^[0-9a-f]{64}$' });
const Int = Type.Integer({ minimum: 0 });

/** How the round merges (src/merge/merge-partition.ts), fixed when merging starts. */
export const RoundRule = Type.Object({
  aggregator: Aggregator,
  trim: Type.Number({ minimum: 0, maximum: 0.5 }),
  /** per partition: the largest norm a replica's slice keeps */
  maxNorms: Type.Array(Type.Number({ minimum: 0 })),
  /** per partition: the median norm of this round's slices (the next round's reference) */
  medians: Type.Array(Type.Number({ minimum: 0 })),
});
export type RoundRule = Static<typeof RoundRule>;

/** The round's assignments: who merges what, how, and what everyone applies. */
export const RoundPlan = Type.Object({
  /** for each partition, the replicas that merge it */
  mergers: Type.Array(Type.Array(Type.String())),
  /** for each partition, the merged blob every replica applies (fixed when applying starts) */
  chosen: Type.Union([Type.Array(BlobId), Type.Null()]),
  /** when the current phase began (ms) */
  phaseAt: Int,
  /** how partitions are merged (null until merging starts) */
  rule: Type.Optional(Type.Union([RoundRule, Type.Null()])),
});
export type RoundPlan = Static<typeof RoundPlan>;

const Replicas = Type.Array(Type.String());

const RoundRow = Type.Object({
  runId: Type.String(),
  stage: Int,
  round: Int,
  status: MergePhase,
  partitions: Int,
  replicas: Type.String(),
  plan: Type.String(),
  startedAt: Int,
  stateBlob: Type.Union([BlobId, Type.Null()]),
});

export interface MergeRoundRecord extends Omit<Static<typeof RoundRow>, 'replicas' | 'plan'> {
  replicas: string[];
  plan: RoundPlan;
}

const ROUND_COLUMNS = 'run_id AS runId, stage, round, status, partitions, replicas, assignment AS plan, started_at AS startedAt, state_blob AS stateBlob';
const readRound = rowReader(RoundRow, 'merge round');
function decodeRound(row: unknown): MergeRoundRecord {
  const r = readRound(row);
  const what = `merge round ${r.runId}/${r.stage}/${r.round}`;
  return { ...r, replicas: jsonColumn(Replicas, r.replicas, `replicas of ${what}`), plan: jsonColumn(RoundPlan, r.plan, `plan of ${what}`) };
}

const UploadRow = Type.Object({ minerId: Type.String(), partition: Int, blob: BlobId, samples: Int, norm: Type.Number({ minimum: 0 }) });
export type MergeUpload = Static<typeof UploadRow>;
const decodeUpload = rowReader(UploadRow, 'merge upload');

const ResultRow = Type.Object({ partition: Int, minerId: Type.String(), blob: BlobId });
export type MergeResult = Static<typeof ResultRow>;
const decodeResult = rowReader(ResultRow, 'merge result');

const decodeBlob = rowReader(Type.Object({ blob: Type.Union([BlobId, Type.Null()]) }), 'collected blob');
const decodeRunId = rowReader(Type.Object({ runId: Type.String() }), 'run id');
const decodeStage = rowReader(Type.Object({ stage: Int }), 'stage');
const decodeFound = rowReader(Type.Object({ found: Int }), 'blob reference');
/** The largest round number a SQL bound takes (rounds never get near it). */
const NO_ROUND = Number.MAX_SAFE_INTEGER;

/** Which round: a run's stage and round number. */
export interface RoundKey {
  runId: string;
  stage: number;
  round: number;
}

/** What may change in a round as it advances. */
export interface RoundChange {
  status?: MergePhase;
  replicas?: readonly string[];
  plan?: RoundPlan;
  stateBlob?: string;
}

export class MergeRoundStore {
  constructor(private readonly db: StateDb) {}

  /** Opens a round (replacing a stale row of the same number). */
  open(k: RoundKey, r: { status: MergePhase; partitions: number; replicas: readonly string[]; plan: RoundPlan; startedAt: number }): void {
    this.db.run(
      `INSERT INTO merge_rounds (run_id, stage, round, status, partitions, replicas, assignment, started_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (run_id, stage, round) DO UPDATE SET status = excluded.status, partitions = excluded.partitions, replicas = excluded.replicas,
         assignment = excluded.assignment, started_at = excluded.started_at, state_blob = NULL`,
      k.runId,
      k.stage,
      k.round,
      r.status,
      r.partitions,
      JSON.stringify(r.replicas),
      JSON.stringify(r.plan),
      r.startedAt,
    );
  }

  get(k: RoundKey): MergeRoundRecord | undefined {
    return one(this.db, decodeRound, `SELECT ${ROUND_COLUMNS} FROM merge_rounds WHERE run_id = ? AND stage = ? AND round = ?`, k.runId, k.stage, k.round);
  }

  update(k: RoundKey, c: RoundChange): void {
    const sets: [string, string | undefined][] = [
      ['status', c.status],
      ['replicas', c.replicas && JSON.stringify(c.replicas)],
      ['assignment', c.plan && JSON.stringify(c.plan)],
      ['state_blob', c.stateBlob],
    ];
    const given = sets.filter((x): x is [string, string] => x[1] !== undefined);
    if (given.length === 0) return;
    this.db.run(
      `UPDATE merge_rounds SET ${given.map(([col]) => `${col} = ?`).join(', ')} WHERE run_id = ? AND stage = ? AND round = ?`,
      ...given.map(([, v]) => v),
      k.runId,
      k.stage,
      k.round,
    );
  }

  /** A replica's pseudo-gradient slice of one partition (a re-upload replaces it). */
  putUpload(k: RoundKey, u: MergeUpload): void {
    this.db.run(
      `INSERT INTO merge_uploads (run_id, stage, round, miner_id, partition, blob, samples, norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (run_id, stage, round, miner_id, partition) DO UPDATE SET blob = excluded.blob, samples = excluded.samples, norm = excluded.norm`,
      k.runId,
      k.stage,
      k.round,
      u.minerId,
      u.partition,
      u.blob,
      u.samples,
      u.norm,
    );
  }

  uploads(k: RoundKey): MergeUpload[] {
    return all(
      this.db,
      decodeUpload,
      'SELECT miner_id AS minerId, partition, blob, samples, norm FROM merge_uploads WHERE run_id = ? AND stage = ? AND round = ? ORDER BY partition, miner_id',
      k.runId,
      k.stage,
      k.round,
    );
  }

  /** A merger's result for one partition (a re-upload replaces it). */
  putResult(k: RoundKey, r: MergeResult): void {
    this.db.run(
      `INSERT INTO merge_results (run_id, stage, round, partition, miner_id, blob) VALUES (?, ?, ?, ?, ?, ?)
       ON CONFLICT (run_id, stage, round, partition, miner_id) DO UPDATE SET blob = excluded.blob`,
      k.runId,
      k.stage,
      k.round,
      r.partition,
      r.minerId,
      r.blob,
    );
  }

  results(k: RoundKey): MergeResult[] {
    return all(
      this.db,
      decodeResult,
      'SELECT partition, miner_id AS minerId, blob FROM merge_results WHERE run_id = ? AND stage = ? AND round = ? ORDER BY partition, miner_id',
      k.runId,
      k.stage,
      k.round,
    );
  }

  // ---- reading a run's rounds (GET /runs/:id/merges) ---------------------------

  /**
   * A run's rounds, newest first (by round, then stage), at most `limit`.
   * No index of its own: the primary key finds the run's rows, and the
   * collector keeps few of them (src/orchestrator/blobs/gc.ts), so the sort is small.
   */
  roundsOf(runId: string, limit: number): MergeRoundRecord[] {
    return all(this.db, decodeRound, `SELECT ${ROUND_COLUMNS} FROM merge_rounds WHERE run_id = ? ORDER BY round DESC, stage LIMIT ?`, runId, limit);
  }

  /** How many pseudo-gradient slices a round has received (one per replica and partition). */
  uploadCount(k: RoundKey): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM merge_uploads WHERE run_id = ? AND stage = ? AND round = ?', k.runId, k.stage, k.round);
  }

  // ---- collection (src/orchestrator/blobs/gc.ts) ------------------------------------

  /** Runs with rows kept here (rounds, uploads or results). */
  runIds(): string[] {
    return all(
      this.db,
      decodeRunId,
      'SELECT run_id AS runId FROM merge_rounds UNION SELECT run_id FROM merge_uploads UNION SELECT run_id FROM merge_results ORDER BY runId',
    ).map((r) => r.runId);
  }

  /** Stages of a run with rows kept here. */
  stagesOf(runId: string): number[] {
    return all(
      this.db,
      decodeStage,
      `SELECT stage FROM merge_rounds WHERE run_id = ? UNION SELECT stage FROM merge_uploads WHERE run_id = ?
       UNION SELECT stage FROM merge_results WHERE run_id = ? ORDER BY stage`,
      runId,
      runId,
      runId,
    ).map((r) => r.stage);
  }

  /**
   * Deletes at most `limit` rounds of a stage outside rounds [keep.from,
   * keep.to] (null: no upper end), with their uploads and results; returns
   * how many rounds went and the blobs the deleted rows named (to be deleted
   * once nothing else does).
   */
  deleteRounds(runId: string, stage: number, keep: { from: number; to: number | null }, limit: number): { rounds: number; blobs: string[] } {
    const to = keep.to ?? NO_ROUND;
    const rounds = all(
      this.db,
      decodeBlob,
      `DELETE FROM merge_rounds WHERE rowid IN (
         SELECT rowid FROM merge_rounds WHERE run_id = ? AND stage = ? AND (round < ? OR round > ?) ORDER BY round LIMIT ?
       ) RETURNING state_blob AS blob`,
      runId,
      stage,
      keep.from,
      to,
      limit,
    );
    const work = this.deleteWork(runId, stage, (round) => `(${round} < ? OR ${round} > ?)`, [keep.from, to], limit);
    return { rounds: rounds.length, blobs: [...rounds.map((r) => r.blob), ...work].filter((b): b is string => b !== null) };
  }

  /** Deletes at most `limit` uploads and `limit` results of a stage's rounds before `round`; returns the blobs they named. */
  deleteWorkBefore(runId: string, stage: number, round: number, limit: number): string[] {
    return this.deleteWork(runId, stage, (col) => `${col} < ?`, [round], limit);
  }

  private deleteWork(runId: string, stage: number, where: (col: string) => string, bounds: number[], limit: number): string[] {
    const out: string[] = [];
    for (const table of ['merge_uploads', 'merge_results']) {
      const rows = all(
        this.db,
        decodeBlob,
        `DELETE FROM ${table} WHERE rowid IN (
           SELECT rowid FROM ${table} WHERE run_id = ? AND stage = ? AND ${where('round')} ORDER BY round LIMIT ?
         ) RETURNING blob`,
        runId,
        stage,
        ...bounds,
        limit,
      );
      for (const r of rows) if (r.blob !== null) out.push(r.blob);
    }
    return out;
  }

  /** Whether a kept row still needs `blob`: a round's state, an upload, a result, or a merged partition an open round applies. */
  references(blob: string): boolean {
    const found = one(
      this.db,
      decodeFound,
      `SELECT EXISTS (SELECT 1 FROM merge_rounds WHERE state_blob = ?)
         OR EXISTS (SELECT 1 FROM merge_uploads WHERE blob = ?)
         OR EXISTS (SELECT 1 FROM merge_results WHERE blob = ?)
         OR EXISTS (SELECT 1 FROM merge_rounds WHERE status != 'done' AND instr(assignment, ?) > 0) AS found`,
      blob,
      blob,
      blob,
      blob,
    );
    return found?.found === 1;
  }
}
