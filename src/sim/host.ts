// The cores of one machine shared by the processes on it (docs/simulation.md,
// "Calibration"): a local network's miners and its orchestrator, each a
// single-thread process. Processor sharing: while n processes have work, each
// runs at min(1, cores ÷ n) of a core, less what time slicing costs when
// there are more processes than cores (`crowdedRate`), so a job's end moves
// whenever another starts or ends. The world schedules one 'host' event at the next end; an
// event whose version is not the current one is stale (something started or
// ended since) and is ignored.

/** What a local network on one machine costs its cores beyond the engine's jobs (SimOptions.host). */
export interface SharedHost {
  /** the machine's cores (hardware threads) */
  cores: number;
  /** per stage: CPU ms a miner spends per microbatch hop beyond the engine's jobs (HTTP, signing, hashing, spot-check records, heartbeats) */
  hopOverheadMs: number[];
  /** CPU ms of the orchestrator's process per trained microbatch, beyond its heartbeats' */
  orchestratorMsPerMicrobatch: number;
  /** CPU ms of the orchestrator's process per heartbeat it answers, whatever the heartbeat reports (absent: 0) */
  orchestratorMsPerHeartbeat?: number;
  /** CPU ms of a miner's process per heartbeat it sends, whatever it reports (absent: 0) */
  minerMsPerHeartbeat?: number;
  /** the spread of a job's time from one job to the next, as a coefficient of variation (0 or absent: every job takes its mean) */
  jobJitter?: number;
  /**
   * The share of its fair share of the cores a process gets when twice as
   * many single-thread processes as cores have work (time slicing: switches,
   * caches refilled); 1 or absent: none lost. Between cores and 2 × cores
   * processes the loss grows linearly from 0, past 2 × cores it stays.
   */
  crowdedRate?: number;
}

/** The speed of each of `n` busy single-thread processes on `cores` cores, as a share of one core (SharedHost.crowdedRate). */
export function processRate(n: number, cores: number, crowdedRate = 1): number {
  if (n <= cores) return 1;
  const crowding = Math.min(1, (n - cores) / cores);
  return (cores / n) * (1 - (1 - crowdedRate) * crowding);
}

/** The key of the orchestrator's process among the miners' indexes. */
export const ORCHESTRATOR = -1;

export class HostCores {
  /** process key → core ms of work left in its current job */
  private readonly running = new Map<number, number>();
  private last = 0;
  /** bumped whenever the set of running processes changes */
  version = 0;
  /** the orchestrator's pieces of work, first the one running: core ms, and the miner whose heartbeat it answers (-1: none) */
  private readonly orchestratorQueue: { ms: number; replyTo: number }[] = [];

  constructor(
    readonly cores: number,
    /** SharedHost.crowdedRate */
    readonly crowdedRate = 1,
  ) {
    if (!(Number.isInteger(cores) && cores >= 1)) throw new RangeError(`a host has a positive whole number of cores, got ${cores}`);
    if (!(crowdedRate > 0 && crowdedRate <= 1)) throw new RangeError(`a host's crowded rate is in (0, 1], got ${crowdedRate}`);
  }

  /** The share of a core each running process gets now. */
  rate(): number {
    return processRate(this.running.size, this.cores, this.crowdedRate);
  }

  /** Whether `key` has work on the cores. */
  has(key: number): boolean {
    return this.running.has(key);
  }

  /** Starts `coreMs` of work for process `key` (which has none running) at `now`. */
  start(key: number, coreMs: number, now: number): void {
    if (this.running.has(key)) throw new Error(`process ${key} already has a job on the host`);
    this.advance(now);
    this.running.set(key, Math.max(0, coreMs));
    this.version++;
  }

  /** Drops process `key`'s work (a miner that left). */
  stop(key: number, now: number): void {
    this.advance(now);
    if (this.running.delete(key)) this.version++;
  }

  /** Adds a piece of orchestrator work (a heartbeat's handling, answering miner `replyTo`); it runs after the pieces before it. */
  addOrchestratorWork(coreMs: number, now: number, replyTo = -1): void {
    this.orchestratorQueue.push({ ms: Math.max(0, coreMs), replyTo });
    if (!this.running.has(ORCHESTRATOR)) this.start(ORCHESTRATOR, coreMs, now);
  }

  /** When the next running job ends at the current rates (Infinity: nothing runs). */
  nextEnd(now: number): number {
    this.advance(now);
    let least = Infinity;
    for (const left of this.running.values()) least = Math.min(least, left);
    return least === Infinity ? Infinity : now + least / this.rate();
  }

  /**
   * What is done by `now`, removed: the miners whose jobs ended, and the
   * miners whose heartbeats the orchestrator has answered (its next piece
   * starts).
   */
  takeDone(now: number): { jobs: number[]; replies: number[] } {
    this.advance(now);
    const jobs: number[] = [];
    const replies: number[] = [];
    const done = [...this.running].filter(([, left]) => left <= 1e-6).map(([key]) => key);
    for (const key of done) {
      this.running.delete(key);
      this.version++;
      if (key !== ORCHESTRATOR) {
        jobs.push(key);
        continue;
      }
      const piece = this.orchestratorQueue.shift()!;
      if (piece.replyTo >= 0) replies.push(piece.replyTo);
      // pieces of no work are answered at once
      while (this.orchestratorQueue.length && this.orchestratorQueue[0].ms <= 0) {
        const r = this.orchestratorQueue.shift()!.replyTo;
        if (r >= 0) replies.push(r);
      }
      if (this.orchestratorQueue.length) this.running.set(ORCHESTRATOR, this.orchestratorQueue[0].ms);
    }
    return { jobs, replies };
  }

  private advance(now: number): void {
    const dt = now - this.last;
    if (dt > 0 && this.running.size > 0) {
      const r = this.rate();
      for (const [key, left] of this.running) this.running.set(key, left - dt * r);
    }
    this.last = Math.max(this.last, now);
  }
}
