// A run's merge rounds as GET /runs/:id/merges answers them (src/api/merges.ts):
// each round the state keeps (../state/merge-rounds.ts), with its uploads
// counted and its merged partitions compared with the ones everyone applied
// (./merges.ts settles them; ./merge-checks.ts recomputes disputed ones).
import { MERGE_ROUNDS_SHOWN, type MergeOutcome, type MergeRoundView, type RunMerges } from '../../api/merges.ts';
import { RECOMPUTED } from './merge-checks.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MergeResult, MergeRoundRecord } from '../state/merge-rounds.ts';

/** The run's rounds, newest first, at most `limit` (the caller knows the run exists). */
export function mergeRoundsView(state: OrchestratorState, runId: string, limit: number = MERGE_ROUNDS_SHOWN): RunMerges {
  const rows = state.mergeRounds.roundsOf(runId, limit + 1);
  const latest = new Map(state.runs.stages(runId).map((s) => [s.stage, s.round]));
  const rounds = rows.slice(0, limit).map((r) => roundView(state, r, latest.get(r.stage) ?? 0));
  return { runId, rounds, truncated: rows.length > limit };
}

function roundView(state: OrchestratorState, r: MergeRoundRecord, latestDone: number): MergeRoundView {
  const key = { runId: r.runId, stage: r.stage, round: r.round };
  const results = state.mergeRounds.results(key);
  const workCollected = r.round < latestDone;
  const settled = settlement(r, results, workCollected);
  return {
    round: r.round,
    stage: r.stage,
    status: r.status,
    replicas: r.replicas,
    startedAt: r.startedAt,
    phaseAt: r.plan.phaseAt,
    partitions: r.partitions,
    uploads: state.mergeRounds.uploadCount(key),
    results: results.filter((x) => x.minerId !== RECOMPUTED).length,
    ...settled,
    stateSaved: r.stateBlob !== null,
    workCollected,
  };
}

type Settlement = Pick<MergeRoundView, 'recomputed' | 'outcome' | 'accepted' | 'mismatches'>;

/** How the round's partitions were settled: whose results everyone applies, which were not the merge, which the orchestrator merged. */
function settlement(r: MergeRoundRecord, results: readonly MergeResult[], workCollected: boolean): Settlement {
  const chosen = r.plan.chosen;
  const recomputed = new Set(results.filter((x) => x.minerId === RECOMPUTED).map((x) => x.partition)).size;
  const accepted = new Map<string, number>();
  const mismatches: { partition: number; miner: string }[] = [];
  if (chosen) {
    for (const x of results) {
      if (x.minerId === RECOMPUTED || chosen[x.partition] === undefined) continue;
      if (x.blob === chosen[x.partition]) accepted.set(x.minerId, (accepted.get(x.minerId) ?? 0) + 1);
      else mismatches.push({ partition: x.partition, miner: x.minerId });
    }
  }
  return {
    recomputed,
    outcome: workCollected && results.length === 0 && r.partitions > 0 && r.plan.chosen ? 'collected' : outcomeOf(r, recomputed, mismatches.length),
    accepted: [...accepted].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([miner, partitions]) => ({ miner, partitions })),
    mismatches,
  };
}

function outcomeOf(r: MergeRoundRecord, recomputed: number, mismatches: number): MergeOutcome {
  if (r.partitions === 0) return 'single';
  if (!r.plan.chosen) return r.status === 'done' ? 'abandoned' : 'pending';
  if (mismatches > 0) return 'mismatch';
  return recomputed > 0 ? 'recomputed' : 'agreed';
}
