// Fault injection: how a dishonest miner departs from the protocol, for the
// tests and benchmarks that show each kind of cheat fail (test/network/,
// bench/trust.bench.ts). Not reachable from the command line; a miner
// without it is honest.
import type { WorkReport } from '../protocol/messages.ts';

export interface Tamper {
  /** alters each activation before it is sent on */
  activation?: (activation: Float32Array) => void;
  /** alters the loss the last stage reports */
  loss?: (loss: number) => number;
  /** rewrites the reports each heartbeat carries: repeats, made-up claims, blame */
  reports?: (reports: WorkReport[]) => WorkReport[];
  /** alters this replica's pseudo-gradient before it is encoded and uploaded */
  pseudoGradient?: (delta: Float32Array) => void;
  /** the inner steps this replica claims for a merge round, from the true count */
  samples?: (samples: number) => number;
  /** alters each partition this replica merges before it is encoded and uploaded */
  merged?: (merged: Float32Array) => void;
  /**
   * lazy weights: the stage's weights are zero and stay zero (no inner step),
   * so every block passes its input through unchanged, as a miner that skips
   * the work would
   */
  lazy?: boolean;
}
