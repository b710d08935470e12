// The one error contract of the project: every error a server answers with,
// and every error a command shows a user, is a NimbleError with
//   code     a stable snake_case word a program can branch on,
//   message  one line a person can act on,
//   status   the HTTP status a server answers with.
// Subclasses add the codes of one concern (tensor frames, signatures, merge
// math, blobs) but carry them the same way. On the wire an error is
// `{ "error": message, "code": code }` with `status` as the HTTP status
// (src/http/server.ts); a client turns such an answer back into a NimbleError
// (src/http/client.ts), so a caller sees the same error on both sides.

/** Codes any concern may use, and the HTTP status each answers with. */
export const GENERIC_STATUS = {
  /** the request or a value in it is malformed or out of range */
  invalid: 400,
  /** no valid signature */
  unauthorized: 401,
  /** signed, but this party may not do this */
  forbidden: 403,
  not_found: 404,
  /** valid, but not now: the state does not allow it */
  conflict: 409,
  too_large: 413,
  /** this caller (or callers of this kind) sent too much too fast; retry later */
  rate_limited: 429,
  /** stored data failed validation: the server's fault, not the caller's */
  corrupt: 500,
  internal: 500,
  /** busy; retry later */
  overloaded: 503,
  /** the other side could not be reached */
  unreachable: 502,
} as const;

export type GenericCode = keyof typeof GENERIC_STATUS;

export class NimbleError extends Error {
  override readonly name: string = 'NimbleError';

  constructor(
    readonly code: string,
    message: string,
    readonly status: number = code in GENERIC_STATUS ? GENERIC_STATUS[code as GenericCode] : 400,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }

  /** A client error (4xx): the caller can fix it. */
  get isClientError(): boolean {
    return this.status >= 400 && this.status < 500;
  }
}

/** `err` as a NimbleError: itself, or an internal error wrapping it. */
export function asNimbleError(err: unknown): NimbleError {
  if (err instanceof NimbleError) return err;
  return new NimbleError('internal', err instanceof Error ? err.message : String(err), 500, { cause: err });
}

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

/** A tensor frame could not be encoded or was refused on decode: 413 for too_large, else 400. */
export class FrameError extends NimbleError {
  override readonly name = 'FrameError';
  declare readonly code: FrameErrorCode;

  constructor(code: FrameErrorCode, message: string) {
    super(code, `frame ${code}: ${message}`, code === 'too_large' ? 413 : 400);
  }
}

/** Why a signed request was refused. */
export type AuthErrorCode =
  | 'missing' // a signature header is absent
  | 'bad_signature' // malformed header, or the signature does not match the request or the claimed address
  | 'stale' // timestamp outside the replay window
  | 'replayed' // the (address, nonce) pair was already used within the window
  | 'unknown_signer' // a session signature from an address with no session key here (not joined, or not a peer)
  | 'rate_limited' // the sender's share of the nonce cache is full of live nonces: it sent too many requests in the window (HTTP 429)
  | 'overloaded'; // the nonce cache is full of live nonces; try again later (HTTP 503)

/** A signed request failed verification: 429 for rate_limited, 503 for overloaded, else 401. */
export class AuthError extends NimbleError {
  override readonly name = 'AuthError';
  declare readonly code: AuthErrorCode;

  constructor(code: AuthErrorCode, message: string) {
    super(code, `auth ${code}: ${message}`, code === 'overloaded' ? 503 : code === 'rate_limited' ? 429 : 401);
  }
}
