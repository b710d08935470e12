// Bounded memory of recently used request nonces, for replay protection.
// A nonce is remembered until its request's timestamp leaves the replay
// window; expired entries are swept lazily. Besides the total, each sender
// has a quota of live nonces, so one party sending fast cannot push every
// other sender's requests out.

export type NonceAnswer = 'ok' | 'seen' | 'full' | 'sender_full';

/** Remembers (sender, nonce) -> expiry; refuses new ones when the cache, or the sender's quota, is full of live ones. */
export class NonceCache {
  private readonly expiries = new Map<string, { sender: string; expiry: number }>();
  private readonly perSender = new Map<string, number>();
  private nextSweep = 0;

  constructor(
    /** Most live nonces kept at once. */
    readonly maxEntries: number,
    /** How often (ms) to sweep expired nonces even when not full. */
    readonly sweepEveryMs: number,
    /** Most live nonces of one sender. */
    readonly maxPerSender: number = maxEntries,
  ) {
    if (!(maxEntries >= 1) || !(maxPerSender >= 1)) throw new RangeError('NonceCache needs maxEntries >= 1 and maxPerSender >= 1');
  }

  /** Number of nonces held (live or not yet swept). */
  get size(): number {
    return this.expiries.size;
  }

  /** Senders with a nonce held: never more than `size`, so at most `maxEntries` (a sender's count goes with its last nonce). */
  get senders(): number {
    return this.perSender.size;
  }

  /** Live (or not yet swept) nonces of one sender. */
  countOf(sender: string): number {
    return this.perSender.get(sender) ?? 0;
  }

  /**
   * Records `nonce` of `sender` until `expiresAt`. Returns 'ok', 'seen' if a
   * live entry already holds it, 'sender_full' if the sender's quota (the
   * default, or `maxOfSender` for a sender with its own) is full of live
   * entries, 'full' if the whole cache is.
   */
  add(sender: string, nonce: string, expiresAt: number, now: number, maxOfSender: number = this.maxPerSender): NonceAnswer {
    if (now >= this.nextSweep) this.sweep(now);
    const key = `${sender}:${nonce}`;
    const prior = this.expiries.get(key);
    if (prior !== undefined && prior.expiry >= now) return 'seen';
    if (prior === undefined) {
      if (this.countOf(sender) >= maxOfSender || this.expiries.size >= this.maxEntries) this.sweep(now);
      if (this.countOf(sender) >= maxOfSender) return 'sender_full';
      if (this.expiries.size >= this.maxEntries) return 'full';
      this.perSender.set(sender, this.countOf(sender) + 1);
    }
    this.expiries.set(key, { sender, expiry: expiresAt });
    return 'ok';
  }

  /** Drops every entry that expired before `now`. */
  sweep(now: number): void {
    for (const [key, e] of this.expiries) {
      if (e.expiry >= now) continue;
      this.expiries.delete(key);
      const n = this.countOf(e.sender) - 1;
      if (n > 0) this.perSender.set(e.sender, n);
      else this.perSender.delete(e.sender);
    }
    this.nextSweep = now + this.sweepEveryMs;
  }
}
