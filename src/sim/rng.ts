// A seeded random number generator (mulberry32): the same seed gives the same
// simulation, draw for draw.

/** Uniform numbers in [0, 1) and the few distributions the simulator draws from. */
export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0 || 0x9e3779b9;
  }

  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** Exponentially distributed with the given mean (the time to a memoryless event). */
  exponential(mean: number): number {
    return -mean * Math.log(1 - this.next());
  }

  /** Normally distributed with mean 0 and standard deviation 1 (Box–Muller, one of the pair). */
  normal(): number {
    return Math.sqrt(-2 * Math.log(1 - this.next())) * Math.cos(2 * Math.PI * this.next());
  }

  /** An index drawn in proportion to `weights` (all ≥ 0, not all 0). */
  weighted(weights: readonly number[]): number {
    let total = 0;
    for (const w of weights) total += w;
    let r = this.next() * total;
    for (let i = 0; i < weights.length; i++) {
      r -= weights[i];
      if (r < 0) return i;
    }
    return weights.length - 1;
  }
}
