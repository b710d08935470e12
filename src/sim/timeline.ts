// Time series of a run: busy compute time, alive miner time and trained
// tokens summed into equal buckets of simulated time, for the chart.

/** A run's time series, one value per bucket. */
export interface TimeSeries {
  tMs: number[];
  /** busy compute over the alive time of every miner */
  utilization: number[];
  /** busy compute over the alive time of the miners that held a stage */
  utilizationHolders: number[];
  tokensPerS: number[];
}

export class Timeline {
  readonly bucketMs: number;
  private readonly busy: Float64Array;
  private readonly alive: Float64Array;
  private readonly tokens: Float64Array;

  constructor(
    readonly horizonMs: number,
    readonly samples: number,
  ) {
    if (!(horizonMs > 0) || !(Number.isInteger(samples) && samples >= 1)) throw new RangeError('timeline needs a positive horizon and samples');
    this.bucketMs = horizonMs / samples;
    this.busy = new Float64Array(samples);
    this.alive = new Float64Array(samples);
    this.tokens = new Float64Array(samples);
  }

  /** Adds `weight` per ms over [start, end) (clipped to the horizon) to a series. */
  private span(series: Float64Array, start: number, end: number, weight: number): void {
    const a = Math.max(0, start);
    const b = Math.min(this.horizonMs, end);
    if (!(b > a) || weight === 0) return;
    let k = Math.min(this.samples - 1, Math.floor(a / this.bucketMs));
    let t = a;
    while (t < b && k < this.samples) {
      const edge = Math.min(b, (k + 1) * this.bucketMs);
      series[k] += (edge - t) * weight;
      t = edge;
      k++;
    }
  }

  /** A miner computed over [start, end). */
  addBusy(start: number, end: number): void {
    this.span(this.busy, start, end, 1);
  }

  /** `count` miners were alive over [start, end). */
  addAlive(start: number, end: number, count: number): void {
    this.span(this.alive, start, end, count);
  }

  /** Tokens trained at time `at`. */
  addTokens(at: number, tokens: number): void {
    if (at < 0 || at >= this.horizonMs) return;
    this.tokens[Math.min(this.samples - 1, Math.floor(at / this.bucketMs))] += tokens;
  }

  /** Busy compute ms in total (within the horizon). */
  get busyMs(): number {
    return this.busy.reduce((a, b) => a + b, 0);
  }

  /** Alive miner-ms in total (within the horizon). */
  get aliveMs(): number {
    return this.alive.reduce((a, b) => a + b, 0);
  }

  /**
   * Per bucket: its middle time, utilization (busy over alive), the
   * utilization of the miners that held a stage (busy over the alive time of
   * `holders`, the [start, end) each of them was alive) and tokens/s.
   */
  series(holders: readonly (readonly [number, number])[] = []): TimeSeries {
    const holdersAlive = new Float64Array(this.samples);
    for (const [start, end] of holders) this.span(holdersAlive, start, end, 1);
    const tMs: number[] = [];
    const utilization: number[] = [];
    const utilizationHolders: number[] = [];
    const tokensPerS: number[] = [];
    for (let k = 0; k < this.samples; k++) {
      tMs.push((k + 0.5) * this.bucketMs);
      utilization.push(this.alive[k] > 0 ? this.busy[k] / this.alive[k] : 0);
      // compute happens only on miners holding a stage, so all of busy is theirs
      utilizationHolders.push(holdersAlive[k] > 0 ? Math.min(1, this.busy[k] / holdersAlive[k]) : 0);
      tokensPerS.push((this.tokens[k] * 1000) / this.bucketMs);
    }
    return { tMs, utilization, utilizationHolders, tokensPerS };
  }
}
