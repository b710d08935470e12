// Scoring an epoch (pure): each miner's score from the work log rows of the
// epoch, and the epoch's emission split in proportion to the scores in exact
// integer arithmetic.
//
//   weight(unit) = the share of the model's parameters held by the stage the
//                  unit was logged for (rangeParamCount(stage) / total)
//   score(miner) = max(0, Σ done units·w − 3·Σ dropped units·w − 5·Σ invalid units·w
//                         − 10·Σ failed spot checks·w)
//
// Done units are forward, backward, merge (one merged partition) and
// inference (tokens run through a stage of a deployed model, per
// INFERENCE_TOKENS_PER_UNIT in src/orchestrator/serving/billing.ts, weighed
// by the stage's share of the deployment's parameters). A dropped
// unit (a microbatch lost while held, a missing pseudo-gradient) costs 3 done
// units, as in IOTA; an invalid one (a malformed or forged request, a report
// that does not match the assignment, a peer refusing what the miner sent)
// costs 5, because it is deliberate or broken rather than merely slow. A
// failed spot check (src/orchestrator/training/spot-checks.ts: a forward whose
// recomputation disagrees with what the miner sent, or a check left
// unanswered) costs 10: it is evidence of wrong work passed on to others.
import { parseModelRef, rangeParams } from '../../model/model-ref.ts';
import type { WorkKind } from '../../api/schemas.ts';
import type { WorkRecord } from '../state/ledger.ts';

export const DROPPED_PENALTY = 3;
export const INVALID_PENALTY = 5;
export const FAILED_CHECK_PENALTY = 10;
/** Scores are quantized to 1e-9 of a unit before the integer split. */
const SCORE_SCALE = 1e9;

/** The fields of a work log entry that scoring reads (inference work names its deployment instead of a run). */
export type WorkRow = Pick<WorkRecord, 'minerId' | 'runId' | 'kind' | 'units' | 'stage'> & { deploymentId?: string | null };

/** Per run id and per deployment id (ids never collide: run-…, dep-…): each stage's share of the model's parameters (sums to 1). */
export type StageShares = Record<string, number[]>;

/** What a work row's stage shares are keyed by: its run, else its deployment. */
export function sharesKey(r: Pick<WorkRow, 'runId' | 'deploymentId'>): string | null {
  return r.runId ?? r.deploymentId ?? null;
}

/** Stage shares of a run of `model` (a model reference) from its stage ranges (parts [from, to)); an MLP's one stage holds it all. */
export function stageSharesOf(model: string, ranges: readonly { from: number; to: number }[]): number[] {
  const ref = parseModelRef(model);
  const counts = ranges.map((r) => rangeParams(ref, r));
  const total = counts.reduce((a, b) => a + b, 0);
  return counts.map((c) => (total > 0 ? c / total : 0));
}

/**
 * The weight of one unit: its stage's share; a unit whose stage is unknown
 * counts as an average stage of its run or deployment (1 / stages); one with no run at all
 * (a refused request) as the average stage over the epoch's runs, else 1.
 */
export function unitWeight(shares: StageShares, key: string | null, stage: number | null): number {
  if (key !== null && shares[key]) {
    const s = shares[key];
    if (stage !== null && stage >= 0 && stage < s.length) return s[stage];
    return 1 / s.length;
  }
  const runs = Object.values(shares).filter((s) => s.length > 0);
  if (runs.length === 0) return 1;
  return runs.reduce((a, s) => a + 1 / s.length, 0) / runs.length;
}

export interface MinerScore {
  miner: string;
  /** weighted done units */
  work: number;
  /** weighted penalty (already multiplied by 3 or 5) */
  penalty: number;
  /** max(0, work − penalty) */
  score: number;
  units: Record<WorkKind, number>;
}

/** Scores every miner that appears in `rows`, sorted by address. */
export function scoreEpoch(rows: readonly WorkRow[], shares: StageShares): MinerScore[] {
  const byMiner = new Map<string, MinerScore>();
  for (const r of rows) {
    let m = byMiner.get(r.minerId);
    if (!m) {
      m = { miner: r.minerId, work: 0, penalty: 0, score: 0, units: { forward: 0, backward: 0, merge: 0, inference: 0, dropped: 0, invalid: 0, failed_check: 0 } };
      byMiner.set(r.minerId, m);
    }
    if (!(r.units > 0) || !Number.isFinite(r.units)) continue;
    const w = unitWeight(shares, sharesKey(r), r.stage);
    m.units[r.kind] += r.units;
    if (r.kind === 'forward' || r.kind === 'backward' || r.kind === 'merge' || r.kind === 'inference') m.work += r.units * w;
    else if (r.kind === 'dropped') m.penalty += DROPPED_PENALTY * r.units * w;
    else if (r.kind === 'invalid') m.penalty += INVALID_PENALTY * r.units * w;
    else if (r.kind === 'failed_check') m.penalty += FAILED_CHECK_PENALTY * r.units * w;
  }
  const out = [...byMiner.values()];
  for (const m of out) m.score = Math.max(0, m.work - m.penalty);
  return out.sort((a, b) => (a.miner < b.miner ? -1 : a.miner > b.miner ? 1 : 0));
}

export interface Split {
  rewards: { miner: string; score: number; amount: bigint }[];
  /** emission − Σ amounts: the rounding remainder (or everything when no miner scored); never minted */
  remainder: bigint;
}

/**
 * Splits `emission` (wei) in proportion to the scores: amount_i =
 * floor(emission · q_i / Σq) with q_i the score quantized to 1e-9. The
 * rounding remainder (less than one wei per miner) stays undistributed: it is
 * simply not minted. Σ amounts + remainder == emission always.
 */
export function splitEmission(scores: readonly { miner: string; score: number }[], emission: bigint): Split {
  if (emission < 0n) throw new RangeError('emission must not be negative');
  const q = scores.map((s) => (Number.isFinite(s.score) && s.score > 0 ? BigInt(Math.round(s.score * SCORE_SCALE)) : 0n));
  const total = q.reduce((a, b) => a + b, 0n);
  const rewards = scores.map((s, i) => ({ miner: s.miner, score: s.score, amount: total > 0n ? (emission * q[i]) / total : 0n }));
  const paid = rewards.reduce((a, r) => a + r.amount, 0n);
  return { rewards, remainder: emission - paid };
}
