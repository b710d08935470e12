// A follower orchestrator's HTTP front (./member.ts): every request, any
// method and path, is passed on unchanged to the leader's URL and its answer
// streamed back as it comes (server-sent events included), so a client may talk
// to any orchestrator of a cluster. Bodies are piped both ways, never held
// whole. Hop-by-hop headers stay on their hop; the leader learns the client's
// address from FORWARDED_FOR with its proof under the term's key that the
// lease gives the members (../dashboard/auth.ts believes it only with that
// proof, from this machine: no other local process can name a client). Without a leader, or when the leader does not answer,
// the client gets the error contract (src/protocol/errors.ts), in OpenAI's
// shape under /v1/ (src/api/completions.ts).
import { Agent, createServer, request, type ClientRequest, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream';
import type { OpenAiErrorBody } from '../../api/completions.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { FORWARDED_FOR, FORWARDED_PROOF, clientAddressOf, forwardedProof } from '../dashboard/auth.ts';

export { FORWARDED_FOR };

/** How long the leader may take to answer a request's head by default (a stream's body then has no limit). */
export const DEFAULT_HEADERS_TIMEOUT_MS = 60_000;

export interface ForwarderOptions {
  host: string;
  /** 0: any free port */
  port: number;
  /** the leader's base URL (http://host:port), or null when none is known */
  leader: () => string | null;
  /** the key of the leader's term (../cluster/lease.ts) the client's address is proven with; null: it is sent unproven (and not believed) */
  forwardKey?: () => string | null;
  /** how long the leader may take to send an answer's status and headers (default DEFAULT_HEADERS_TIMEOUT_MS) */
  headersTimeoutMs?: number;
  log?: (line: string) => void;
}

export interface Forwarder {
  /** where it answers: http://host:port */
  url: string;
  port: number;
  /** Stops listening, cuts the connections open (streams included). */
  close(): Promise<void>;
}

/** Headers of one hop only (RFC 9110, 7.6.1), never passed on; `expect` too: this server already answered it. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'expect']);

/** `headers` without the hop-by-hop ones, nor those its Connection header names, nor `drop`. */
function endToEnd(headers: IncomingHttpHeaders, drop: readonly string[] = []): OutgoingHttpHeaders {
  const named = String(headers.connection ?? '').toLowerCase().split(',').map((s) => s.trim());
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !HOP_BY_HOP.has(name) && !named.includes(name) && !drop.includes(name)) out[name] = value;
  }
  return out;
}

/** Answers `err` in the error contract, or in OpenAI's shape for the /v1 routes (unless an answer was started: then cuts it). */
function fail(req: IncomingMessage, res: ServerResponse, err: NimbleError): void {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  const openAi = (req.url ?? '').startsWith('/v1/');
  const body = openAi
    ? ({ error: { message: err.message, type: 'server_error', param: null, code: err.code } } satisfies OpenAiErrorBody)
    : { error: err.message, code: err.code };
  const json = JSON.stringify(body);
  res.writeHead(err.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json), 'cache-control': 'no-store' });
  res.end(req.method === 'HEAD' ? undefined : json);
}

