// The text of one generation as its tokens are sampled: each token decoded
// (./tokenizer.ts: a byte for the byte tokenizer, whole UTF-8 characters for
// a Hugging Face one), the end found (an eos token, or the first stop
// sequence, which is not part of the text), and the bytes that may be shown
// so far (a stop sequence is held back until it can no longer start).
import type { ServingTokenizer, TokenDecoder } from './tokenizer.ts';

export class TextOutput {
  private readonly bytes: number[] = [];
  private readonly decoder: TokenDecoder;
  private readonly eos: ReadonlySet<number>;
  private readonly hold: number;
  private sent = 0;
  /** where the text ends (a stop sequence's start), once found */
  private end = -1;
  /** why it ended: an eos token or a stop sequence */
  private stopped = false;

  constructor(tokenizer: ServingTokenizer, private readonly stops: readonly Uint8Array[]) {
    this.decoder = tokenizer.decoder();
    this.eos = new Set(tokenizer.eosTokenIds);
    this.hold = stops.reduce((m, s) => Math.max(m, s.length - 1), 0);
  }

  /** Adds a sampled token; true when the text is done (an eos token, or a stop sequence appeared). */
  push(token: number): boolean {
    if (this.eos.has(token)) {
      this.append(this.decoder.flush());
      this.stopped = true;
      if (this.end < 0) this.end = this.bytes.length;
      return true;
    }
    return this.append(this.decoder.push(token));
  }

  /** Ends the text at max_tokens: what the decoder holds comes out (a stop sequence in it still cuts). */
  finish(): void {
    if (this.end >= 0) return;
    this.append(this.decoder.flush());
    if (this.end < 0) this.end = this.bytes.length;
  }

  /** 'stop' (an eos token or a stop sequence) or 'length'. */
  get finishReason(): 'stop' | 'length' {
    return this.stopped ? 'stop' : 'length';
  }

  /** The bytes not handed out yet that may be shown now (all of them once the text has ended). */
  take(): Uint8Array {
    const upTo = this.end >= 0 ? this.end : this.bytes.length - this.hold;
    if (upTo <= this.sent) return new Uint8Array(0);
    const out = Uint8Array.from(this.bytes.slice(this.sent, upTo));
    this.sent = upTo;
    return out;
  }

  /** The whole text (once it has ended: up to its end). */
  text(): Uint8Array {
    return Uint8Array.from(this.end >= 0 ? this.bytes.slice(0, this.end) : this.bytes);
  }

  /** Appends decoded bytes one by one, checking the stop sequences after each (as stopAt does); true at a stop. */
  private append(chunk: Uint8Array): boolean {
    for (const b of chunk) {
      this.bytes.push(b);
      if (this.end >= 0) continue;
      const n = this.bytes.length;
      for (const s of this.stops) {
        if (s.length > n) continue;
        let match = true;
        for (let i = 0; i < s.length && match; i++) match = this.bytes[n - s.length + i] === s[i];
        if (match) {
          this.end = n - s.length;
          this.stopped = true;
          break;
        }
      }
    }
    return this.end >= 0;
  }
}
