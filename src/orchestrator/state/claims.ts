// What miners claim to have done: one row per hop (stage and phase) of a
// microbatch's attempt and per claimant, written once (a repeated report
// changes nothing). Claims are evidence, not credit: the microbatch flow
// credits a microbatch's hops once its whole attempt is in and agrees with
// itself (src/orchestrator/training/microbatches.ts), and spot checks hold miners to
// the frame hashes they committed to here. Kept for ten minutes, and as long
// as their microbatch is in flight or a spot check needs them (src/orchestrator/blobs/gc.ts).
import { Type, type Static } from '@sinclair/typebox';
import { all, rowReader, type Migrations, type StateDb } from './db.ts';

export const CLAIM_MIGRATIONS: Migrations = {
  store: 'claims',
  steps: [
    `CREATE TABLE IF NOT EXISTS hop_claims (
      microbatch INTEGER NOT NULL, attempt INTEGER NOT NULL, stage INTEGER NOT NULL, phase TEXT NOT NULL,
      miner_id TEXT NOT NULL, next_id TEXT, input_sha TEXT, output_sha TEXT, loss REAL, round INTEGER NOT NULL, at INTEGER NOT NULL,
      PRIMARY KEY (microbatch, attempt, stage, phase, miner_id)
    );
    CREATE INDEX IF NOT EXISTS hop_claims_by_time ON hop_claims (at)`,
    // the bytes the hop says it sent: the run's traffic counts those of the hops credited
    'ALTER TABLE hop_claims ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0',
  ],
};

const Int = Type.Integer({ minimum: 0 });
const Sha = Type.Union([Type.String({ pattern: '^[0-9a-f]{64}$' }), Type.Null()]);
export const HopPhase = Type.Union([Type.Literal('forward'), Type.Literal('backward')]);
export type HopPhase = Static<typeof HopPhase>;

const ClaimRow = Type.Object({
  microbatch: Int,
  attempt: Int,
  stage: Int,
  phase: HopPhase,
  minerId: Type.String(),
  /** the miner the frame went to, proven by its receipt (forward: next stage; backward: previous stage) */
  nextId: Type.Union([Type.String(), Type.Null()]),
  /** sha256 of the frame received / sent */
  inputSha: Sha,
  outputSha: Sha,
  /** the loss reported (last stage, forward) */
  loss: Type.Union([Type.Number(), Type.Null()]),
  /** the stage's merge round when the hop was claimed: the weights it ran with start there */
  round: Int,
  at: Int,
  /** bytes of the frame it sent on */
  bytes: Int,
});
export type HopClaim = Static<typeof ClaimRow>;
const COLUMNS = 'microbatch, attempt, stage, phase, miner_id AS minerId, next_id AS nextId, input_sha AS inputSha, output_sha AS outputSha, loss, round, at, bytes';
const decode = rowReader(ClaimRow, 'hop claim');

export class ClaimStore {
  constructor(private readonly db: StateDb) {}

  /** Records a claim; false when the same claimant already claimed that hop (nothing changes then). */
  put(c: HopClaim): boolean {
    return (
      this.db.run(
        `INSERT OR IGNORE INTO hop_claims (microbatch, attempt, stage, phase, miner_id, next_id, input_sha, output_sha, loss, round, at, bytes)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        c.microbatch,
        c.attempt,
        c.stage,
        c.phase,
        c.minerId,
        c.nextId,
        c.inputSha,
        c.outputSha,
        c.loss,
        c.round,
        c.at,
        c.bytes,
      ).changes === 1
    );
  }

  /** Every claim of a microbatch's attempt. */
  ofAttempt(microbatch: number, attempt: number): HopClaim[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM hop_claims WHERE microbatch = ? AND attempt = ? ORDER BY stage, phase, at, miner_id`, microbatch, attempt);
  }

  /** The claims of one hop of an attempt (one per claimant). */
  ofHop(microbatch: number, attempt: number, stage: number, phase: HopPhase): HopClaim[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM hop_claims WHERE microbatch = ? AND attempt = ? AND stage = ? AND phase = ? ORDER BY at, miner_id`, microbatch, attempt, stage, phase);
  }

  /** Deletes at most `limit` claims made before `at`, except the claims of the microbatches in `keep`; returns how many went. */
  deleteBefore(at: number, keep: readonly number[], limit: number): number {
    return this.db.run(
      `DELETE FROM hop_claims WHERE rowid IN (
         SELECT rowid FROM hop_claims WHERE at < ? AND microbatch NOT IN (SELECT CAST(value AS INTEGER) FROM json_each(?)) ORDER BY at LIMIT ?
       )`,
      at,
      JSON.stringify(keep),
      limit,
    ).changes;
  }
}
