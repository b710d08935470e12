// Bounded memory of recently used request nonces, for replay protection.
// A nonce is remembered until its request's timestamp leaves the replay
// window; expired entries are swept lazily.

/** Remembers (key -> expiry ms) pairs; refuses new keys when full of live ones. */
export class NonceCache {
  private readonly expiries = new Map<string, number>();
  private nextSweep = 0;

  constructor(
    /** Most live nonces kept at once. */
    readonly maxEntries: number,
    /** How often (ms) to sweep expired nonces even when not full. */
    readonly sweepEveryMs: number,
  ) {
    if (!(maxEntries >= 1)) throw new RangeError('NonceCache needs maxEntries >= 1');
  }

  /** Number of nonces held (live or not yet swept). */
  get size(): number {
    return this.expiries.size;
  }

  /**
   * Records `key` until `expiresAt`. Returns 'ok', 'seen' if a live entry
   * already holds it, or 'full' if the cache is full of live entries.
   */
  add(key: string, expiresAt: number, now: number): 'ok' | 'seen' | 'full' {
    if (now >= this.nextSweep) this.sweep(now);
    const prior = this.expiries.get(key);
    if (prior !== undefined && prior >= now) return 'seen';
    if (prior === undefined && this.expiries.size >= this.maxEntries) {
      this.sweep(now);
      if (this.expiries.size >= this.maxEntries) return 'full';
    }
    this.expiries.set(key, expiresAt);
    return 'ok';
  }

  /** Drops every entry that expired before `now`. */
  sweep(now: number): void {
    for (const [key, expiry] of this.expiries) if (expiry < now) this.expiries.delete(key);
    this.nextSweep = now + this.sweepEveryMs;
  }
}
