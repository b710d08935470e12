// Values the dashboard shows that live on the orchestrator's chain (each
// miner's stake, each model's registry listing: docs/dashboard.md), read in
// the background, never while a section is built. A section asks `get(key)`
// once a second while someone watches; a key's value is read again when its
// last read is at least `everyMs` old (30 s), with at most `concurrency`
// reads (4) in flight and the rest queued. A read that fails keeps the last
// value (the page never shows a chain error); failures are logged at most
// once a minute.

export interface ChainReadOptions {
  /** a key's value is read at most this often (ms) */
  everyMs?: number;
  /** reads in flight at once */
  concurrency?: number;
  now?: () => number;
  log?: (line: string) => void;
}

/** A value is read again after this long. */
export const CHAIN_READ_EVERY_MS = 30_000;
/** Reads of the chain in flight at once. */
export const CHAIN_READS_IN_FLIGHT = 4;
/** Failed reads are logged at most this often. */
const ERROR_LOG_EVERY_MS = 60_000;

interface Entry<V> {
  /** as the section names it */
  key: string;
  value: V | null;
  /** when its last read started (0: never) */
  startedAt: number;
  /** queued or in flight */
  pending: boolean;
}

export class ChainReadCache<V> {
  private readonly entries = new Map<string, Entry<V>>();
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
    /** what is read, for the log ("the stake of", "the registry listing of") */
    private readonly what: string,
    private readonly read: (key: string) => Promise<V>,
    /** keys that can be read (others are never asked for) */
    private readonly valid: (key: string) => boolean,
    options: ChainReadOptions = {},
  ) {
    this.everyMs = options.everyMs ?? CHAIN_READ_EVERY_MS;
    this.concurrency = Math.max(1, options.concurrency ?? CHAIN_READS_IN_FLIGHT);
    this.now = options.now ?? Date.now;
    this.log = options.log ?? ((line) => console.error(`orchestrator: ${line}`));
  }

  /** The last value read for `name` (null: none yet); when `live`, a read is queued if the last one is old. */
  get(name: string, live = true): V | null {
    const key = name.toLowerCase();
    let entry = this.entries.get(key);
    if (live && !this.closed && this.valid(name)) {
      if (!entry) this.entries.set(key, (entry = { key: name, value: null, startedAt: 0, pending: false }));
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

  private async readOne(entry: Entry<V>): Promise<void> {
    try {
      entry.value = await this.read(entry.key);
    } catch (err) {
      // the last value stays; the page never shows the error
      this.errorsUnlogged++;
      const now = this.now();
      if (now - this.errorLoggedAt >= ERROR_LOG_EVERY_MS) {
        const more = this.errorsUnlogged > 1 ? ` (${this.errorsUnlogged - 1} more failed reads since the last report)` : '';
        this.log(`dashboard: reading ${this.what} ${entry.key} failed: ${(err as Error).message?.split('\n')[0] ?? String(err)}${more}`);
        this.errorLoggedAt = now;
        this.errorsUnlogged = 0;
      }
    }
  }
}
