// The dashboard's operator login (docs/dashboard.md, "Login"): a random token
// made when the orchestrator starts and printed as a login URL (as Jupyter
// does). The token is good once and for a short while (LOGIN_TOKEN_MS): it is
// exchanged for a random session id kept in an HttpOnly, SameSite=Strict
// cookie, and is then spent, so that a URL left in a browser's history, a
// proxy's log or a shoulder-surfed screen logs nobody in. The next token is
// made and told (printed by the orchestrator) when one is spent, and when a
// spent or expired one is presented. Sessions live in memory (a restart logs
// everyone out) and are bounded in number and age.
//
// Also here: which Host a dashboard request may name (DNS rebinding), and whom
// a request is for when a cluster member forwarded it (FORWARDED_FOR, believed
// only with the forwarder's proof).
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

export const SESSION_COOKIE = 'nimble_operator';
/** A session lasts this long after login. */
export const SESSION_MS = 12 * 3_600_000;
/** Sessions kept at once: past it the oldest is logged out. */
export const MAX_SESSIONS = 32;
/** A login token is good for one login, within this long of being made. */
export const LOGIN_TOKEN_MS = 15 * 60_000;
/** Spent and expired tokens remembered, so that presenting one is answered as such (and the current URL told again). */
const SPENT_KEPT = 16;
/** The current URL is told again at most this often when spent tokens are presented. */
const RETELL_MS = 10_000;

/** What presenting a login token comes to. */
export type LoginResult = { session: string } | { refused: 'wrong' | 'spent' };

export interface OperatorAuthOptions {
  /** how long a token is good for (default LOGIN_TOKEN_MS) */
  tokenMs?: number;
  /** told the login path of each token made after the first, and of the current one again when a spent one is presented */
  onLoginPath?: (path: string, why: string) => void;
}

export class OperatorAuth {
  private token: string;
  private tokenHash: Buffer;
  private tokenUntil: number;
  /** the current token was exchanged already (the next is made when asked for) */
  private used = false;
  /** hashes of the tokens used or expired */
  private readonly spent: Buffer[] = [];
  private toldAt = -Infinity;
  /** session id's sha256 (hex) → expiry */
  private readonly sessions = new Map<string, number>();
  private readonly tokenMs: number;

  constructor(
    token: string = randomBytes(32).toString('base64url'),
    private readonly now: () => number = Date.now,
    private readonly options: OperatorAuthOptions = {},
  ) {
    if (!/^[A-Za-z0-9_-]{32,128}$/.test(token)) throw new Error('an operator token must be 32 to 128 base64url characters');
    this.tokenMs = options.tokenMs ?? LOGIN_TOKEN_MS;
    this.token = token;
    this.tokenHash = sha256(token);
    this.tokenUntil = this.now() + this.tokenMs;
  }

  /** The path that logs a browser in: the current token's (a new one when the last was used or has expired). */
  get loginPath(): string {
    this.renew(null);
    return `/login?token=${this.token}`;
  }

  /** A new session for the current token (compared in constant time), which is then spent; or why not. */
  login(token: string): LoginResult {
    const hash = sha256(token);
    this.renew('the last login URL expired unused');
    if (!this.used && timingSafeEqual(hash, this.tokenHash)) {
      this.spend();
      this.used = true;
      const id = randomBytes(32).toString('base64url');
      this.expire();
      while (this.sessions.size >= MAX_SESSIONS) this.sessions.delete(this.sessions.keys().next().value!);
      this.sessions.set(sha256(id).toString('hex'), this.now() + SESSION_MS);
      // the next one now, so that the operator can log in another browser
      this.renew('the login URL was used');
      return { session: id };
    }
    if (this.spent.some((h) => timingSafeEqual(h, hash))) {
      if (this.now() - this.toldAt >= RETELL_MS) this.tell('a spent or expired login URL was presented');
      return { refused: 'spent' };
    }
    return { refused: 'wrong' };
  }

  /** Whether a request's Cookie header holds a live session. */
  isOperator(cookieHeader: string | undefined): boolean {
    const id = sessionIdOf(cookieHeader);
    if (!id) return false;
    const until = this.sessions.get(sha256(id).toString('hex'));
    return until !== undefined && until > this.now();
  }

  /** Ends the session a Cookie header names (if any). */
  logout(cookieHeader: string | undefined): void {
    const id = sessionIdOf(cookieHeader);
    if (id) this.sessions.delete(sha256(id).toString('hex'));
  }

  /** The Set-Cookie value that holds a session. */
  static cookie(id: string): string {
    return `${SESSION_COOKIE}=${id}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${SESSION_MS / 1000}`;
  }

  /** The Set-Cookie value that clears it. */
  static clearCookie(): string {
    return `${SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0`;
  }

  /** A fresh token when the current one was used or has expired (told, with `why`, unless null). */
  private renew(why: string | null): void {
    const expired = this.tokenUntil <= this.now();
    if (!this.used && !expired) return;
    if (!this.used) this.spend();
    this.token = randomBytes(32).toString('base64url');
    this.tokenHash = sha256(this.token);
    this.tokenUntil = this.now() + this.tokenMs;
    this.used = false;
    this.tell(why ?? (expired ? 'the last login URL expired unused' : 'the login URL was used'));
  }

