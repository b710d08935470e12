// Fault injection: how a dishonest miner departs from the protocol, for the
// tests and benchmarks that show each kind of cheat fail (test/network/,
// bench/trust.bench.ts). Not reachable from the command line; a miner
// without it is honest.
import type { SessionRows } from '../inference/stage-inference.ts';
import type { WorkReport } from '../protocol/messages.ts';
import type { ServedStage } from './deployment.ts';

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
  /** alters what a serving stage answers POST /infer with (activation rows or logits) before it is encoded */
  inference?: (output: Float32Array) => void;
}

/**
 * The served stage with `alter` applied to every output of its `run` (the
 * request path's only call that computes), everything else passed through:
 * how a miner with Tamper.inference serves. `s` itself when there is nothing
 * to alter.
 */
export function tamperedServing(s: ServedStage | null, alter: ((output: Float32Array) => void) | undefined): ServedStage | null {
  if (!s || !alter) return s;
  const run = (batch: readonly SessionRows[]): Float32Array => {
    const out = s.inference.run(batch);
    alter(out);
    return out;
  };
  const inference = new Proxy(s.inference, {
    get(target, prop): unknown {
      if (prop === 'run') return run;
      const v: unknown = Reflect.get(target, prop, target);
      return typeof v === 'function' ? (v as (...args: unknown[]) => unknown).bind(target) : v;
    },
  });
  return { ...s, inference };
}
