// The order a miner takes its queued jobs in (./pipeline.ts, and the
// simulator's miners, src/sim/flow.ts): one forward, one backward (1F1B, as
// PipeDream schedules a stage). After a backward, a forward goes next if one
// can start (a free activation slot); otherwise a backward goes first.
// Backwards alone first would let a stage that holds many microbatches run a
// whole train of returning gradients while its forwards wait, and the stages
// after it starve: the simulated home-4090 pipeline settled at 65% busy that
// way instead of 79% (docs/simulation.md, "Home RTX 4090s alone").

/** The index in `queue` of the job to take next (-1: none can start): `slotFree` when a forward could take a slot, `lastWasBackward` when the job taken last was a backward. */
export function nextJobIndex(queue: readonly { kind: string }[], slotFree: boolean, lastWasBackward: boolean): number {
  const backward = queue.findIndex((j) => j.kind === 'backward');
  const forward = slotFree ? queue.findIndex((j) => j.kind !== 'backward') : -1;
  return lastWasBackward && forward >= 0 ? forward : backward >= 0 ? backward : forward;
}
