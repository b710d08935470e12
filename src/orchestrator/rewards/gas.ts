// What the orchestrator pays gas for on others' behalf, bounded per owner
// (docs/security.md, "Gas the orchestrator pays"). Anyone with a wallet key
// may ask for these, and the orchestrator's account sends the transaction:
//
//   - a deployment: the ModelRegistry's deployed flag set once it serves and
//     cleared once it ends (../models/deployment-registry.ts), two
//     transactions per deploy/undeploy cycle, the owner's signature all it
//     costs the owner;
//   - releasing an escrow that pays for nothing here (POST
//     /escrows/:id/release), one JobEscrow.close;
//   - a credit escrow (POST /credits), closed by the orchestrator when its
//     owner withdraws, paid from at each epoch it owes something.
//
// Each is counted per owner in a sliding hour and refused past its limit
// with a 429 saying when the next is allowed; the registry's flag
// transactions also have a budget for everyone together, past which flag
// changes wait (they are reconciled, so a deploy and undeploy in between
// cost nothing). The counts are the database's where it has them
// (deployments) and this process's otherwise: a restart forgets them, which
// nobody outside can cause.
import { NimbleError } from '../../protocol/errors.ts';

export const HOUR_MS = 3_600_000;

/** The limits, per sliding hour. */
export const GAS_LIMITS = {
  /** deploys of one owner (each deploy/undeploy cycle: two ModelRegistry transactions) */
  deploysPerOwner: 6,
  /** ModelRegistry flag transactions for one owner's models (the operator's deploys and idle undeploys included) */
  registryTxsPerOwner: 12,
  /** ModelRegistry flag transactions for everyone together */
  registryTxs: 60,
  /** escrows released for one owner (POST /escrows/:id/release) */
  escrowReleasesPerOwner: 10,
  /** credit escrows registered by one owner (POST /credits) */
  creditEscrowsPerOwner: 10,
} as const;

/** `ms` as minutes (at least 1), for a message. */
export function minutesOf(ms: number): string {
  const m = Math.max(1, Math.ceil(ms / 60_000));
  return `${m} minute${m === 1 ? '' : 's'}`;
}

/**
 * Events per key in a sliding window, in memory: at most `limit` per
 * `windowMs`. Keys whose events all left the window are forgotten; at most
 * `maxKeys` are kept (the oldest forgotten first).
 */
export class SlidingWindow {
  private readonly events = new Map<string, number[]>();

  constructor(
    readonly limit: number,
    readonly windowMs: number = HOUR_MS,
    private readonly now: () => number = Date.now,
    private readonly maxKeys = 100_000,
  ) {}

  /** Events of `key` in the window now. */
  count(key: string): number {
    return this.live(key).length;
  }

  /** How long until `key` may have one more (0: now). */
  waitMs(key: string): number {
    const live = this.live(key);
    if (live.length < this.limit) return 0;
    return Math.max(1, live[live.length - this.limit] + this.windowMs - this.now());
  }

  /** Records one event of `key`. */
  take(key: string): void {
    const live = this.live(key);
    live.push(this.now());
    this.events.delete(key);
    this.events.set(key, live);
    while (this.events.size > this.maxKeys) this.events.delete(this.events.keys().next().value!);
  }

  /** Takes one event of `key`, or refuses with a 429 `rate_limited` naming `what` and when the next is allowed. */
  takeOrRefuse(key: string, what: string): void {
    const wait = this.waitMs(key);
    if (wait > 0) throw new NimbleError('rate_limited', `${what}: ${this.limit} an hour at most; the next in ${minutesOf(wait)}`, 429);
    this.take(key);
  }

  /** Gives back the last event of `key` (what it was taken for sent nothing). */
  giveBack(key: string): void {
    const list = this.events.get(key);
    list?.pop();
    if (list?.length === 0) this.events.delete(key);
  }

  /**
   * Runs `fn` as one event of `key` (refused with a 429 past the limit);
   * the event is given back when `fn` fails or `spent` says it sent nothing.
   */
  async spend<T>(key: string, what: string, fn: () => Promise<T>, spent: (result: T) => boolean = () => true): Promise<T> {
    this.takeOrRefuse(key, what);
    let result: T;
    try {
      result = await fn();
    } catch (err) {
      this.giveBack(key);
      throw err;
    }
    if (!spent(result)) this.giveBack(key);
    return result;
  }

  private live(key: string): number[] {
    const list = this.events.get(key);
    if (!list) return [];
    const from = this.now() - this.windowMs;
    const live = list.filter((t) => t > from);
    if (live.length === 0) this.events.delete(key);
    else if (live.length !== list.length) this.events.set(key, live);
    return live;
  }
}
