// The planner's refusal: a job that cannot be placed, with the numbers that show why.
import { NimbleError } from '../protocol/errors.ts';

/** Thrown when no valid plan exists; the message names the numbers (stage, bytes, miners). HTTP 422. */
export class PlanError extends NimbleError {
  override readonly name = 'PlanError';

  constructor(message: string) {
    super('cannot_plan', message, 422);
  }
}

/** Bytes in decimal units with three significant digits, e.g. "412 MB", "3.47 GB", "980 B". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];
  let v = bytes;
  let u = 0;
  while (Math.abs(v) >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  return u === 0 ? `${Math.round(v)} B` : `${Number(v.toPrecision(3))} ${units[u]}`;
}
