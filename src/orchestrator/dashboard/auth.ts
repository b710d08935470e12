// The dashboard's operator login (docs/dashboard.md, "Login"): a random token
// made when the orchestrator starts and printed as a login URL (as Jupyter
// does); the token is exchanged, once per browser, for a random session id
// kept in an HttpOnly, SameSite=Strict cookie, so that it is never kept in a
// URL after login nor readable by the page. Sessions live in memory (a
// restart logs everyone out) and are bounded in number and age.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'nimble_operator';
/** A session lasts this long after login. */
export const SESSION_MS = 12 * 3_600_000;
/** Sessions kept at once: past it the oldest is logged out. */
export const MAX_SESSIONS = 32;

export class OperatorAuth {
  /** the login token: 256 random bits, base64url */
  readonly token: string;
  private readonly tokenHash: Buffer;
  /** session id's sha256 (hex) → expiry */
  private readonly sessions = new Map<string, number>();

  constructor(token: string = randomBytes(32).toString('base64url'), private readonly now: () => number = Date.now) {
    if (!/^[A-Za-z0-9_-]{32,128}$/.test(token)) throw new Error('an operator token must be 32 to 128 base64url characters');
    this.token = token;
    this.tokenHash = sha256(token);
  }

  /** The path that logs a browser in. */
  get loginPath(): string {
    return `/login?token=${this.token}`;
  }

  /** A new session id for the right token (compared in constant time), else null. */
  login(token: string): string | null {
    if (!timingSafeEqual(sha256(token), this.tokenHash)) return null;
    const id = randomBytes(32).toString('base64url');
    this.expire();
    while (this.sessions.size >= MAX_SESSIONS) this.sessions.delete(this.sessions.keys().next().value!);
    this.sessions.set(sha256(id).toString('hex'), this.now() + SESSION_MS);
    return id;
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

/** What `clientAddressOf` and `isLocalClient` read of a request (a fastify request or a node one). */
export interface ClientOfRequest {
  socket: { remoteAddress?: string | undefined };
  headers: Record<string, string | string[] | undefined>;
}

/**
 * The address of the client a request is for: its socket's peer, unless that
 * peer is this machine and names another client in FORWARDED_FOR (a follower
 * forwarding). Only a loopback peer is believed: anyone else could write the
 * header. A follower forwards this address in turn, so a chain of followers on
 * one machine still names the outside client. '' when unknown.
 */
export function clientAddressOf(req: ClientOfRequest): string {
  const peer = req.socket.remoteAddress ?? '';
  const named = req.headers[FORWARDED_FOR];
  if (named === undefined || !isLoopback(peer)) return peer;
  return typeof named === 'string' ? named : '';
}

/**
 * Whether a request comes from this machine: its socket is loopback and, when
 * a follower forwarded it, the follower's own client was loopback too (a
 * follower on this machine forwards outside clients over loopback).
 */
export function isLocalClient(req: ClientOfRequest): boolean {
  return isLoopback(clientAddressOf(req));
}
