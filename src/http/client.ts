// The client half of the error contract: a request that fails comes back as a
// NimbleError with the server's code and status (or 'unreachable' when there
// was no answer), and JSON replies are validated against their schema. A
// client is given one base URL or several (./failover.ts: a request moves to
// the next only when the one it went to certainly did nothing with it).
import type { Static, TSchema } from '@sinclair/typebox';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';
import type { RequestSigner } from '../protocol/signing.ts';
import { Failover, isAbsoluteUrl, type BaseUrls } from './failover.ts';
import { send, TransportError, type Sent } from './transport.ts';

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'DELETE';

export interface HttpRequest {
  method: HttpMethod;
  headers?: Record<string, string>;
  body?: Uint8Array;
  timeoutMs?: number;
  /** who answers, for the message when nobody does (e.g. 'the orchestrator') */
  peer?: string;
}

/** Sends a request; returns the body bytes of a 2xx answer, else throws the answer's error. */
export async function httpRequest(url: URL, req: HttpRequest): Promise<Uint8Array> {
  let sent: Sent;
  try {
    sent = await send(url, req.method, req.headers, req.body, req.timeoutMs ?? 30_000);
  } catch (err) {
    const e = err as TransportError;
    if (e.started) throw new NimbleError('unreachable', `${req.method} ${url.pathname}: the answer was cut off: ${e.message}`, 502, { cause: err });
    const who = req.peer ? `${req.peer} at ${url.origin}` : url.origin;
    throw new NimbleError('unreachable', `cannot reach ${who}: ${e.message}`, 502, { cause: err });
  }
  if (sent.status < 200 || sent.status > 299) throw errorOf(sent.status, sent.statusText, sent.bytes, `${req.method} ${url.pathname}`);
  return sent.bytes;
}

