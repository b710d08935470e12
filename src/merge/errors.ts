// Typed errors of the merge math. Merge inputs come from peers (decoded
// pseudo-gradient frames, replica lists, weights), so every check names the
// numbers involved and carries a code a server can map to a 4xx.
import { NimbleError } from '../protocol/errors.ts';

/** Why a merge computation was refused. */
export type MergeErrorCode =
  | 'bad_argument' // a count, fraction, seed or option out of its range
  | 'no_replicas' // no slices to merge, or no replica left to merge a partition
  | 'duplicate_replica' // a replica id appears twice
  | 'length_mismatch' // slices, weights, buffers or state of different lengths
  | 'non_finite' // NaN or +-Infinity in an input
  | 'bad_weights' // a negative or non-finite weight, or weights that sum to zero
  | 'misaligned' // a partition boundary that is not on an int8 block boundary
  | 'bad_frame'; // a frame that decodes but is not the partition expected

/** A merge computation was refused: 400, since merge inputs come from peers. */
export class MergeError extends NimbleError {
  override readonly name = 'MergeError';
  declare readonly code: MergeErrorCode;

  constructor(code: MergeErrorCode, message: string) {
    super(code, `merge ${code}: ${message}`, 400);
  }
}
