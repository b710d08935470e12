// The orchestrator's routing rules as pure functions, so that the simulator
// (src/sim/) runs the very rules the network runs: how many microbatches the
// pipeline and each stage-0 replica may hold, how the next stage's replicas
// are weighed, and when a merge is due.

/** Microbatches the whole pipeline may hold: two slots' worth per replica of its narrowest stage (deeper queues only miss deadlines). */
export function pipelineRoom(slots: number, replicasPerStage: readonly number[]): number {
  return 2 * slots * Math.min(...replicasPerStage);
}

/** Microbatches one stage-0 replica may hold: two slots' worth (those it runs and those queued behind them), and at most its share of the room. */
export function replicaIssueLimit(slots: number, replicasPerStage: readonly number[]): number {
  return Math.min(2 * slots, Math.ceil(pipelineRoom(slots, replicasPerStage) / replicasPerStage[0]));
}

/** The router's weight of a replica: measured speed over its current queue (the sender draws the next hop in proportion). */
export function peerWeight(gflops: number, queue: number): number {
  return gflops / (1 + queue);
}

/** Whether a merge is due: the run's inner steps since the last merge reach mergeEvery per replica of its widest stage. */
export function mergeDue(innerSteps: number, mergeEvery: number, maxReplicas: number): boolean {
  return innerSteps > 0 && innerSteps >= mergeEvery * Math.max(1, maxReplicas);
}
