// The orchestrator's end of serving channels (src/protocol/stage-channel.ts):
// one connection per stage miner carries every serving call the orchestrator
// makes to it, each call a frame answered on the same connection, instead of
// a signed HTTP request per token and stage. In the serving bench this took
// inference.chain2.ratio from about 0.75 to above 1 (docs/inference.md,
// "Serve figures").
//
// A channel is opened on the first call to a miner (concurrent callers wait
// for the same opening) and closed after IDLE_MS without calls. A miner that
// does not open one (an older miner, anything answering the upgrade with
// something else) is sent its calls as signed HTTP requests for NO_CHANNEL_MS
// before a channel is tried again: the caller sees the same answers either
// way (over HTTP a call has the whole timeout, whatever it asks for). A call
// that gets no answer within its timeout, a channel that closes
// with calls on it, or an answer that fails its MAC fails those calls as
// `unreachable` (the lane fails them over) and drops the channel.
import http from 'node:http';
import type { Socket } from 'node:net';
import { Type } from '@sinclair/typebox';
import { errorOf, SignedClient } from '../../http/client.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { parseJson, type Peer } from '../../protocol/messages.ts';
import type { RequestSigner } from '../../protocol/signing.ts';
import {
  CHANNEL_KEY_HEADER, CHANNEL_KEY_RE, CHANNEL_PATH, CHANNEL_PROTOCOL, ChannelError, channelKeyPair, channelKeys,
  encodeChannelFrame, FrameKind, FrameReader, type ChannelKeys,
} from '../../protocol/stage-channel.ts';

/** A channel unused this long is closed (below the miners' own CHANNEL_IDLE_MS). */
export const IDLE_MS = 20_000;
/** After a failed opening, a miner's calls go over HTTP this long before a channel is tried again. */
export const NO_CHANNEL_MS = 30_000;
/** The largest answer taken (a whole prompt's activations, as the HTTP path takes). */
const MAX_ANSWER_BYTES = 64 << 20;
const ErrorAnswer = Type.Object({ error: Type.String(), code: Type.String({ pattern: '^[a-z_0-9]{1,64}$' }), status: Type.Integer({ minimum: 400, maximum: 599 }) });

/** What a serving call is: a POST /infer body, or a POST /infer/end JSON body. */
export type ServingCall = 'infer' | 'end';

interface Pending {
  resolve(bytes: Uint8Array): void;
  reject(err: Error): void;
  timer: NodeJS.Timeout;
}

class Channel {
  private seq = 0;
  private readonly pending = new Map<number, Pending>();
  private readonly reader: FrameReader;
  private idle: NodeJS.Timeout | null = null;
  closed = false;

  constructor(
    private readonly socket: Socket,
    private readonly keys: ChannelKeys,
    private readonly origin: string,
    private readonly onClose: () => void,
  ) {
    this.reader = new FrameReader(keys.answer, MAX_ANSWER_BYTES);
    socket.setNoDelay(true);
    // an idle channel does not keep the process alive; a call's timer does
    socket.unref();
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('error', (err) => this.close(err.message));
    socket.on('close', () => this.close('the miner closed it'));
    this.armIdle();
  }

  call(kind: ServingCall, payload: Uint8Array, timeoutMs: number): Promise<Uint8Array> {
    if (this.closed) return Promise.reject(new NimbleError('unreachable', `the serving channel to ${this.origin} is closed`, 502));
    const seq = ++this.seq;
    if (this.idle) clearTimeout(this.idle);
    this.idle = null;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => this.close(`no answer in ${timeoutMs} ms`), timeoutMs);
      this.pending.set(seq, { resolve, reject, timer });
      this.socket.write(encodeChannelFrame(this.keys.request, seq, kind === 'infer' ? FrameKind.INFER : FrameKind.END, payload));
    });
  }

  private receive(chunk: Buffer): void {
    try {
      for (const f of this.reader.push(chunk)) {
        const p = this.pending.get(f.seq);
        if (!p) throw new ChannelError(`an answer to frame ${f.seq}, which is not waiting for one`);
        this.pending.delete(f.seq);
        clearTimeout(p.timer);
        if (f.kind === FrameKind.OK) p.resolve(f.payload);
        else if (f.kind === FrameKind.ERROR) {
          try {
            const e = parseJson(ErrorAnswer, f.payload, 'serving channel error');
            p.reject(new NimbleError(e.code, e.error.slice(0, 1000), e.status));
          } catch {
            p.reject(errorOf(502, 'Bad Gateway', f.payload, 'serving channel'));
          }
        } else throw new ChannelError(`an answer of unknown kind ${f.kind}`);
      }
    } catch (err) {
      return this.close(`the miner's answer is malformed: ${(err as Error).message}`);
    }
    if (this.pending.size === 0) this.armIdle();
  }

  private armIdle(): void {
    if (this.idle) clearTimeout(this.idle);
    this.idle = setTimeout(() => this.close('idle'), IDLE_MS);
    this.idle.unref();
  }

  close(why: string): void {
    if (this.closed) return;
    this.closed = true;
    if (this.idle) clearTimeout(this.idle);
    this.socket.destroy();
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new NimbleError('unreachable', `the serving channel to ${this.origin} failed: ${why}`, 502));
    }
    this.pending.clear();
    this.onClose();
  }
}

