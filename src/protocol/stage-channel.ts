// The serving channel's wire format (docs/protocol.md, "Serving channel"):
// one TCP connection from the orchestrator to a stage miner that carries its
// serving calls for as long as it is used, instead of one signed HTTP request
// per token and stage. On this machine a signed HTTP call cost about 1.4 ms
// of CPU between the two ends, more than the stage's own compute at 4
// sessions; a frame on the channel costs a few hundredths of that.
//
// Opening: an HTTP/1.1 upgrade, signed like any request of the orchestrator's
// (./signing.ts), whose query carries the orchestrator's ephemeral X25519 key:
//
//   GET /infer/channel?key=<X25519 public key, base64url>
//   Connection: Upgrade
//   Upgrade: nimble-infer/1
//   x-nimble-address, -timestamp, -nonce, -content-sha256, -signature
//
// The miner answers `101 Switching Protocols` with its own ephemeral key in
// `x-nimble-channel-key`; both sides derive two HMAC keys from the X25519
// secret (HKDF-SHA256 over both public keys), one per direction. The signed
// query binds the orchestrator's key to its signature, so nobody else can
// derive the miner's keys and send frames the miner accepts; each frame
// carries its own MAC and sequence number, so frames cannot be changed,
// replayed or reordered on the way.
//
// Frames, either way:
//
//   u32 LE   length of what follows (41 + payload bytes)
//   u32 LE   sequence number: requests count 1, 2, 3, … on a channel; an answer repeats its request's
//   u8       kind: requests INFER (payload: a POST /infer body) or END (payload: a POST /infer/end JSON body);
//            answers OK (payload: what the route answers) or ERROR (payload: {error, code, status} JSON)
//   32 B     HMAC-SHA256 of (sequence, kind, payload) under the direction's key
//   payload
import { createHmac, createPublicKey, diffieHellman, generateKeyPairSync, hkdfSync, timingSafeEqual, type KeyObject } from 'node:crypto';

export const CHANNEL_PROTOCOL = 'nimble-infer/1';
export const CHANNEL_PATH = '/infer/channel';
/** The header of the 101 answer that carries the miner's ephemeral key. */
export const CHANNEL_KEY_HEADER = 'x-nimble-channel-key';
/** An X25519 public key: 32 bytes, base64url. */
export const CHANNEL_KEY_RE = /^[A-Za-z0-9_-]{43}$/;

export const FrameKind = { INFER: 1, END: 2, OK: 3, ERROR: 4 } as const;
export type FrameKind = (typeof FrameKind)[keyof typeof FrameKind];

const MAC_BYTES = 32;
/** Bytes of a frame before its payload (length, sequence, kind, MAC). */
export const FRAME_HEAD_BYTES = 4 + 4 + 1 + MAC_BYTES;

/** An ephemeral X25519 key pair for one channel. */
export interface ChannelKeyPair {
  privateKey: KeyObject;
  /** base64url of the raw public key */
  publicKey: string;
}

export function channelKeyPair(): ChannelKeyPair {
  const { privateKey, publicKey } = generateKeyPairSync('x25519');
  const x = publicKey.export({ format: 'jwk' }).x;
  if (typeof x !== 'string') throw new Error('cannot export an X25519 public key');
  return { privateKey, publicKey: x };
}

/** The two directions' MAC keys. */
export interface ChannelKeys {
  /** orchestrator to miner */
  request: Buffer;
  /** miner to orchestrator */
  answer: Buffer;
}

/**
 * The MAC keys of a channel from one side's key pair and the other side's
 * public key; `orchestratorKey` and `minerKey` are the two public keys (both
 * sides pass them in the same order). Throws RangeError for a malformed key.
 */
export function channelKeys(own: ChannelKeyPair, peerPublicKey: string, orchestratorKey: string, minerKey: string): ChannelKeys {
  if (!CHANNEL_KEY_RE.test(peerPublicKey)) throw new RangeError('the channel key is not 32 bytes of base64url');
  let peer: KeyObject;
  try {
    peer = createPublicKey({ key: { kty: 'OKP', crv: 'X25519', x: peerPublicKey }, format: 'jwk' });
  } catch {
    throw new RangeError('the channel key is not an X25519 public key');
  }
  const secret = diffieHellman({ privateKey: own.privateKey, publicKey: peer });
  const salt = Buffer.from(`${CHANNEL_PROTOCOL}\n${orchestratorKey}\n${minerKey}`);
  const okm = Buffer.from(hkdfSync('sha256', secret, salt, 'nimble serving channel keys', 2 * MAC_BYTES));
  return { request: okm.subarray(0, MAC_BYTES), answer: okm.subarray(MAC_BYTES) };
}

function mac(key: Buffer, seq: number, kind: number, payload: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32LE(seq, 0);
  head[4] = kind;
  return createHmac('sha256', key).update(head).update(payload).digest();
}

/** One frame's bytes. */
export function encodeChannelFrame(key: Buffer, seq: number, kind: FrameKind, payload: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(FRAME_HEAD_BYTES + payload.byteLength);
  out.writeUInt32LE(FRAME_HEAD_BYTES - 4 + payload.byteLength, 0);
  out.writeUInt32LE(seq, 4);
  out[8] = kind;
  mac(key, seq, kind, payload).copy(out, 9);
  out.set(payload, FRAME_HEAD_BYTES);
  return out;
}

export interface ChannelFrame {
  seq: number;
  kind: number;
  payload: Uint8Array;
}

/** Why a channel is closed: a frame that is too long, forged, out of order or of an unknown kind. */
export class ChannelError extends Error {
  override readonly name = 'ChannelError';
}

/**
 * Cuts a byte stream into frames and checks each one's MAC under `key`.
 * `push` returns the whole frames received so far (in order) and throws a
 * ChannelError for a frame announced longer than `maxPayload` (before its
 * bytes are held) or whose MAC does not match; the channel is then closed.
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private held = 0;

  constructor(private readonly key: Buffer, private readonly maxPayload: number) {}

  push(chunk: Buffer): ChannelFrame[] {
    this.chunks.push(chunk);
    this.held += chunk.byteLength;
    const out: ChannelFrame[] = [];
    for (;;) {
      if (this.held < 4) return out;
      if (this.chunks[0].byteLength < 4) this.chunks = [Buffer.concat(this.chunks, this.held)];
      const length = this.chunks[0].readUInt32LE(0);
      if (length < FRAME_HEAD_BYTES - 4 || length - (FRAME_HEAD_BYTES - 4) > this.maxPayload) {
        throw new ChannelError(`a frame of ${length} bytes: at most ${this.maxPayload + FRAME_HEAD_BYTES - 4}, at least ${FRAME_HEAD_BYTES - 4}`);
      }
      // joined once the whole frame is here (a large frame arrives in many chunks)
      if (this.held < 4 + length) return out;
      const buf = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.held);
      const seq = buf.readUInt32LE(4);
      const kind = buf[8];
      const given = buf.subarray(9, FRAME_HEAD_BYTES);
      // a copy: the payload outlives the stream's buffers
      const payload = new Uint8Array(buf.subarray(FRAME_HEAD_BYTES, 4 + length));
      if (!timingSafeEqual(given, mac(this.key, seq, kind, payload))) throw new ChannelError(`frame ${seq}'s MAC does not match`);
      out.push({ seq, kind, payload });
      const rest = buf.subarray(4 + length);
      this.chunks = rest.byteLength ? [rest] : [];
      this.held = rest.byteLength;
    }
  }
}
