// Sends the fuzz tests' requests (fuzz-requests.ts) and records what came
// back: the status and the start of the body, or how the connection failed.
// HTTP requests go over keep-alive connections (a few per server); raw bytes
// and oversized bodies announced in content-length get a connection of their
// own, which is dropped once the answer is in.
import { Agent, request } from 'node:http';
import { connect } from 'node:net';
import type { FuzzRequest } from './fuzz-requests.ts';

export interface FuzzResult {
  req: FuzzRequest;
  /** null: no answer */
  status: number | null;
  /** the answer's body (its first 64 KiB) */
  body: string;
  /** how the connection failed, when no answer came */
  error: string | null;
  /** the server refused the request (a head past the parser's limit) and closed before its answer could be read: no body to check */
  cutShort?: boolean;
}

/** Gives up on an answer after this long (the server's own limits are shorter). */
const ANSWER_TIMEOUT_MS = 40_000;

/** Node's http.maxHeaderSize: the request line and headers past it get 431 from its parser, before any route. */
const HEAD_LIMIT = 16 * 1024;

function headBytes(method: string, path: string, headers: Record<string, string>): number {
  return method.length + path.length + 12 + Object.entries(headers).reduce((n, [k, v]) => n + k.length + v.length + 4, 0);
}

export function sendFuzz(req: FuzzRequest, agent: Agent): Promise<FuzzResult> {
  return req.raw ? sendRaw(req) : sendHttp(req, agent);
}

function sendHttp(req: FuzzRequest, agent: Agent): Promise<FuzzResult> {
  return new Promise((resolve) => {
    const url = new URL(req.target);
    let done = false;
    const finish = (status: number | null, body: string, error: string | null, cutShort = false): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve({ req, status, body: body.slice(0, 1 << 16), error, ...(cutShort ? { cutShort } : {}) });
    };
    const headers: Record<string, string> = { ...req.headers };
    if (req.announce !== undefined) headers['content-length'] = String(req.announce);
    else if (req.body) headers['content-length'] = String(req.body.length);
    let r: ReturnType<typeof request>;
    try {
      r = request({ host: url.hostname, port: url.port, method: req.method, path: req.path, headers, agent: req.announce !== undefined ? false : agent });
    } catch (err) {
      // the client library refuses it (a header value it cannot send): nothing reached the server
      return finish(0, '', `client refused: ${(err as Error).message}`);
    }
    const timer = setTimeout(() => {
      r.destroy();
      finish(null, '', 'no answer in time');
    }, ANSWER_TIMEOUT_MS);
    r.on('response', (res) => {
      const parts: Buffer[] = [];
      let size = 0;
      res.on('data', (d: Buffer) => {
        if (size < 1 << 16) parts.push(d);
        size += d.length;
      });
      const end = (): void => {
        finish(res.statusCode ?? null, Buffer.concat(parts).toString('utf8'), null);
        if (req.announce !== undefined) r.destroy();
      };
      res.on('end', end);
      res.on('error', end);
    });
    r.on('error', (err) => {
      const code = (err as NodeJS.ErrnoException).code ?? err.message;
      // a head past Node's parser limit is answered 431 and the socket closed at once: the client, still
      // writing, may see the close (EPIPE, ECONNRESET) before the answer; the server refused it, nothing broke
      if (headBytes(req.method, req.path, headers) > HEAD_LIMIT && (code === 'EPIPE' || code === 'ECONNRESET')) return finish(431, '', null, true);
      finish(null, '', code);
    });
    if (req.body && req.body.length) r.write(req.body);
    else if (req.announce !== undefined) r.flushHeaders();
    if (req.announce === undefined) r.end();
  });
}

/** Raw bytes on a fresh connection: the status line of whatever comes back before the server closes it. */
function sendRaw(req: FuzzRequest): Promise<FuzzResult> {
  return new Promise((resolve) => {
    const url = new URL(req.target);
    const socket = connect(Number(url.port), url.hostname);
    let got = '';
    let done = false;
    const finish = (error: string | null): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(got);
      resolve({ req, status: m ? Number(m[1]) : null, body: got.slice(got.indexOf('\r\n\r\n') + 4), error: m ? null : error ?? 'closed without an answer' });
    };
    const timer = setTimeout(() => finish('no answer in time'), ANSWER_TIMEOUT_MS);
    socket.on('data', (d) => {
      got += d.toString('latin1');
      // one whole answer is enough
      const head = got.indexOf('\r\n\r\n');
      const len = /content-length: (\d+)/i.exec(got.slice(0, head));
      if (head >= 0 && (!len || got.length >= head + 4 + Number(len[1]))) finish(null);
    });
    socket.on('error', (err) => finish((err as NodeJS.ErrnoException).code ?? err.message));
    socket.on('close', () => finish(null));
    socket.write(req.raw!);
  });
}