/** Serving calls to stage miners: on a channel per miner, or over HTTP where a miner opens none. */
export class StageChannels {
  private readonly channels = new Map<string, Promise<Channel>>();
  private readonly noChannelUntil = new Map<string, number>();
  private readonly http: SignedClient;

  constructor(private readonly signer: RequestSigner, private readonly timeoutMs = 30_000) {
    this.http = new SignedClient('http://127.0.0.1', signer, timeoutMs);
  }

  /**
   * Sends one call to `peer`; its answer's bytes, or the NimbleError the
   * miner answered (or `unreachable`, also when no answer came within
   * `timeoutMs`: on a channel, that closes it with every call on it).
   */
  async call(peer: Peer, kind: ServingCall, payload: Uint8Array, timeoutMs = this.timeoutMs): Promise<Uint8Array> {
    const origin = new URL(peer.url).origin;
    const until = this.noChannelUntil.get(origin);
    if (until !== undefined && Date.now() < until) return this.overHttp(origin, kind, payload);
    let channel: Channel;
    try {
      channel = await this.channel(origin);
    } catch {
      this.noChannelUntil.set(origin, Date.now() + NO_CHANNEL_MS);
      return this.overHttp(origin, kind, payload);
    }
    return channel.call(kind, payload, timeoutMs);
  }

  /** Open channels (tests). */
  get size(): number {
    return this.channels.size;
  }

  /** Closes every channel (calls on them fail as unreachable). */
  close(): void {
    for (const c of this.channels.values()) void c.then((ch) => ch.close('closed by the orchestrator'), () => {});
    this.channels.clear();
  }

  private overHttp(origin: string, kind: ServingCall, payload: Uint8Array): Promise<Uint8Array> {
    return this.http.request('POST', `${origin}${kind === 'infer' ? '/infer' : '/infer/end'}`, payload, kind === 'infer' ? 'application/octet-stream' : 'application/json');
  }

  private channel(origin: string): Promise<Channel> {
    const existing = this.channels.get(origin);
    if (existing) return existing;
    const opening = this.open(origin);
    this.channels.set(origin, opening);
    opening.catch(() => {
      if (this.channels.get(origin) === opening) this.channels.delete(origin);
    });
    return opening;
  }

  /** Opens a channel to the miner at `origin` (a signed upgrade). */
  private async open(origin: string): Promise<Channel> {
    const own = channelKeyPair();
    const url = new URL(`${CHANNEL_PATH}?key=${own.publicKey}`, origin);
    const headers = { ...(await this.signer.sign('GET', url.pathname + url.search)), connection: 'Upgrade', upgrade: CHANNEL_PROTOCOL };
    return new Promise<Channel>((resolve, reject) => {
      const req = http.request(url, { method: 'GET', headers, agent: false });
      const timer = setTimeout(() => {
        req.destroy();
        reject(new NimbleError('unreachable', `${origin} did not open a serving channel in ${this.timeoutMs} ms`, 502));
      }, this.timeoutMs);
      req.on('error', (err) => {
        clearTimeout(timer);
        reject(new NimbleError('unreachable', `cannot open a serving channel to ${origin}: ${err.message}`, 502));
      });
      req.on('response', (res) => {
        // not an upgrade: the miner's error answer
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          clearTimeout(timer);
          reject(errorOf(res.statusCode ?? 502, res.statusMessage ?? '', Buffer.concat(chunks), `GET ${CHANNEL_PATH}`));
        });
        res.on('error', () => undefined);
      });
      req.on('upgrade', (res, socket: Socket, head: Buffer) => {
        clearTimeout(timer);
        const minerKey = res.headers[CHANNEL_KEY_HEADER];
        if (res.headers.upgrade?.toLowerCase() !== CHANNEL_PROTOCOL || typeof minerKey !== 'string' || !CHANNEL_KEY_RE.test(minerKey)) {
          socket.destroy();
          return reject(new NimbleError('unreachable', `${origin} answered the upgrade without a ${CHANNEL_PROTOCOL} channel key`, 502));
        }
        let keys: ChannelKeys;
        try {
          keys = channelKeys(own, minerKey, own.publicKey, minerKey);
        } catch (err) {
          socket.destroy();
          return reject(new NimbleError('unreachable', `${origin}'s channel key: ${(err as Error).message}`, 502));
        }
        const channel: Channel = new Channel(socket, keys, origin, () => {
          if (this.channels.get(origin) === opened) this.channels.delete(origin);
        });
        const opened = Promise.resolve(channel);
        this.channels.set(origin, opened);
        // nothing is sent to us before our first frame
        if (head.byteLength > 0) channel.close('the miner sent bytes before any call');
        resolve(channel);
      });
      req.end();
    });
  }
}
