// Failover across the base URLs of one service: several orchestrators serve
// one network (one leads, the others forward to it), and a client given
// their URLs moves to another when the one it talks to stops answering.
//
// The rules (Failover.send):
//   - A request goes to the current URL. It is sent again to the next URL
//     (round robin from the current one) ONLY when it is certain the first
//     server did nothing with it:
//       * no connection was ever open: refused, host or network unreachable,
//         unknown host, or a connect that timed out (a TransportError with
//         `connected` false; when the transport cannot tell, as fetch cannot,
//         the error codes ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, ENOTFOUND,
//         EAI_AGAIN), for any method;
//       * for a GET only (it changes nothing): any failure before the first
//         byte of the answer (a reset, a timeout) too;
//       * an answer 503 with the code NO_LEADER_CODE ('unreachable'): what a
//         follower orchestrator answers when it has no leader to pass the
//         request on to (src/orchestrator/cluster/forwarder.ts). Not a 503
//         'unavailable' (a leader that lost its lease or its database): part
//         of the request may have been done before.
//     A POST or DELETE whose connection broke or timed out after it was
//     open, an answer cut off midway, and any other answer (a 500, a 503
//     'overloaded', a 4xx) are the caller's at once: the server may have
//     acted on it.
//   - Each URL is tried at most once per request; when every one failed, the
//     last error is thrown.
//   - The URL that answered sticks: later requests start there. A request
//     that failed without an answer leaves the current URL as it was.
//   - Each attempt is a fresh request of the caller's (a signed one signs
//     again, with a new nonce): a nonce is never sent twice.
import { NimbleError } from '../protocol/errors.ts';
import { TransportError } from './transport.ts';

/** One base URL, or several in order of preference. */
export type BaseUrls = string | URL | readonly (string | URL)[];

/** The code of a 503 a follower orchestrator answers when no leader is reachable: it did nothing with the request. */
export const NO_LEADER_CODE = 'unreachable';

/** Told once each time requests move to another URL: `why` the one they left failed. */
export type OnMove = (from: string, to: string, why: string) => void;

/** Errors that come before any connection is open. */
const NEVER_CONNECTED: ReadonlySet<string> = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN']);

/** What a failed attempt means: try the next URL, the server answered, or the caller must decide. */
export type Verdict = 'move' | 'answered' | 'stay';

/** A URL as people write it: without the trailing slash of an empty path. */
export function showUrl(url: URL): string {
  return url.href.replace(/\/$/, '');
}

/** Whether `pathOrUrl` is a whole URL (a peer's), not a path on a base URL. */
export function isAbsoluteUrl(pathOrUrl: string): boolean {
  return URL.canParse(pathOrUrl);
}

/** The base URLs, parsed; throws 'invalid' for one that is not a URL, for none, and for one given twice. */
export function parseBaseUrls(bases: BaseUrls): URL[] {
  const list: readonly (string | URL)[] = typeof bases === 'string' || bases instanceof URL ? [bases] : bases;
  if (list.length === 0) throw new NimbleError('invalid', 'no base URL given');
  const urls = list.map((b) => {
    try {
      return new URL(b);
    } catch {
      throw new NimbleError('invalid', `not a URL: '${String(b)}'`);
    }
  });
  const seen = new Set<string>();
  for (const u of urls) {
    if (seen.has(u.href)) throw new NimbleError('invalid', `${showUrl(u)} is given twice`);
    seen.add(u.href);
  }
  return urls;
}

/** The TransportError behind `err`, if it is one or wraps one. */
function transportErrorIn(err: unknown): TransportError | null {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if (e instanceof TransportError) return e;
  }
  return null;
}

/** Whether an error code of `err` or its causes says no connection was ever open. */
function neverConnected(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 6; e = e.cause, depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === 'string' && NEVER_CONNECTED.has(code)) return true;
    if (e instanceof AggregateError && e.errors.some((x) => neverConnected(x))) return true;
  }
  return false;
}

/** What a failed attempt of a `method` request means for failover (the rules above). */
export function verdictOf(method: string, err: unknown): Verdict {
  const t = transportErrorIn(err);
  if (t) {
    if (t.started) return 'stay';
    if (method === 'GET') return 'move';
    if (t.connected === false) return 'move';
    return t.connected === undefined && neverConnected(t) ? 'move' : 'stay';
  }
  if (err instanceof NimbleError) return err.status === 503 && err.code === NO_LEADER_CODE ? 'move' : 'answered';
  return 'stay';
}

/** An ordered list of base URLs and the one requests go to now (shared by every client of one service). */
export class Failover {
  readonly urls: readonly URL[];
  private index = 0;

  constructor(
    bases: BaseUrls,
    private readonly onMove: OnMove = () => {},
  ) {
    this.urls = parseBaseUrls(bases);
  }

  /** `bases` as a Failover: itself when it is one (so clients share the current URL). */
  static of(bases: BaseUrls | Failover): Failover {
    return bases instanceof Failover ? bases : new Failover(bases);
  }

  /** The URL requests go to now. */
  get current(): URL {
    return this.urls[this.index];
  }

  /** The URLs, for messages: "http://a, http://b". */
  describe(): string {
    return this.urls.map(showUrl).join(', ');
  }

  /**
   * Runs `attempt` on the current base URL, and on the next ones while the
   * rules above allow; returns the first result. `attempt` must send a
   * request of its own each time. A `signal` that has aborted ends it at once.
   */
  async send<T>(method: string, attempt: (base: URL) => Promise<T>, signal?: AbortSignal): Promise<T> {
    const start = this.index;
    let firstWhy = '';
    let last: unknown;
    for (let i = 0; i < this.urls.length; i++) {
      const at = (start + i) % this.urls.length;
      try {
        const value = await attempt(this.urls[at]);
        this.settle(start, at, firstWhy);
        return value;
      } catch (err) {
        const verdict = signal?.aborted ? 'stay' : verdictOf(method, err);
        if (verdict === 'answered') this.settle(start, at, firstWhy);
        if (verdict !== 'move') throw err;
        firstWhy ||= err instanceof NimbleError && err.status === 503 ? `has no leader (503 ${err.code})` : 'unreachable';
        last = err;
      }
    }
    throw last;
  }

  /** The URL at `at` answered: it is the current one from now on. */
  private settle(start: number, at: number, why: string): void {
    if (at === start || this.index === at) return;
    const from = this.urls[this.index];
    this.index = at;
    this.onMove(showUrl(from), showUrl(this.urls[at]), why || 'unreachable');
  }
}
