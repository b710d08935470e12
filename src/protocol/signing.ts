// Signed requests: every miner request to the orchestrator carries a
// secp256k1 (Ethereum, EIP-191 personal_sign) signature by the miner's wallet
// over the request's method, path, body hash, a timestamp and a random nonce.
// The orchestrator recovers the signer, checks it matches the claimed address,
// the timestamp is within the replay window and the nonce is fresh.
//
// Signed message (UTF-8, lines joined by "\n"):
//   nimble-request/v1
//   <domain>            e.g. "nimble" or a network id; signer and verifier must agree
//   <METHOD>            upper case
//   <path>              request target as sent: path plus "?query" if any
//   <sha256(body) hex>  of the raw body bytes; sha256 of nothing for no body
//   <timestamp>         ms since the epoch, decimal
//   <nonce>             32 random lowercase hex digits

import { createHash, randomBytes } from 'node:crypto';
import { recoverMessageAddress, type Address, type Hex } from 'viem';
import { privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts';
import { AuthError } from './errors.ts';
import { NonceCache } from './nonce-cache.ts';

/** Header names of a signed request (lower case, as Node's http exposes them). */
export const AUTH_HEADERS = {
  address: 'x-nimble-address',
  timestamp: 'x-nimble-timestamp',
  nonce: 'x-nimble-nonce',
  signature: 'x-nimble-signature',
} as const;

export const SIGNING_VERSION = 'nimble-request/v1';
export const DEFAULT_DOMAIN = 'nimble';
export const DEFAULT_WINDOW_MS = 30_000;
export const DEFAULT_MAX_NONCES = 200_000;

/** The four auth headers. */
export type AuthHeaders = { [K in (typeof AUTH_HEADERS)[keyof typeof AUTH_HEADERS]]: string };

/** What is signed. */
export interface CanonicalRequest {
  domain: string;
  method: string;
  path: string;
  bodySha256: string;
  timestamp: number;
  nonce: string;
}

const NONCE_RE = /^[0-9a-f]{16,64}$/;
const TIMESTAMP_RE = /^[0-9]{1,16}$/;
const ADDRESS_RE = /^0x[0-9a-fA-F]{40}$/;
const SIGNATURE_RE = /^0x[0-9a-fA-F]{130}$/;
const METHOD_RE = /^[A-Z]{1,16}$/;
const PATH_RE = /^\/[\x21-\x7e]*$/;
const EMPTY_SHA256 = createHash('sha256').digest('hex');

/** sha256 hex of a request body (a string is hashed as UTF-8). */
export function bodySha256(body: Uint8Array | string | undefined): string {
  if (body === undefined || body.length === 0) return EMPTY_SHA256;
  return createHash('sha256').update(body).digest('hex');
}

/** The exact text that is signed. Throws RangeError for a method/path/domain that cannot be signed unambiguously. */
export function canonicalMessage(r: CanonicalRequest): string {
  const method = r.method.toUpperCase();
  if (!METHOD_RE.test(method)) throw new RangeError(`cannot sign method ${JSON.stringify(r.method)}`);
  if (!PATH_RE.test(r.path)) throw new RangeError(`cannot sign path ${JSON.stringify(r.path)}: needs a leading "/" and printable ASCII without spaces`);
  if (/[\r\n]/.test(r.domain)) throw new RangeError('domain must be one line');
  return [SIGNING_VERSION, r.domain, method, r.path, r.bodySha256, String(r.timestamp), r.nonce].join('\n');
}

/** Options of RequestSigner. */
export interface SignerOptions {
  domain?: string;
  /** Clock in ms (tests). */
  now?: () => number;
}

/** Signs requests with one wallet key. */
export class RequestSigner {
  readonly address: Address;
  private readonly account: PrivateKeyAccount;
  private readonly domain: string;
  private readonly now: () => number;

  constructor(privateKey: Hex, options: SignerOptions = {}) {
    this.account = privateKeyToAccount(privateKey);
    this.address = this.account.address;
    this.domain = options.domain ?? DEFAULT_DOMAIN;
    this.now = options.now ?? Date.now;
  }

  /** Auth headers for a request; send the body bytes exactly as hashed here. */
  async sign(method: string, path: string, body?: Uint8Array | string): Promise<AuthHeaders> {
    const timestamp = this.now();
    const nonce = randomBytes(16).toString('hex');
    const message = canonicalMessage({ domain: this.domain, method, path, bodySha256: bodySha256(body), timestamp, nonce });
    const signature = await this.account.signMessage({ message });
    return {
      [AUTH_HEADERS.address]: this.address,
      [AUTH_HEADERS.timestamp]: String(timestamp),
      [AUTH_HEADERS.nonce]: nonce,
      [AUTH_HEADERS.signature]: signature,
    } as AuthHeaders;
  }
}

/** Request headers as Node's http gives them, a fetch Headers, or a plain map. */
export type HeaderSource = { get(name: string): string | null } | Record<string, string | string[] | undefined>;

/** The parts of an incoming request the verifier needs. */
export interface IncomingSignedRequest {
  method: string;
  /** Request target as received (Node: req.url). */
  path: string;
  headers: HeaderSource;
  /** Raw body bytes (or give bodySha256 when the body was hashed while streaming). */
  body?: Uint8Array | string;
  bodySha256?: string;
}

/** Options of RequestVerifier. */
export interface VerifierOptions {
  domain?: string;
  /** Accepted clock skew either way, ms (default 30 000). */
  windowMs?: number;
  /** Most nonces remembered at once (default 200 000); beyond that requests get 'overloaded'. */
  maxNonces?: number;
  /** Clock in ms (tests). */
  now?: () => number;
}

function header(headers: HeaderSource, name: string): string | undefined {
  if (typeof headers.get === 'function') return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  const v = (headers as Record<string, string | string[] | undefined>)[name];
  if (Array.isArray(v)) throw new AuthError('bad_signature', `header ${name} given more than once`);
  return v;
}

/** Verifies signed requests: returns the signer's address or throws AuthError. */
export class RequestVerifier {
  readonly windowMs: number;
  private readonly domain: string;
  private readonly now: () => number;
  private readonly nonces: NonceCache;

  constructor(options: VerifierOptions = {}) {
    this.windowMs = options.windowMs ?? DEFAULT_WINDOW_MS;
    this.domain = options.domain ?? DEFAULT_DOMAIN;
    this.now = options.now ?? Date.now;
    this.nonces = new NonceCache(options.maxNonces ?? DEFAULT_MAX_NONCES, this.windowMs);
  }

  /** Nonces currently remembered. */
  get nonceCount(): number {
    return this.nonces.size;
  }

  /**
   * Checks headers, replay window, signature and nonce, in that order (the
   * nonce is only recorded once the signature is valid). Returns the
   * checksummed address of the signer.
   */
  async verify(req: IncomingSignedRequest): Promise<Address> {
    const address = header(req.headers, AUTH_HEADERS.address);
    const ts = header(req.headers, AUTH_HEADERS.timestamp);
    const nonce = header(req.headers, AUTH_HEADERS.nonce);
    const signature = header(req.headers, AUTH_HEADERS.signature);
    const absent = [
      [AUTH_HEADERS.address, address],
      [AUTH_HEADERS.timestamp, ts],
      [AUTH_HEADERS.nonce, nonce],
      [AUTH_HEADERS.signature, signature],
    ].filter(([, v]) => !v).map(([k]) => k);
    if (absent.length > 0 || !address || !ts || !nonce || !signature) throw new AuthError('missing', `missing header(s) ${absent.join(', ')}`);
    if (!ADDRESS_RE.test(address)) throw new AuthError('bad_signature', `${AUTH_HEADERS.address} is not a 0x-prefixed 20-byte hex address`);
    if (!TIMESTAMP_RE.test(ts)) throw new AuthError('bad_signature', `${AUTH_HEADERS.timestamp} is not a decimal ms timestamp`);
    if (!NONCE_RE.test(nonce)) throw new AuthError('bad_signature', `${AUTH_HEADERS.nonce} must be 16-64 lowercase hex digits`);
    if (!SIGNATURE_RE.test(signature)) throw new AuthError('bad_signature', `${AUTH_HEADERS.signature} is not a 65-byte hex signature`);

    const timestamp = Number(ts);
    const now = this.now();
    const skew = timestamp - now;
    if (Math.abs(skew) > this.windowMs) {
      throw new AuthError('stale', `timestamp is ${Math.round(skew / 1000)} s ${skew < 0 ? 'old' : 'in the future'}; window is +-${this.windowMs / 1000} s (check the clock)`);
    }

    let message: string;
    try {
      message = canonicalMessage({
        domain: this.domain,
        method: req.method,
        path: req.path,
        bodySha256: req.bodySha256 ?? bodySha256(req.body),
        timestamp,
        nonce,
      });
    } catch (e) {
      throw new AuthError('bad_signature', (e as Error).message);
    }
    let signer: Address;
    try {
      signer = await recoverMessageAddress({ message, signature: signature as Hex });
    } catch {
      throw new AuthError('bad_signature', 'signature is not a valid secp256k1 signature');
    }
    if (signer.toLowerCase() !== address.toLowerCase()) {
      throw new AuthError('bad_signature', `signature does not match ${address} for this method, path, body and headers`);
    }

    const seen = this.nonces.add(`${signer}:${nonce}`, timestamp + this.windowMs, now);
    if (seen === 'seen') throw new AuthError('replayed', `nonce ${nonce} was already used by ${signer}`);
    if (seen === 'full') throw new AuthError('overloaded', 'too many requests in the replay window; retry later');
    return signer;
  }
}
