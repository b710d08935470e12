// The miner's side of the orchestrator API: every request signed with the
// miner's key, every reply validated.
import type { Static, TSchema } from '@sinclair/typebox';
import type { Hex } from 'viem';
import { parseJson } from '../protocol/messages.ts';
import { RequestSigner } from '../protocol/signing.ts';

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export class SignedClient {
  readonly signer: RequestSigner;

  constructor(
    readonly baseUrl: string,
    privateKey: Hex,
    private readonly timeoutMs = 30_000,
  ) {
    this.signer = new RequestSigner(privateKey);
  }

  get address(): string {
    return this.signer.address;
  }

  /** Sends a signed request to `url` (absolute, or a path on the base URL); returns the body bytes. */
  async request(method: 'GET' | 'POST', pathOrUrl: string, body?: Uint8Array, contentType = 'application/octet-stream'): Promise<Uint8Array> {
    const url = new URL(pathOrUrl, this.baseUrl);
    const headers: Record<string, string> = { ...(await this.signer.sign(method, url.pathname + url.search, body)) };
    if (body) headers['content-type'] = contentType;
    const res = await fetch(url, { method, headers, body: body as BodyInit | undefined, signal: AbortSignal.timeout(this.timeoutMs) });
    const bytes = new Uint8Array(await res.arrayBuffer());
    if (!res.ok) {
      let message = `${res.status} ${res.statusText}`;
      try {
        message = (JSON.parse(new TextDecoder().decode(bytes)) as { error?: string }).error ?? message;
      } catch {
        // not JSON
      }
      throw new HttpError(res.status, `${method} ${url.pathname}: ${message}`);
    }
    return bytes;
  }

  /** POSTs JSON and validates the JSON reply. */
  async postJson<T extends TSchema>(path: string, value: unknown, reply: T, what: string): Promise<Static<T>> {
    const bytes = await this.request('POST', path, new TextEncoder().encode(JSON.stringify(value)), 'application/json');
    return parseJson(reply, bytes, what);
  }
}
