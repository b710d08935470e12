// Signed requests. Every request a miner makes (to the orchestrator or to a
// peer) is signed over its method, path, body hash, a timestamp and a random
// nonce, for one network (the domain: the orchestrator's identity, see
// ./network.ts). Two keys sign:
//   - the miner's wallet key (secp256k1, EIP-191 personal_sign): only to join,
//     where it binds the miner's session key to its address;
//   - the session key (Ed25519, ./session-key.ts) for everything after: fast
//     to check, so forged floods are cheap to refuse.
// The body's sha256 travels in a header and is part of what is signed, so a
// server checks the signature from the headers alone, before it reads the
// body, and then checks the body against the signed hash.
//
// Signed message (UTF-8, lines joined by "\n"):
//   nimble-request/v2
//   <domain>            the network: signer and verifier must agree
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
import { verifySignature, type SessionKey } from './session-key.ts';

/** Header names of a signed request (lower case, as Node's http exposes them). */
export const AUTH_HEADERS = {
  address: 'x-nimble-address',
  timestamp: 'x-nimble-timestamp',
  nonce: 'x-nimble-nonce',
  contentSha256: 'x-nimble-content-sha256',
  signature: 'x-nimble-signature',
} as const;

export const SIGNING_VERSION = 'nimble-request/v2';
export const DEFAULT_DOMAIN = 'nimble';
export const DEFAULT_WINDOW_MS = 30_000;
export const DEFAULT_MAX_NONCES = 200_000;
/** Live nonces one sender may hold: 100 requests a second over the window. */
export const DEFAULT_MAX_NONCES_PER_SENDER = 3_000;
/** Session signatures are "ed25519." + 86 base64url characters; wallet ones 0x + 130 hex digits. */
const SESSION_PREFIX = 'ed25519.';

/** The five auth headers. */
export type AuthHeaders = { [K in (typeof AUTH_HEADERS)[keyof typeof AUTH_HEADERS]]: string };

/** Which key signed. */
export type SignatureScheme = 'wallet' | 'session';

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
const SHA_RE = /^[0-9a-f]{64}$/;
const WALLET_SIGNATURE_RE = /^0x[0-9a-fA-F]{130}$/;
const SESSION_SIGNATURE_RE = /^ed25519\.[A-Za-z0-9_-]{86}$/;
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

/** A key that signs requests: a wallet's (secp256k1), or a session key acting for a wallet address. */
export type RequestKey = { wallet: Hex } | { session: SessionKey; address: Address };

/** Options of RequestSigner. */
export interface SignerOptions {
  domain?: string;
  /** Clock in ms (tests). */
  now?: () => number;
}

/** Signs requests with one key. */
export class RequestSigner {
  readonly address: Address;
  readonly scheme: SignatureScheme;
  private readonly account: PrivateKeyAccount | null;
  private readonly session: SessionKey | null;
  private readonly domain: string;
  private readonly now: () => number;

  /** A wallet key (0x hex), or a session key acting for an address. */
  constructor(key: Hex | RequestKey, options: SignerOptions = {}) {
    const k: RequestKey = typeof key === 'string' ? { wallet: key } : key;
    if ('wallet' in k) {
      this.account = privateKeyToAccount(k.wallet);
      this.session = null;
      this.address = this.account.address;
      this.scheme = 'wallet';
    } else {
      this.account = null;
      this.session = k.session;
      this.address = k.address;
      this.scheme = 'session';
    }
    this.domain = options.domain ?? DEFAULT_DOMAIN;
    this.now = options.now ?? Date.now;
  }

  /** Auth headers for a request; send the body bytes exactly as hashed here. */
  async sign(method: string, path: string, body?: Uint8Array | string): Promise<AuthHeaders> {
    const timestamp = this.now();
    const nonce = randomBytes(16).toString('hex');
    const sha = bodySha256(body);
    const message = canonicalMessage({ domain: this.domain, method, path, bodySha256: sha, timestamp, nonce });
    const signature = this.session ? SESSION_PREFIX + this.session.sign(message) : await this.account!.signMessage({ message });
    return {
      [AUTH_HEADERS.address]: this.address,
      [AUTH_HEADERS.timestamp]: String(timestamp),
      [AUTH_HEADERS.nonce]: nonce,
      [AUTH_HEADERS.contentSha256]: sha,
      [AUTH_HEADERS.signature]: signature,
    } as AuthHeaders;
  }
}

