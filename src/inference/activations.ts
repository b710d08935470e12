// The activations that cross a stage boundary (docs/inference.md, "Frames"):
// served through miners, stage i's output rows travel to stage i + 1 in a
// tensor frame, by default as f16 (half the bytes of f32). An f16 frame
// carries the rows rounded to binary16 (round to nearest even, a finite value
// past the range saturating to ±65504: ../protocol/fp16.ts, the encoder every
// frame uses), so the next stage computes on the rounded rows. An in-process
// generation that rounds at the same boundaries (Generator's `activations`)
// gives the served text byte for byte.
import { decodeF16, encodeF16 } from '../protocol/fp16.ts';

/** How activation rows cross a stage boundary: exactly (f32) or rounded to binary16 (f16 frames). */
export type ActivationCodec = 'f32' | 'f16';

/** The values an f16 frame of `x` carries: each rounded to binary16 and back, in a new array. */
export function roundToF16(x: Float32Array): Float32Array {
  const halves = new Uint16Array(x.length);
  encodeF16(x, halves);
  const out = new Float32Array(x.length);
  decodeF16(halves, out);
  return out;
}

/** The rows as the next stage receives them under `codec`: `x` itself for f32, rounded for f16. */
export function acrossBoundary(x: Float32Array, codec: ActivationCodec): Float32Array {
  return codec === 'f16' ? roundToF16(x) : x;
}
