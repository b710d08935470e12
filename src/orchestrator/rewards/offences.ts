// Offences: work the orchestrator can show was false, in one place.
//
//   - a forward its recomputation contradicts, or a spot check left unanswered
//     (src/orchestrator/training/spot-checks.ts)
//   - served inference answers their recomputation contradicts
//     (src/orchestrator/serving/checks.ts)
//   - a pseudo-gradient no honest AdamW steps could produce, or a stage state
//     that is not the round's (src/orchestrator/training/merge-checks.ts)
//   - a merged partition that is not the merge of its inputs
//     (src/orchestrator/training/merges.ts)
//   - a receipt that does not verify, or a claim of work issued to another
//     miner or never issued (src/orchestrator/training/microbatches.ts)
//
// Honest code cannot commit any of them: each is a bound or a bit-exact
// recomputation, never a threshold an unlucky honest miner could cross. Each
// costs its miner penalty units in the work log and, on a paid network, a
// slash of `fraction` of what it has staked then (src/orchestrator/rewards/epochs.ts
// sends it), once per offence: its key is unique and becomes the on-chain
// reason. And the miner is evicted, its joins refused for BAN_MS: a cheat
// does not stay in the pipeline while its stake runs down (a lazy miner's
// pass-through forwards would keep reaching honest miners), and cannot
// rejoin at once to do it again. A spot check left unanswered is penalized
// and slashed but evicts nobody: the miner may simply have crashed. A
// request that is merely malformed (a 400 that could be a version mismatch)
// costs penalty units only (src/orchestrator/http.ts).
import type { WorkKind } from '../../api/schemas.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { OrchestratorState } from '../state/index.ts';

export interface SlashingOptions {
  /** slash offences (the network pays, so there is stake to slash) */
  enabled: boolean;
  /** share of its stake (and unstaking tokens) a miner loses per offence */
  fraction: number;
}

/**
 * 5% an offence: honest miners commit none, and a cheat caught k times keeps
 * 0.95^k of its stake, however its work is split across identities; with the
 * stake at the minimum, the first slash also evicts it.
 */
export const SLASHING_DEFAULTS: SlashingOptions = { enabled: false, fraction: 0.05 };

/** How long a miner evicted for an offence may not join again. */
export const BAN_MS = 10 * 60_000;

export interface Offence {
  minerId: string;
  runId: string | null;
  stage: number | null;
  kind: Extract<WorkKind, 'invalid' | 'failed_check'>;
  /** penalty units (default 1) */
  units?: number;
  detail: string;
  /** names the offence, unique: a second charge under the same key slashes nothing more */
  key: string;
  /** the failed spot check, when it is one */
  checkId?: number;
  /** evict the miner (default true; false for a check left unanswered) */
  evict?: boolean;
}

/** A refusal that proves its sender cheated (400, like any invalid request), charged as an offence. */
export class OffenceError extends NimbleError {
  constructor(
    message: string,
    /** the offence, less the miner (the request's signer) */
    readonly offence: Omit<Offence, 'minerId' | 'detail' | 'kind'>,
  ) {
    super('invalid', message);
  }
}

export class Offences {
  readonly options: SlashingOptions;

  constructor(
    private readonly state: OrchestratorState,
    options: Partial<SlashingOptions> = {},
    /** removes a miner from the network, refusing its joins until `bannedUntil` */
    private readonly evict: (minerId: string, reason: string, bannedUntil: number) => void = () => {},
  ) {
    this.options = { ...SLASHING_DEFAULTS, ...options };
    const f = this.options.fraction;
    if (!(f >= 0 && f <= 1)) throw new RangeError(`slash fraction must be in [0, 1], got ${f}`);
  }

  /** Logs the penalty, on a paid network a pending slash, and evicts the miner. Call inside the transaction that decides the offence. */
  charge(o: Offence, now: number): void {
    this.state.ledger.logWork({ minerId: o.minerId, runId: o.runId, kind: o.kind, units: o.units ?? 1, stage: o.stage, detail: o.detail }, now);
    if (this.options.enabled && this.options.fraction > 0) {
      this.state.ledger.putSlash({
        epoch: this.state.ledger.openEpoch(now).id,
        miner: o.minerId,
        checkId: o.checkId ?? null,
        fraction: this.options.fraction,
        reason: `nimble ${o.key}`.slice(0, 256),
      });
    }
    if (o.evict === false) return;
    const until = now + BAN_MS;
    this.evict(o.minerId, `evicted until ${new Date(until).toISOString()} for an offence: ${o.detail.slice(0, 300)}`, until);
  }
}
