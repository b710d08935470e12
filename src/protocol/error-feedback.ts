// Error feedback for compressed pseudo-gradients: what int8 rounding dropped
// this round is added back before quantizing the next round, so the error does
// not accumulate over merges (as in 1-bit SGD / EF-SGD).
//
//   t = x + residual;  q = quant(t);  residual = t - dequant(q)

import { groupCount, quantizeInt8, type Int8Quantized } from './int8.ts';

/** Residual buffer of one replica's flat pseudo-gradient, quantized per block. */
export class ErrorFeedback {
  /** What the last quantization dropped; starts at zero. */
  readonly residual: Float32Array;

  constructor(
    readonly size: number,
    readonly blockSize: number,
  ) {
    groupCount(size, blockSize); // validates blockSize
    this.residual = new Float32Array(size);
  }

  /**
   * Quantizes `x + residual` into `out` (or fresh buffers) and keeps the new
   * residual. `x` is not modified.
   */
  compress(x: Float32Array, out?: Int8Quantized): Int8Quantized {
    const n = this.size;
    if (x.length !== n) throw new RangeError(`ErrorFeedback.compress: ${x.length} values, expected ${n}`);
    const r = this.residual;
    const q = out ?? { scales: new Float32Array(groupCount(n, this.blockSize)), codes: new Int8Array(n) };
    for (let i = 0; i < n; i++) r[i] += x[i]; // r holds t = x + residual
    quantizeInt8(r, this.blockSize, q.scales, q.codes);
    const bs = this.blockSize;
    for (let g = 0, start = 0; start < n; g++, start += bs) {
      const scale = q.scales[g];
      const end = Math.min(start + bs, n);
      for (let i = start; i < end; i++) r[i] -= q.codes[i] * scale;
    }
    return q;
  }

  /** Forgets the residual (e.g. after the replica resynchronized its weights). */
  reset(): void {
    this.residual.fill(0);
  }
}
