// Limits a server puts on its callers before it does any work for them: a
// token bucket (requests a second, with a burst), and a budget of request
// body bytes being received at once, per signer and in all (a body is held
// in memory until it is complete, so bodies in flight are memory in use).
import { NimbleError } from '../protocol/errors.ts';

/** A token bucket: `perSecond` tokens a second, at most `burst` saved. */
export class TokenBucket {
  private tokens: number;
  private at = Date.now();

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
  ) {
    this.tokens = burst;
  }

  take(): boolean {
    const now = Date.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.perSecond);
    this.at = now;
    if (this.tokens < 1) return false;
    this.tokens--;
    return true;
  }
}

/** Bytes of request bodies being received at once: at most `perSigner` for one signer, `total` for all. */
export class BodyBudget {
  private readonly bySigner = new Map<string, number>();
  private inUse = 0;

  constructor(
    readonly perSigner: number,
    readonly total: number,
  ) {}

  /** Bytes reserved now, in all. */
  get used(): number {
    return this.inUse;
  }

  /**
   * Reserves `bytes` for a body `signer` is about to send; returns the
   * release (call it once, when the request is over). Throws 'rate_limited'
   * (429) past the signer's share, 'overloaded' (503) past the total.
   */
  reserve(signer: string, bytes: number): () => void {
    const mine = this.bySigner.get(signer) ?? 0;
    if (mine > 0 && mine + bytes > this.perSigner) {
      throw new NimbleError('rate_limited', `${signer} is already sending ${mine} bytes of bodies; send large bodies one at a time (at most ${this.perSigner} bytes at once)`, 429);
    }
    if (this.inUse > 0 && this.inUse + bytes > this.total) throw new NimbleError('overloaded', 'too many large uploads are under way; retry in a moment');
    this.bySigner.set(signer, mine + bytes);
    this.inUse += bytes;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.inUse -= bytes;
      const left = (this.bySigner.get(signer) ?? 0) - bytes;
      if (left > 0) this.bySigner.set(signer, left);
      else this.bySigner.delete(signer);
    };
  }
}
