// How a request goes out: node:http on a keep-alive agent for http: URLs (the
// loopback and LAN traffic of the network: a miner's calls to its peers, the
// orchestrator's serving calls, one per token and stage), fetch for the rest.
// On this path fetch costs about 0.7 ms a round trip on loopback where
// node:http costs 0.2 (measured in one process, 4 KiB each way), and the
// orchestrator relaying a generation makes two such calls per token.
//
// A connection that breaks before the answer starts is 'unreachable' (the
// caller may try another peer); one that breaks after it started is an answer
// cut off. A failure before the connection was even open (refused, no route,
// a connect that timed out) says so: the server cannot have seen the request
// (./failover.ts moves a POST to another orchestrator only then). A pooled connection the server closed while idle is not retried
// here: the agent drops idle sockets after IDLE_SOCKET_MS, well before the
// servers' own keep-alive timeout (src/http/server.ts).
import http from 'node:http';

/** Idle pooled connections are closed after this long (below the servers' keep-alive timeout). */
export const IDLE_SOCKET_MS = 4_000;

const agent = new http.Agent({ keepAlive: true, maxSockets: 256, maxFreeSockets: 64, timeout: IDLE_SOCKET_MS, scheduling: 'lifo' });

export interface Sent {
  status: number;
  statusText: string;
  bytes: Uint8Array;
}

/**
 * Why a request got no whole answer: `started` says whether the answer had
 * begun; `connected` whether a connection to the server was open (a pooled
 * one counts), or undefined when the transport cannot tell (fetch).
 */
export class TransportError extends Error {
  override readonly name = 'TransportError';
  constructor(
    message: string,
    readonly started: boolean,
    options?: ErrorOptions,
    readonly connected?: boolean,
  ) {
    super(message, options);
  }
}

/** Sends one request and reads the whole answer, or throws a TransportError. */
export function send(url: URL, method: string, headers: Record<string, string> | undefined, body: Uint8Array | undefined, timeoutMs: number): Promise<Sent> {
  if (url.protocol !== 'http:') return sendWithFetch(url, method, headers, body, timeoutMs);
  return new Promise<Sent>((resolve, reject) => {
    let started = false;
    let connected = false;
    let settled = false;
    const fail = (err: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      reject(new TransportError(err.message, started, { cause: err }, connected));
    };
    const req = http.request(url, { method, agent, headers: { ...headers, 'content-length': String(body?.byteLength ?? 0) } }, (res) => {
      started = true;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', fail);
      res.on('aborted', () => fail(new Error('the connection closed mid-answer')));
      res.on('end', () => {
        if (settled) return;
        if (!res.complete) return fail(new Error('the connection closed mid-answer'));
        settled = true;
        clearTimeout(timer);
        const all = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, statusText: res.statusMessage ?? '', bytes: new Uint8Array(all.buffer, all.byteOffset, all.byteLength) });
      });
    });
    const timer = setTimeout(() => {
      fail(new Error(`no whole answer in ${timeoutMs} ms`));
      req.destroy();
    }, timeoutMs);
    req.on('error', fail);
    req.on('socket', (socket) => {
      if (!socket.connecting) connected = true;
      else socket.once('connect', () => (connected = true));
    });
    req.end(body);
  });
}

async function sendWithFetch(url: URL, method: string, headers: Record<string, string> | undefined, body: Uint8Array | undefined, timeoutMs: number): Promise<Sent> {
  let res: Response;
  try {
    res = await fetch(url, { method, headers, body: body as BodyInit | undefined, signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    throw new TransportError((err as Error).message, false, { cause: err });
  }
  try {
    return { status: res.status, statusText: res.statusText, bytes: new Uint8Array(await res.arrayBuffer()) };
  } catch (err) {
    throw new TransportError((err as Error).message, true, { cause: err });
  }
}
