// Typed errors of the protocol layer and the HTTP status each one maps to, so
// a server can answer a bad peer with a clear 4xx instead of crashing.

/** Why a tensor frame was refused. */
export type FrameErrorCode =
  | 'too_large' // frame, header, meta or element count over a limit (HTTP 413)
  | 'bad_magic' // does not start with "NIMF"
  | 'bad_version' // a frame version this build does not read
  | 'truncated' // fewer bytes than the prefix/header/payload need
  | 'length_mismatch' // more bytes than the header announces, or a byteLength that does not fit the codec
  | 'bad_header' // header is not valid JSON or misses/mistypes a field
  | 'bad_shape' // shape is not a list of non-negative integers within the rank/dim limits
  | 'shape_mismatch' // shape differs from the one the receiver expects
  | 'bad_dtype' // decoded dtype is not 'f32'
  | 'bad_codec' // unknown codec, or one the receiver does not accept, or a bad block size
  | 'non_finite' // NaN or Infinity in the values or in the int8 scales
  | 'bad_scale' // a negative int8 scale
  | 'checksum'; // payload sha256 differs from the header

/** A tensor frame could not be encoded or was refused on decode. */
export class FrameError extends Error {
  override readonly name = 'FrameError';
  constructor(
    readonly code: FrameErrorCode,
    message: string,
  ) {
    super(`frame ${code}: ${message}`);
  }

  /** HTTP status a server should answer with: 413 for too_large, else 400. */
  get httpStatus(): number {
    return this.code === 'too_large' ? 413 : 400;
  }
}

/** Why a signed request was refused. */
export type AuthErrorCode =
  | 'missing' // a signature header is absent
  | 'bad_signature' // malformed header, or the signature does not match the request or the claimed address
  | 'stale' // timestamp outside the replay window
  | 'replayed' // the (address, nonce) pair was already used within the window
  | 'overloaded'; // the nonce cache is full of live nonces; try again later (HTTP 503)

/** A signed request failed verification. */
export class AuthError extends Error {
  override readonly name = 'AuthError';
  constructor(
    readonly code: AuthErrorCode,
    message: string,
  ) {
    super(`auth ${code}: ${message}`);
  }

  /** HTTP status a server should answer with: 503 for overloaded, else 401. */
  get httpStatus(): number {
    return this.code === 'overloaded' ? 503 : 401;
  }
}

/** HTTP status for a protocol error, or undefined for any other error (a 500). */
export function protocolHttpStatus(error: unknown): number | undefined {
  if (error instanceof FrameError || error instanceof AuthError) return error.httpStatus;
  return undefined;
}
