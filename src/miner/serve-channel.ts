// The miner's end of serving channels (src/protocol/stage-channel.ts): the
// orchestrator opens one with a signed upgrade (GET /infer/channel) and then
// sends its /infer and /infer/end calls as frames on it, answered in order on
// the same connection. Each call is checked and run exactly as the HTTP
// routes run it (./serve-api.ts hands both the same functions); a call that
// fails answers an ERROR frame with the error the route would answer, and the
// channel stays open. What closes a channel: a frame too long, with a wrong
// MAC, out of sequence or of an unknown kind; an orchestrator that does not
// read its answers; CHANNEL_IDLE_MS without a frame; the server closing.
import { STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { HttpServer } from '../http/server.ts';
import { asNimbleError, AuthError, NimbleError } from '../protocol/errors.ts';
import { bodySha256, type RequestVerifier } from '../protocol/signing.ts';
import {
  CHANNEL_KEY_HEADER, CHANNEL_KEY_RE, CHANNEL_PATH, CHANNEL_PROTOCOL, ChannelError, channelKeyPair, channelKeys,
  encodeChannelFrame, FrameKind, FrameReader, type ChannelFrame,
} from '../protocol/stage-channel.ts';

/** A channel with no frame for this long is closed (the orchestrator opens another when it needs one). */
export const CHANNEL_IDLE_MS = 60_000;
/** Channels open at once at most; opening one more closes the one unused longest. */
export const MAX_CHANNELS = 16;
const EMPTY_SHA256 = bodySha256(undefined);

export interface ServeChannelOptions {
  verifier: RequestVerifier;
  /** the only address that may open a channel */
  orchestrator: string;
  /** the largest payload a frame may carry */
  maxPayload: number;
  /** runs a POST /infer body; the answer's bytes or a NimbleError */
  infer(sender: string, body: Uint8Array): Promise<Uint8Array>;
  /** runs a POST /infer/end body (JSON bytes) */
  end(sender: string, body: Uint8Array): Promise<void>;
  log(line: string): void;
  idleMs?: number;
}

interface Open {
  socket: Socket;
  lastUsed: number;
}

export function serveChannels(app: HttpServer, o: ServeChannelOptions): { closeAll(): void; count(): number } {
  const open = new Set<Open>();
  const idleMs = o.idleMs ?? CHANNEL_IDLE_MS;
  const closeAll = (): void => {
    for (const c of open) c.socket.destroy();
    open.clear();
  };
  // before the server closes: it waits for every connection, and a channel is one until it idles out (60 s)
  app.addHook('preClose', async () => closeAll());
  app.server.on('upgrade', (req: IncomingMessage, duplex: Duplex, head: Buffer) => {
    const socket = duplex as Socket;
    socket.on('error', () => socket.destroy());
    accept(req, socket, head).catch((err: unknown) => refuse(socket, asNimbleError(err)));
  });
  return { closeAll, count: () => open.size };

  async function accept(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> {
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    if ((q < 0 ? url : url.slice(0, q)) !== CHANNEL_PATH) throw new NimbleError('not_found', `no upgrade at ${url.slice(0, 100)}`, 404);
    if (req.method !== 'GET') throw new NimbleError('invalid', 'a serving channel opens with GET', 405);
    if ((req.headers.upgrade ?? '').toLowerCase() !== CHANNEL_PROTOCOL) throw new NimbleError('invalid', `upgrade to ${CHANNEL_PROTOCOL} only`);
    const params = new URLSearchParams(q < 0 ? '' : url.slice(q + 1));
    const keys = params.getAll('key');
    if (keys.length !== 1 || [...params.keys()].length !== 1 || !CHANNEL_KEY_RE.test(keys[0])) throw new NimbleError('invalid', 'the query must be key=<32-byte X25519 public key, base64url>');
    // the kind of key before any signature work: a wallet signature costs a recovery, and only the orchestrator's session key opens a channel
    const v = await o.verifier.verifyHeaders({
      method: 'GET', path: url, headers: req.headers,
      beforeSignatureCheck: (scheme) => {
        if (scheme !== 'session') throw new AuthError('bad_signature', 'a serving channel is opened with a session key, not a wallet key');
      },
    });
    if (v.bodySha256 !== EMPTY_SHA256) throw new NimbleError('invalid', 'an upgrade has no body');
    if (v.signer.toLowerCase() !== o.orchestrator.toLowerCase()) throw new NimbleError('forbidden', 'only the orchestrator opens a serving channel');
    if (socket.destroyed) return;
    const own = channelKeyPair();
    const k = channelKeys(own, keys[0], keys[0], own.publicKey);
    if (open.size >= MAX_CHANNELS) {
      const oldest = [...open].reduce((a, b) => (b.lastUsed < a.lastUsed ? b : a));
      oldest.socket.destroy();
      open.delete(oldest);
    }
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${CHANNEL_PROTOCOL}\r\nConnection: Upgrade\r\n${CHANNEL_KEY_HEADER}: ${own.publicKey}\r\n\r\n`);
    socket.setNoDelay(true);
    const entry: Open = { socket, lastUsed: Date.now() };
    open.add(entry);
    socket.once('close', () => open.delete(entry));
    socket.setTimeout(idleMs, () => socket.destroy());
    const reader = new FrameReader(k.request, o.maxPayload);
    const sender = v.signer;
    let expected = 1;
    const answer = async (f: ChannelFrame): Promise<Buffer> => {
      try {
        if (f.kind === FrameKind.INFER) return encodeChannelFrame(k.answer, f.seq, FrameKind.OK, await o.infer(sender, f.payload));
        await o.end(sender, f.payload);
        return encodeChannelFrame(k.answer, f.seq, FrameKind.OK, Buffer.from('{"ok":true}'));
      } catch (err) {
        const e = asNimbleError(err);
        return encodeChannelFrame(k.answer, f.seq, FrameKind.ERROR, Buffer.from(JSON.stringify({ error: e.message, code: e.code, status: e.status })));
      }
    };
    const close = (why: string): void => {
      if (socket.destroyed) return;
      o.log(`serving channel closed: ${why}`);
      socket.destroy();
    };
    // calls run one after the other, in the order they came, and are answered in that order
    let chain = Promise.resolve();
    const onData = (chunk: Buffer): void => {
      entry.lastUsed = Date.now();
      let frames: ChannelFrame[];
      try {
        frames = reader.push(chunk);
        for (const f of frames) {
          if (f.seq !== expected) throw new ChannelError(`frame ${f.seq} out of sequence (expected ${expected})`);
          if (f.kind !== FrameKind.INFER && f.kind !== FrameKind.END) throw new ChannelError(`a request frame of unknown kind ${f.kind}`);
          expected++;
        }
      } catch (err) {
        return close((err as Error).message);
      }
      for (const f of frames) {
        chain = chain.then(() => (socket.destroyed ? undefined : answer(f).then((bytes) => {
          if (socket.destroyed) return;
          socket.write(bytes);
          // an orchestrator that does not read its answers is not held in memory
          if (socket.writableLength > 2 * o.maxPayload) close('the orchestrator does not read its answers');
        })));
      }
    };
    socket.on('data', onData);
    if (head.byteLength > 0) onData(head);
  }
}

/** Answers a refused upgrade in the error contract and closes the connection. */
function refuse(socket: Socket, e: NimbleError): void {
  if (socket.destroyed) return;
  const json = JSON.stringify({ error: e.message, code: e.code });
  socket.end(`HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(json)}\r\nconnection: close\r\n\r\n${json}`);
}