/** Request headers as Node's http gives them, a fetch Headers, or a plain map. */
export type HeaderSource = { get(name: string): string | null } | Record<string, string | string[] | undefined>;

/** The parts of an incoming request the verifier needs before its body is read. */
export interface IncomingHeaders {
  method: string;
  /** Request target as received (Node: req.url). */
  path: string;
  headers: HeaderSource;
  /**
   * Called once the headers are well formed and fresh, just before the
   * signature itself is checked (the costly part): a server's rate limit
   * goes here, so that requests refused for free do not use it up. May throw.
   */
  beforeSignatureCheck?: (scheme: SignatureScheme) => void;
}

/** A request whose headers verified. */
export interface VerifiedRequest {
  signer: Address;
  scheme: SignatureScheme;
  /** the body must hash to this */
  bodySha256: string;
}

/** Options of RequestVerifier. */
export interface VerifierOptions {
  domain?: string;
  /** Accepted clock skew either way, ms (default 30 000). */
  windowMs?: number;
  /** Most nonces remembered at once (default 200 000); beyond that requests get 'overloaded'. */
  maxNonces?: number;
  /** Most live nonces of one sender (default 3 000); beyond that its requests get 'rate_limited' (429). */
  maxNoncesPerSender?: number;
  /** A sender with a quota of its own (a miner's orchestrator, which drives every served token): its most live nonces. */
  quotaOf?: (address: Address) => number | undefined;
  /**
   * Requests signed before this time are refused (ms): a restarted server has
   * forgotten the nonces it saw, so the replay window starts when it starts.
   */
  notBefore?: number;
  /** The session key registered for an address (base64url), if any. */
  sessionKeyOf?: (address: Address) => string | undefined;
  /** Clock in ms (tests). */
  now?: () => number;
}

function header(headers: HeaderSource, name: string): string | undefined {
  if (typeof headers.get === 'function') return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  const v = (headers as Record<string, string | string[] | undefined>)[name];
  if (Array.isArray(v)) throw new AuthError('bad_signature', `header ${name} given more than once`);
  return v;
}

/** Verifies signed requests: from the headers first, then the body against the signed hash. */
export class RequestVerifier {
  readonly windowMs: number;
  private readonly domain: string;
  private readonly now: () => number;
  private readonly notBefore: number;
  private readonly nonces: NonceCache;
  private readonly sessionKeyOf: (address: Address) => string | undefined;
  private readonly quotaOf: (address: Address) => number | undefined;

  constructor(options: VerifierOptions = {}) {
    this.windowMs = options.windowMs ?? DEFAULT_WINDOW_MS;
    this.domain = options.domain ?? DEFAULT_DOMAIN;
    this.now = options.now ?? Date.now;
    this.notBefore = options.notBefore ?? 0;
    this.nonces = new NonceCache(options.maxNonces ?? DEFAULT_MAX_NONCES, this.windowMs, options.maxNoncesPerSender ?? DEFAULT_MAX_NONCES_PER_SENDER);
    this.sessionKeyOf = options.sessionKeyOf ?? (() => undefined);
    this.quotaOf = options.quotaOf ?? (() => undefined);
  }

  /** Nonces currently remembered. */
  get nonceCount(): number {
    return this.nonces.size;
  }

