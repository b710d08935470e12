// The client half of the error contract: a request that fails comes back as a
// NimbleError with the server's code and status (or 'unreachable' when there
// was no answer), and JSON replies are validated against their schema.
import type { Static, TSchema } from '@sinclair/typebox';
import { NimbleError } from '../protocol/errors.ts';
import { parseJson } from '../protocol/messages.ts';
import type { RequestSigner } from '../protocol/signing.ts';
import { send, type Sent, type TransportError } from './transport.ts';

export type HttpMethod = 'GET' | 'POST' | 'DELETE';

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
  readonly baseUrl: URL;

  constructor(
    baseUrl: string | URL,
    private readonly timeoutMs = 15_000,
    /** who answers, for messages (e.g. 'the orchestrator') */
    private readonly peer?: string,
  ) {
    try {
      this.baseUrl = new URL(baseUrl);
    } catch {
      throw new NimbleError('invalid', `not a URL: '${String(baseUrl)}'`);
    }
  }

  async get<T extends TSchema>(path: string, reply: T, what: string): Promise<Static<T>> {
    return parseJson(reply, await httpRequest(new URL(path, this.baseUrl), { method: 'GET', timeoutMs: this.timeoutMs, peer: this.peer }), what);
  }

  async post<T extends TSchema>(path: string, value: unknown, reply: T, what: string): Promise<Static<T>> {
    const body = new TextEncoder().encode(JSON.stringify(value));
    return parseJson(reply, await httpRequest(new URL(path, this.baseUrl), { method: 'POST', headers: JSON_TYPE, body, timeoutMs: this.timeoutMs, peer: this.peer }), what);
  }

  async bytes(path: string): Promise<Uint8Array> {
    return httpRequest(new URL(path, this.baseUrl), { method: 'GET', timeoutMs: this.timeoutMs, peer: this.peer });
  }
}

/** A client that signs every request with one key (a miner's wallet key to join, its session key after). */
/** Times a signed request refused with 429 is sent again (pauses of about 0.25, 0.5, 1, 2 s). */
const RATE_LIMIT_RETRIES = 4;

export class SignedClient {
  constructor(
    readonly baseUrl: string,
    readonly signer: RequestSigner,
    private readonly timeoutMs = 30_000,
  ) {}

  get address(): `0x${string}` {
    return this.signer.address;
  }

  /**
   * Sends a signed request to `url` (absolute, or a path on the base URL);
   * returns the body bytes. A 429 (`rate_limited`: the server is taking
   * signatures slower than they come) is sent again, signed afresh, after
   * RATE_LIMIT_RETRIES growing pauses.
   */
  async request(method: HttpMethod, pathOrUrl: string, body?: Uint8Array, contentType = 'application/octet-stream'): Promise<Uint8Array> {
    const url = new URL(pathOrUrl, this.baseUrl);
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { ...(await this.signer.sign(method, url.pathname + url.search, body)) };
      if (body) headers['content-type'] = contentType;
      try {
        return await httpRequest(url, { method, headers, body, timeoutMs: this.timeoutMs });
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
    const url = new URL(pathOrUrl, this.baseUrl);
    let res: Response;
    try {
      res = await fetch(url, { method: 'GET', headers: { ...headers, ...(await this.signer.sign('GET', url.pathname + url.search)) }, signal });
    } catch (err) {
      throw new NimbleError('unreachable', `cannot reach ${url.origin}: ${(err as Error).message}`, 502, { cause: err });
    }
    if (!res.ok) throw errorOf(res.status, res.statusText, new Uint8Array(await res.arrayBuffer()), `GET ${url.pathname}`);
    return res;
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
