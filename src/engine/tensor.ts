// A tensor is a flat Float32Array view into the engine's shared memory, with
// the byte offset (`ptr`) that kernels take and a shape for checks and names.

export class Tensor {
  readonly size: number;
  readonly data: Float32Array;

  constructor(
    readonly ptr: number,
    readonly shape: readonly number[],
    buffer: ArrayBufferLike,
  ) {
    this.size = numel(shape);
    this.data = new Float32Array(buffer, ptr, this.size);
  }

  /** A view of `size` floats starting `offset` floats into this tensor. */
  view(offset: number, shape: readonly number[]): Tensor {
    const size = numel(shape);
    if (offset < 0 || offset + size > this.size) {
      throw new RangeError(`tensor view [${offset}, ${offset + size}) outside ${this.size} floats`);
    }
    return new Tensor(this.ptr + offset * 4, shape, this.data.buffer);
  }
}

/** Number of elements of a shape. */
export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}