/** The NimbleError an error answer carries. */
export function errorOf(status: number, statusText: string, bytes: Uint8Array, what: string): NimbleError {
  let message = `${status} ${statusText}`;
  let code = `http_${status}`;
  try {
    const body: unknown = JSON.parse(new TextDecoder().decode(bytes));
    if (body && typeof body === 'object') {
      const b = body as Record<string, unknown>;
      if (typeof b.error === 'string') message = b.error.slice(0, 1000);
      if (typeof b.code === 'string' && /^[a-z_]{1,64}$/.test(b.code)) code = b.code;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new NimbleError(code, `${what}: ${message}`, status);
}

const JSON_TYPE = { 'content-type': 'application/json' };

/** A client of one JSON API (unsigned): GET and POST with validated replies. */
export class JsonClient {
  /** the base URLs and the one requests go to now */
  readonly failover: Failover;

  constructor(
    /** one base URL, several (./failover.ts), or the Failover of other clients of the same service */
    baseUrl: BaseUrls | Failover,
    private readonly timeoutMs = 15_000,
    /** who answers, for messages (e.g. 'the orchestrator') */
    private readonly peer?: string,
  ) {
    this.failover = Failover.of(baseUrl);
  }

  /** The base URL requests go to now. */
  get baseUrl(): URL {
    return this.failover.current;
  }

  async get<T extends TSchema>(path: string, reply: T, what: string): Promise<Static<T>> {
    return parseJson(reply, await this.send('GET', path), what);
  }

  async post<T extends TSchema>(path: string, value: unknown, reply: T, what: string): Promise<Static<T>> {
    return parseJson(reply, await this.send('POST', path, new TextEncoder().encode(JSON.stringify(value))), what);
  }

  async bytes(path: string): Promise<Uint8Array> {
    return this.send('GET', path);
  }

  /** A GET whose body the caller streams (a download, server-sent events), on the current URL or, unanswered, the next ones. */
  open(path: string, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
    return this.failover.send('GET', (base) => openGet(new URL(path, base), headers, signal), signal);
  }

  private send(method: HttpMethod, path: string, body?: Uint8Array): Promise<Uint8Array> {
    const req: HttpRequest = { method, headers: body ? JSON_TYPE : undefined, body, timeoutMs: this.timeoutMs, peer: this.peer };
    return this.failover.send(method, (base) => httpRequest(new URL(path, base), req));
  }
}

/**
 * A GET whose body the caller streams: resolves once the answer's head has
 * come, with a 2xx; a refusal is the server's NimbleError; no answer at all
 * is a NimbleError 'unreachable' whose cause is a TransportError that had not
 * started, so a Failover moves on to the next URL.
 */
async function openGet(url: URL, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<Response> {
  let res: Response;
  try {
    res = await fetch(url, { method: 'GET', headers, signal });
  } catch (err) {
    // no answer began (fetch resolves once the head has come)
    throw new NimbleError('unreachable', `cannot reach ${url.origin}: ${(err as Error).message}`, 502, { cause: new TransportError((err as Error).message, false, { cause: err }) });
  }
  if (!res.ok) throw errorOf(res.status, res.statusText, new Uint8Array(await res.arrayBuffer()), `GET ${url.pathname}`);
  return res;
}

/** Times a signed request refused with 429 is sent again (pauses of about 0.25, 0.5, 1, 2 s). */
const RATE_LIMIT_RETRIES = 4;

/**
 * A client that signs every request with one key (a miner's wallet key to
 * join, its session key after). A path goes to the base URLs (moving on as
 * ./failover.ts says, signed afresh for each); a whole URL (a peer's) goes
 * there alone.
 */
export class SignedClient {
  /** the base URLs and the one requests go to now */
  readonly failover: Failover;

  constructor(
    /** one base URL, several (./failover.ts), or the Failover of other clients of the same service */
    baseUrl: BaseUrls | Failover,
    readonly signer: RequestSigner,
    private readonly timeoutMs = 30_000,
  ) {
    this.failover = Failover.of(baseUrl);
  }

  /** The base URL requests go to now. */
  get baseUrl(): string {
    return this.failover.current.href;
  }

  get address(): `0x${string}` {
    return this.signer.address;
  }

  /**
   * Sends a signed request to `url` (absolute, or a path on the base URLs);
   * returns the body bytes. A 429 (`rate_limited`: the server is taking
   * signatures slower than they come) is sent again, signed afresh, after
   * RATE_LIMIT_RETRIES growing pauses. `timeoutMs` bounds each attempt (the
   * client's own by default; a large upload passes a longer one).
   */
  async request(method: HttpMethod, pathOrUrl: string, body?: Uint8Array, contentType = 'application/octet-stream', timeoutMs = this.timeoutMs): Promise<Uint8Array> {
    if (isAbsoluteUrl(pathOrUrl)) return this.requestAt(new URL(pathOrUrl), method, body, contentType, timeoutMs);
    return this.failover.send(method, (base) => this.requestAt(new URL(pathOrUrl, base), method, body, contentType, timeoutMs));
  }

  private async requestAt(url: URL, method: HttpMethod, body: Uint8Array | undefined, contentType: string, timeoutMs: number): Promise<Uint8Array> {
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { ...(await this.signer.sign(method, url.pathname + url.search, body)) };
      if (body) headers['content-type'] = contentType;
      try {
        return await httpRequest(url, { method, headers, body, timeoutMs });
      } catch (err) {
        if (!(err instanceof NimbleError && err.status === 429) || attempt >= RATE_LIMIT_RETRIES) throw err;
        await new Promise((r) => setTimeout(r, 250 * 2 ** attempt * (0.5 + Math.random())));
      }
    }
  }

  /**
   * Sends a signed GET and returns the response as it starts to arrive (its
   * body a stream), with `headers` added (a Range); an error answer is thrown
   * as the NimbleError it carries.
   */
  async open(pathOrUrl: string, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
    if (isAbsoluteUrl(pathOrUrl)) return this.openAt(new URL(pathOrUrl), headers, signal);
    return this.failover.send('GET', (base) => this.openAt(new URL(pathOrUrl, base), headers, signal), signal);
  }

  private async openAt(url: URL, headers: Record<string, string>, signal: AbortSignal | undefined): Promise<Response> {
    return openGet(url, { ...headers, ...(await this.signer.sign('GET', url.pathname + url.search)) }, signal);
  }

  /** POSTs JSON and validates the JSON reply. */
  async postJson<T extends TSchema>(path: string, value: unknown, reply: T, what: string): Promise<Static<T>> {
    const bytes = await this.request('POST', path, new TextEncoder().encode(JSON.stringify(value)), 'application/json');
    return parseJson(reply, bytes, what);
  }

  /** Sends signed bytes and validates the JSON reply. */
  async postBytes<T extends TSchema>(url: string, body: Uint8Array, reply: T, what: string): Promise<Static<T>> {
    return parseJson(reply, await this.request('POST', url, body), what);
  }
}
