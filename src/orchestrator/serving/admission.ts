// Admission on the serving path (docs/inference.md, "Serve"): a stage miner
// keeps a KV cache for at most `sessions` generations (its deployment's
// setting), so the orchestrator counts the generations it has routed to each
// miner and starts a generation only on replicas with room. When every
// replica of a stage is full, the request waits in its deployment's queue
// (first come, first served) until a generation ends, at most WAIT_MS; a
// queue already holding QUEUE_PER_SLOT times the deployment's room, a wait
// that runs out, or a client that leaves, ends it: 503 `overloaded` (499 for
// the client gone), before anything was generated or charged.
import type { Peer } from '../../protocol/messages.ts';
import { OpenAiError } from './completion-request.ts';

/** How long a request waits for room at most. */
export const WAIT_MS = 30_000;
/** A deployment's queue holds at most this many requests per generation it has room for. */
export const QUEUE_PER_SLOT = 2;
/** How often a waiting request checks whether its client left. */
const ABORT_POLL_MS = 250;

interface Waiter {
  /** a route with room, or null */
  pick(): Peer[] | null;
  resolve(route: Peer[]): void;
  reject(err: Error): void;
}

export interface AdmissionOptions {
  waitMs?: number;
}

export class Admission {
  private readonly load = new Map<string, number>();
  private readonly queues = new Map<string, Waiter[]>();
  private readonly waitMs: number;

  constructor(options: AdmissionOptions = {}) {
    this.waitMs = options.waitMs ?? WAIT_MS;
  }

  /** Generations routed to miner `id` now. */
  loadOf(id: string): number {
    return this.load.get(id) ?? 0;
  }

  /** Requests waiting for room on deployment `key`. */
  waiting(key: string): number {
    return this.queues.get(key)?.length ?? 0;
  }

  /**
   * A route for a new generation on deployment `key`: `pick()`'s as soon as
   * it finds one with room and no request waits before this one. The route's
   * miners are counted until `release`. `room` is how many generations the
   * deployment holds at once (it bounds the queue).
   */
  admit(key: string, what: string, pick: () => Peer[] | null, room: number, aborted: () => boolean = () => false): Promise<Peer[]> {
    const queue = this.queues.get(key) ?? [];
    if (queue.length === 0) {
      const route = pick();
      if (route) {
        this.take(route);
        return Promise.resolve(route);
      }
    }
    if (queue.length >= QUEUE_PER_SLOT * Math.max(1, room)) {
      return Promise.reject(new OpenAiError(503, `${what} is busy: ${room} generations at once and ${queue.length} requests waiting; try again later`, 'overloaded'));
    }
    return new Promise<Peer[]>((resolve, reject) => {
      const end = (): void => {
        clearTimeout(timer);
        clearInterval(poll);
        const q = this.queues.get(key);
        const i = q?.indexOf(w) ?? -1;
        if (q && i >= 0) q.splice(i, 1);
        if (q && q.length === 0) this.queues.delete(key);
      };
      const w: Waiter = {
        pick,
        resolve: (route) => {
          end();
          resolve(route);
        },
        reject: (err) => {
          end();
          reject(err);
        },
      };
      const giveUp = (err: Error): void => {
        w.reject(err);
        // the next one may fit where this one would not have
        this.wake(key);
      };
      const timer = setTimeout(() => giveUp(new OpenAiError(503, `${what} is busy: no room for this request within ${Math.round(this.waitMs / 1000)} s; try again later`, 'overloaded')), this.waitMs);
      const poll = setInterval(() => {
        if (aborted()) giveUp(new OpenAiError(499, 'the client went away', 'client_closed'));
      }, ABORT_POLL_MS);
      queue.push(w);
      this.queues.set(key, queue);
    });
  }

  /** A generation moved from miner `from` to miner `to` (a failover). */
  move(from: string, to: string): void {
    this.load.set(to, this.loadOf(to) + 1);
    this.release([from]);
  }

  /** A generation on the miners `minerIds` ended: they have room again, and waiting requests are let in. */
  release(minerIds: readonly string[]): void {
    for (const id of minerIds) {
      const n = this.loadOf(id) - 1;
      if (n > 0) this.load.set(id, n);
      else this.load.delete(id);
    }
    for (const key of [...this.queues.keys()]) this.wake(key);
  }

  private take(route: readonly Peer[]): void {
    for (const p of route) this.load.set(p.id, this.loadOf(p.id) + 1);
  }

  /** Lets in the requests at the head of `key`'s queue while routes with room are found. */
  private wake(key: string): void {
    const q = this.queues.get(key);
    while (q && q.length > 0) {
      const w = q[0];
      let route: Peer[] | null;
      try {
        route = w.pick();
      } catch (err) {
        // the deployment stopped serving while it waited
        w.reject(err as Error);
        continue;
      }
      if (!route) return;
      this.take(route);
      w.resolve(route);
    }
  }
}
