// A run's merge rounds as `GET /runs/:id/merges` answers them (the route in
// src/orchestrator/routes/public.ts, the view in
// src/orchestrator/training/merge-rounds-view.ts, the page in web/src/pages/merges.ts):
// for each stage's round what the orchestrator keeps of it (src/orchestrator/
// state/merge-rounds.ts): its phase, replicas, times, partitions, the uploads
// and merged partitions that arrived, and how its partitions were settled.
import { Type, type Static } from '@sinclair/typebox';
import { MergePhase } from './schemas.ts';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });

/** The most rounds (a stage's round each) one answer lists: the newest. */
export const MERGE_ROUNDS_SHOWN = 200;

/**
 * How a round's partitions were settled:
 * - `single`: the stage has one replica, nothing to merge (its own new state is checked and kept);
 * - `pending`: not settled yet (uploading, or merging);
 * - `agreed`: every partition settled on the result its mergers agreed on;
 * - `recomputed`: some partitions were merged by the orchestrator itself (their mergers disagreed, only one delivered, or time ran out), and every merger's result matched;
 * - `mismatch`: some merger's result is not the merge of its inputs (see `mismatches`);
 * - `abandoned`: the round closed with nothing merged (every replica left it before all its slices were in): the stage kept its last state;
 * - `collected`: merged, but its merged partitions were collected once a later round of its stage was done: how they were settled is no longer known.
 */
export const MergeOutcome = Type.Union([
  Type.Literal('single'),
  Type.Literal('pending'),
  Type.Literal('agreed'),
  Type.Literal('recomputed'),
  Type.Literal('mismatch'),
  Type.Literal('abandoned'),
  Type.Literal('collected'),
]);
export type MergeOutcome = Static<typeof MergeOutcome>;

export const MergeRoundView = Type.Object({
  /** the round's number (1 is a stage's first merge) */
  round: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
  stage: Count,
  status: MergePhase,
  /** the replicas taking part: those that vanished, timed out or committed an offence have left it; a round closed with nobody left still names the last ones */
  replicas: Type.Array(Address),
  /** when it opened (ms) */
  startedAt: Ms,
  /**
   * when its current phase began (ms); for a done round, when it closed.
   * An orchestrator restart sets it again for an open round (its timeout
   * starts again).
   */
  phaseAt: Ms,
  /** slices of the stage's parameters merged separately (0: one replica, nothing to merge) */
  partitions: Count,
  /** pseudo-gradient slices received (one per partition and replica) */
  uploads: Count,
  /** merged partitions received from the replicas merging them (the orchestrator's own recomputations not counted) */
  results: Count,
  /** partitions the orchestrator merged itself (a dispute, a single merger, or late mergers) */
  recomputed: Count,
  outcome: MergeOutcome,
  /** per replica, the partitions whose merged result it delivered and everyone applied (each a merge unit of its work) */
  accepted: Type.Array(Type.Object({ miner: Address, partitions: Count })),
  /** merged partitions that are not the merge of their inputs (the one applied differs); an offence of their merger while it was in the round */
  mismatches: Type.Array(Type.Object({ partition: Count, miner: Address })),
  /** whether the stage's new state was uploaded and checked; a done round without it left the stage at its last state */
  stateSaved: Type.Boolean(),
  /**
   * a later round of its stage is done: its uploads and results are deleted
   * by the orchestrator's collector (within 30 s by default), so the counts
   * and `accepted` may be partial or empty
   */
  workCollected: Type.Boolean(),
});
export type MergeRoundView = Static<typeof MergeRoundView>;

/**
 * `GET /runs/:id/merges`: the run's merge rounds the orchestrator keeps, newest
 * first (by round, then stage), at most MERGE_ROUNDS_SHOWN (200) of them. It
 * keeps each stage's latest done round and its open one, and older rounds only
 * while a spot check needs their state; an ended run's rounds are collected.
 */
export const RunMerges = Type.Object({
  runId: Type.String(),
  rounds: Type.Array(MergeRoundView, { maxItems: MERGE_ROUNDS_SHOWN }),
  /** more rounds are kept than listed */
  truncated: Type.Boolean(),
});
export type RunMerges = Static<typeof RunMerges>;