  /**
   * Checks the headers: their form, the replay window, the signature over the
   * signed body hash (a session key's against the key registered for the
   * address), and the nonce, in that order, cheapest first; the nonce is
   * recorded only once the signature is valid. Throws AuthError.
   */
  async verifyHeaders(req: IncomingHeaders): Promise<VerifiedRequest> {
    const address = header(req.headers, AUTH_HEADERS.address);
    const ts = header(req.headers, AUTH_HEADERS.timestamp);
    const nonce = header(req.headers, AUTH_HEADERS.nonce);
    const sha = header(req.headers, AUTH_HEADERS.contentSha256);
    const signature = header(req.headers, AUTH_HEADERS.signature);
    const given = { [AUTH_HEADERS.address]: address, [AUTH_HEADERS.timestamp]: ts, [AUTH_HEADERS.nonce]: nonce, [AUTH_HEADERS.contentSha256]: sha, [AUTH_HEADERS.signature]: signature };
    const absent = Object.entries(given).filter(([, v]) => !v).map(([k]) => k);
    if (absent.length > 0 || !address || !ts || !nonce || !sha || !signature) throw new AuthError('missing', `missing header(s) ${absent.join(', ')}`);
    if (!ADDRESS_RE.test(address)) throw new AuthError('bad_signature', `${AUTH_HEADERS.address} is not a 0x-prefixed 20-byte hex address`);
    if (!TIMESTAMP_RE.test(ts)) throw new AuthError('bad_signature', `${AUTH_HEADERS.timestamp} is not a decimal ms timestamp`);
    if (!NONCE_RE.test(nonce)) throw new AuthError('bad_signature', `${AUTH_HEADERS.nonce} must be 16-64 lowercase hex digits`);
    if (!SHA_RE.test(sha)) throw new AuthError('bad_signature', `${AUTH_HEADERS.contentSha256} must be 64 lowercase hex digits`);
    const scheme: SignatureScheme | null = WALLET_SIGNATURE_RE.test(signature) ? 'wallet' : SESSION_SIGNATURE_RE.test(signature) ? 'session' : null;
    if (!scheme) throw new AuthError('bad_signature', `${AUTH_HEADERS.signature} is neither a 65-byte hex wallet signature nor an ed25519 session signature`);

    const timestamp = Number(ts);
    const now = this.now();
    const skew = timestamp - now;
    if (Math.abs(skew) > this.windowMs) {
      throw new AuthError('stale', `timestamp is ${Math.round(skew / 1000)} s ${skew < 0 ? 'old' : 'in the future'}; window is +-${this.windowMs / 1000} s (check the clock)`);
    }
    if (timestamp < this.notBefore) throw new AuthError('stale', 'signed before this server started; sign again');

    let message: string;
    try {
      message = canonicalMessage({ domain: this.domain, method: req.method, path: req.path, bodySha256: sha, timestamp, nonce });
    } catch (e) {
      throw new AuthError('bad_signature', (e as Error).message);
    }
    req.beforeSignatureCheck?.(scheme);
    let signer: Address;
    if (scheme === 'session') {
      const key = this.sessionKeyOf(address as Address);
      if (!key) throw new AuthError('unknown_signer', `${address} has no session key here (join first)`);
      if (!verifySignature(key, message, signature.slice(SESSION_PREFIX.length))) {
        throw new AuthError('bad_signature', `signature does not match ${address}'s session key for this method, path, body and headers`);
      }
      signer = address as Address;
    } else {
      try {
        signer = await recoverMessageAddress({ message, signature: signature as Hex });
      } catch {
        throw new AuthError('bad_signature', 'signature is not a valid secp256k1 signature');
      }
      if (signer.toLowerCase() !== address.toLowerCase()) {
        throw new AuthError('bad_signature', `signature does not match ${address} for this method, path, body and headers`);
      }
    }

    const seen = this.nonces.add(signer, nonce, timestamp + this.windowMs, now, this.quotaOf(signer));
    if (seen === 'seen') throw new AuthError('replayed', `nonce ${nonce} was already used by ${signer}`);
    if (seen === 'sender_full') throw new AuthError('rate_limited', `${signer} sent too many requests in the replay window; retry later`);
    if (seen === 'full') throw new AuthError('overloaded', 'too many requests in the replay window; retry later');
    return { signer, scheme, bodySha256: sha };
  }

  /** Checks a body against the hash its verified headers signed. */
  checkBody(verified: VerifiedRequest, body: Uint8Array | string | undefined): void {
    if (bodySha256(body) !== verified.bodySha256) throw new AuthError('bad_signature', 'the body does not match the signed sha256');
  }

  /** Headers, then the body: the signer's address. */
  async verify(req: IncomingHeaders & { body?: Uint8Array | string }): Promise<Address> {
    const v = await this.verifyHeaders(req);
    this.checkBody(v, req.body);
    return v.signer;
  }
}
