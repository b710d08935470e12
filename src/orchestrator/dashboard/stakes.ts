// Each miner's stake as the Network page shows it (docs/dashboard.md): read
// from the chain in the background, never while a section is built. The
// miners section asks `get(address)` once a second while someone watches; a
// live miner's stake is read again when its last read is at least `everyMs`
// old (30 s), with at most `concurrency` reads (4) in flight and the rest
// queued. A read that fails keeps the last value (the page never shows a
// chain error); failures are logged at most once a minute.
import { formatEther, type Address } from 'viem';
import type { DashboardMiner } from '../../api/dashboard.ts';
import type { ChainClient } from '../../chain/client.ts';
import { readStake } from '../../chain/staking.ts';

/** A miner's stake as the miners section carries it. */
export type MinerStake = NonNullable<DashboardMiner['stake']>;

/** What the miners section reads stakes from (a StakeCache; a fake in tests). */
export interface StakeSource {
  /** The last stake read of `address` (null: none yet); when `live`, a read is queued if the last one is old. */
  get(address: string, live?: boolean): MinerStake | null;
}

/** Reads an address's stake (readStake on the orchestrator's chain). */
export type StakeReader = (address: Address) => Promise<{ staked: bigint; unstaking: bigint }>;

export interface StakeCacheOptions {
  /** a miner's stake is read at most this often (ms) */
  everyMs?: number;
  /** reads in flight at once */
  concurrency?: number;
  now?: () => number;
  log?: (line: string) => void;
}

/** A live miner's stake is read again after this long. */
export const STAKE_EVERY_MS = 30_000;
/** Reads of the chain in flight at once. */
export const STAKE_READS_IN_FLIGHT = 4;
/** Failed reads are logged at most this often. */
const ERROR_LOG_EVERY_MS = 60_000;
const ADDRESS = /^0x[0-9a-fA-F]{40}$/;

interface Entry {
  /** as the miners section names it */
  address: string;
  value: MinerStake | null;
  /** when its last read started (0: never) */
  startedAt: number;
  /** queued or in flight */
  pending: boolean;
}

export class StakeCache implements StakeSource {
  private readonly entries = new Map<string, Entry>();
  private readonly queue = new Set<string>();
  private readonly everyMs: number;
  private readonly concurrency: number;
  private readonly now: () => number;
  private readonly log: (line: string) => void;
  private inFlight = 0;
  private readonly reads = new Set<Promise<void>>();
  private closed = false;
  private errorLoggedAt = -Infinity;
  private errorsUnlogged = 0;

  constructor(
    private readonly read: StakeReader,
    options: StakeCacheOptions = {},
  ) {
    this.everyMs = options.everyMs ?? STAKE_EVERY_MS;
    this.concurrency = Math.max(1, options.concurrency ?? STAKE_READS_IN_FLIGHT);
    this.now = options.now ?? Date.now;
    this.log = options.log ?? ((line) => console.error(`orchestrator: ${line}`));
  }

  /** A cache reading the Staking contract of `client` (readStake). */
  static ofChain(client: ChainClient, options: StakeCacheOptions = {}): StakeCache {
    return new StakeCache((address) => readStake(client, address), options);
  }

  get(address: string, live = true): MinerStake | null {
    const key = address.toLowerCase();
    let entry = this.entries.get(key);
    if (live && !this.closed && ADDRESS.test(address)) {
      if (!entry) this.entries.set(key, (entry = { address, value: null, startedAt: 0, pending: false }));
      if (!entry.pending && (entry.startedAt === 0 || this.now() - entry.startedAt >= this.everyMs)) {
        entry.pending = true;
        this.queue.add(key);
        this.pump();
      }
    }
    return entry?.value ?? null;
  }

  /** Reads queued or in flight. */
  get busy(): number {
    return this.queue.size + this.inFlight;
  }

  /** Resolves once nothing is queued or in flight (for tests and shutdown). */
  async idle(): Promise<void> {
    while (this.reads.size > 0) await Promise.all(this.reads);
  }

  /** Stops reading: nothing more is queued; reads in flight finish. */
  close(): void {
    this.closed = true;
    for (const key of this.queue) this.entries.get(key)!.pending = false;
    this.queue.clear();
  }

  private pump(): void {
    while (this.inFlight < this.concurrency && this.queue.size > 0) {
      const key: string = this.queue.values().next().value!;
      this.queue.delete(key);
      const entry = this.entries.get(key)!;
      entry.startedAt = this.now();
      this.inFlight++;
      const done = this.readOne(entry).finally(() => {
        this.inFlight--;
        entry.pending = false;
        this.reads.delete(done);
        if (!this.closed) this.pump();
      });
      this.reads.add(done);
    }
  }

  private async readOne(entry: Entry): Promise<void> {
    try {
      const { staked, unstaking } = await this.read(entry.address as Address);
      entry.value = { stakedWei: staked.toString(), staked: formatEther(staked), unstakingWei: unstaking.toString(), unstaking: formatEther(unstaking) };
    } catch (err) {
      // the last value stays; the page never shows the error
      this.errorsUnlogged++;
      const now = this.now();
      if (now - this.errorLoggedAt >= ERROR_LOG_EVERY_MS) {
        const more = this.errorsUnlogged > 1 ? ` (${this.errorsUnlogged - 1} more failed reads since the last report)` : '';
        this.log(`dashboard: reading the stake of ${entry.address} failed: ${(err as Error).message?.split('\n')[0] ?? String(err)}${more}`);
        this.errorLoggedAt = now;
        this.errorsUnlogged = 0;
      }
    }
  }
}