  private spend(): void {
    this.spent.push(this.tokenHash);
    if (this.spent.length > SPENT_KEPT) this.spent.shift();
  }

  private tell(why: string): void {
    this.toldAt = this.now();
    this.options.onLoginPath?.(`/login?token=${this.token}`, why);
  }

  private expire(): void {
    const now = this.now();
    for (const [k, until] of this.sessions) if (until <= now) this.sessions.delete(k);
  }
}

function sha256(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/** The session id in a Cookie header (a well-formed one only). */
export function sessionIdOf(cookieHeader: string | undefined): string | null {
  if (!cookieHeader || cookieHeader.length > 8192) return null;
  for (const part of cookieHeader.split(';')) {
    const eq = part.indexOf('=');
    if (eq < 0 || part.slice(0, eq).trim() !== SESSION_COOKIE) continue;
    const value = part.slice(eq + 1).trim();
    return /^[A-Za-z0-9_-]{43}$/.test(value) ? value : null;
  }
  return null;
}

/** Whether a peer address is this machine's (IPv4 127/8, ::1, or IPv4-mapped loopback). */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  return address === '::1' || /^(::ffff:)?127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(address);
}

/**
 * The request header in which a follower orchestrator (../cluster/forwarder.ts)
 * tells the leader whom it forwards for: the address of its own client.
 */
export const FORWARDED_FOR = 'x-nimble-forwarded-for';
/**
 * Its proof: HMAC-SHA256, under the key the cluster's lease gives its members
 * for the leader's term, of the method, the target and the address. Without a
 * valid one FORWARDED_FOR is not believed, whoever sent it.
 */
export const FORWARDED_PROOF = 'x-nimble-forwarded-proof';

/** The proof of a forwarded request for `address`, under `key`. */
export function forwardedProof(key: string, method: string, url: string, address: string): string {
  return createHmac('sha256', key).update(`nimble-forwarded-for\n${method}\n${url}\n${address}`).digest('hex');
}

/** What `clientAddressOf` and `isLocalClient` read of a request (a fastify request or a node one). */
export interface ClientOfRequest {
  socket: { remoteAddress?: string | undefined };
  headers: Record<string, string | string[] | undefined>;
  method?: string;
  url?: string;
}

/**
 * Whom a request is for: its socket's peer, unless the peer is this machine
 * and the request names another client in FORWARDED_FOR with a proof made
 * under `forwardKey` (a member of this cluster forwarding; no key: none is
 * believed). `forwarded`: it named one (believed or not).
 */
function clientOf(req: ClientOfRequest, forwardKey: string | null): { address: string; forwarded: boolean; believed: boolean } {
  const peer = req.socket.remoteAddress ?? '';
  const named = req.headers[FORWARDED_FOR];
  if (named === undefined) return { address: peer, forwarded: false, believed: false };
  const proof = req.headers[FORWARDED_PROOF];
  const believed =
    forwardKey !== null && isLoopback(peer) && typeof named === 'string' && typeof proof === 'string' && /^[0-9a-f]{64}$/.test(proof) &&
    timingSafeEqual(Buffer.from(proof, 'hex'), Buffer.from(forwardedProof(forwardKey, req.method ?? '', req.url ?? '', named), 'hex'));
  return { address: believed ? (named as string) : peer, forwarded: true, believed };
}

/**
 * The address of the client a request is for, for counting what each client
 * holds: a believed forwarder's client, else the socket's peer. A follower
 * forwards this address in turn, so a chain of followers still names the
 * outside client. '' when unknown.
 */
export function clientAddressOf(req: ClientOfRequest, forwardKey: string | null = null): string {
  return clientOf(req, forwardKey).address;
}

/**
 * Whether a request comes from this machine: its socket is loopback and it
 * names no other client, or a believed forwarder says its own client was
 * loopback (a follower on this machine forwards outside clients over
 * loopback). A request naming a client without a valid proof is not local.
 */
export function isLocalClient(req: ClientOfRequest, forwardKey: string | null = null): boolean {
  const c = clientOf(req, forwardKey);
  if (c.forwarded && !c.believed) return false;
  return isLoopback(c.address);
}

/**
 * Whether a dashboard request's Host names this server, not a name a
 * DNS-rebinding page pointed at it: an IP address (a page that connects by
 * address cannot be another site's), `localhost` and its subdomains (which
 * browsers resolve to loopback themselves), or one of `names` (the host the
 * orchestrator was told to listen on or is advertised at). The port is not
 * checked: another port is another origin to the browser.
 */
export function hostAllowed(hostHeader: string | undefined, names: readonly string[] = []): boolean {
  if (!hostHeader || hostHeader.length > 300) return false;
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]+))(?::\d{1,5})?$/.exec(hostHeader.trim());
  if (!m) return false;
  if (m[1] !== undefined) return isIP(m[1]) === 6;
  const host = m[2].toLowerCase().replace(/\.$/, '');
  if (isIP(host)) return true;
  return host === 'localhost' || host.endsWith('.localhost') || names.some((n) => n.toLowerCase().replace(/\.$/, '') === host);
}