/** Starts the forwarder on `options.host`:`options.port`. */
export async function startForwarder(options: ForwarderOptions): Promise<Forwarder> {
  const headersTimeoutMs = options.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
  const log = options.log ?? ((): void => {});
  // an idle connection is dropped after 30 s, or a second before the leader says it will drop it (its Keep-Alive header)
  const agent = new Agent({ keepAlive: true, timeout: 30_000 });

  const forward = (req: IncomingMessage, res: ServerResponse, retried = false): void => {
    // A 503 for no leader, or for a connection to the leader that could not be made (refused, unreachable), is
    // answered before the leader saw the request: the client may safely send it again, here or to another
    // orchestrator. A connection that fails after the request went out (reset, timeout) leaves the client as
    // unsure as it would be without a forwarder.
    let leader: URL;
    try {
      const base = options.leader();
      if (base === null) return fail(req, res, new NimbleError('unreachable', 'no orchestrator leads this network right now; try again in a few seconds', 503));
      leader = new URL(base);
      if (leader.protocol !== 'http:') throw new Error(`${leader.protocol} is not http:`);
    } catch (err) {
      log(`forwarder: the leader's URL is not valid: ${(err as Error).message}`);
      return fail(req, res, new NimbleError('unreachable', 'no orchestrator leads this network right now; try again in a few seconds', 503));
    }
    const path = req.url ?? '/';
    if (!path.startsWith('/')) return fail(req, res, new NimbleError('invalid', 'the request target must be a path', 400));
    const headers = endToEnd(req.headers, ['host', FORWARDED_FOR, FORWARDED_PROOF]);
    // the client's Host stays: the leader checks a dashboard action's Origin against the host the page was loaded from
    headers.host = req.headers.host ?? leader.host;
    const key = options.forwardKey?.() ?? null;
    const client = clientAddressOf(req, key);
    headers[FORWARDED_FOR] = client;
    if (key) headers[FORWARDED_PROOF] = forwardedProof(key, req.method ?? 'GET', path, client);
    let upstream: ClientRequest;
    try {
      upstream = request({ protocol: leader.protocol, hostname: leader.hostname.replace(/^\[|\]$/g, ''), port: leader.port, method: req.method, path, headers, agent });
    } catch (err) {
      return fail(req, res, new NimbleError('invalid', `the request cannot be passed on: ${(err as Error).message}`, 400));
    }
    let answered = false;
    // whether the request may have reached the leader: once a connection to it was open, a failure is no longer 'unreachable'
    let connected = false;
    upstream.once('socket', (socket) => {
      if (!socket.connecting) connected = true;
      else socket.once('connect', () => (connected = true));
    });
    const timer = setTimeout(() => upstream.destroy(Object.assign(new Error(`no answer within ${headersTimeoutMs / 1000} s`), { code: 'ETIMEDOUT_HEADERS' })), headersTimeoutMs);
    upstream.once('close', () => clearTimeout(timer));
    // the client went away: so does the request to the leader (a stream it was sending is closed)
    res.once('close', () => {
      if (!res.writableFinished) upstream.destroy();
    });
    const bodiless = req.headers['transfer-encoding'] === undefined && (req.headers['content-length'] ?? '0') === '0';
    upstream.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (answered || res.destroyed) return;
      req.unpipe(upstream);
      req.resume();
      // a kept-alive connection the leader had just closed: once more on a new one (only a request without a body can be sent again)
      if (upstream.reusedSocket && err.code === 'ECONNRESET' && bodiless && !retried) return forward(req, res, true);
      const timedOut = err.code === 'ETIMEDOUT_HEADERS';
      log(`forwarder: ${req.method} ${path.slice(0, 200)} → ${leader.origin}: ${err.message}`);
      if (timedOut) return fail(req, res, new NimbleError('timeout', `the leading orchestrator at ${leader.origin} did not answer within ${headersTimeoutMs / 1000} s`, 504));
      // connected: the leader may have acted on it, so it is not a 503 'unreachable' (which clients send again elsewhere)
      if (connected) return fail(req, res, new NimbleError('leader_failed', `the leading orchestrator at ${leader.origin} failed before answering: ${err.message}`, 502));
      fail(req, res, new NimbleError('unreachable', `the leading orchestrator at ${leader.origin} could not be reached: ${err.message}; try again in a few seconds`, 503));
    });
    upstream.on('response', (answer: IncomingMessage) => {
      answered = true;
      clearTimeout(timer);
      if (res.destroyed) return void answer.destroy();
      try {
        res.writeHead(answer.statusCode ?? 502, endToEnd(answer.headers));
        // the head goes out at once: a stream's client sees the answer start before its first event
        res.flushHeaders();
      } catch (err) {
        log(`forwarder: the leader's answer cannot be passed on: ${(err as Error).message}`);
        answer.destroy();
        return void res.destroy();
      }
      // a leader failing mid-answer cuts the client's answer (never a truncated one that looks complete), and the reverse
      pipeline(answer, res, (err) => {
        if (err) {
          res.destroy();
          upstream.destroy();
        }
      });
    });
    if (bodiless) upstream.end();
    else req.pipe(upstream);
  };

  // a malformed request is node's to answer (400, 408 or 431, then the connection closes)
  const server = createServer((req, res) => {
    req.on('error', () => {}); // a client's abort is handled through res 'close'
    forward(req, res);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => log(`forwarder: ${err.message}`));
  const port = (server.address() as AddressInfo).port;
  const host = options.host.includes(':') ? `[${options.host}]` : options.host;
  return {
    url: `http://${host}:${port}`,
    port,
    close: async (): Promise<void> => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      agent.destroy();
      await closed;
    },
  };
}
