// Generation with continuous batching over a chain of inference stages (one
// stage holding the whole model, or the model's stages in order, run here one
// after the other as miners would run them): requests join between steps, each
// step feeds every active session its last token in one batch, samples one
// token per session from the last stage's logits, and sessions that finish
// (max tokens, or a stop sequence) leave and free their caches.
//
// The context window: a session's cache holds at most the model's context
// length of tokens. When the next token would not fit, the session's window
// restarts with the last `keep` tokens of its sequence (default half the
// context), prefilled in one pass; the position embeddings are absolute, so
// the old cache cannot be shifted. A prompt longer than the context starts the
// same way, from its last `keep` tokens. (The recompute path slid its window
// by one token per step at the cost of a full forward pass per token.)
//
// Between stages the rows pass as they are, or rounded to binary16
// (`activations: 'f16'`): what miners exchanging f16 frames compute, so a
// generation served through miners can be compared with this one byte for
// byte (./activations.ts).
import { partCount } from '../model/parts.ts';
import { acrossBoundary, type ActivationCodec } from './activations.ts';
import { Sampler, stopAt, stopSequences, type SamplingOptions } from './sampling.ts';
import type { SessionRows, StageInference } from './stage-inference.ts';

export interface GenerationRequest {
  /** prompt tokens (bytes for the byte-level GPT); empty means a newline */
  prompt: ArrayLike<number>;
  /** tokens to generate at most (≥ 1) */
  maxTokens: number;
  sampling?: SamplingOptions;
  /** generation ends when its output ends with one of these (not included in the output) */
  stop?: readonly (string | Uint8Array)[];
}

export type FinishReason = 'length' | 'stop';

export interface GenerationResult {
  id: string;
  /** generated tokens, without the stop sequence that ended them */
  tokens: number[];
  /** tokens sampled, a stop sequence included (what was computed) */
  sampledTokens: number;
  finishReason: FinishReason;
  promptTokens: number;
  /** times the context window restarted (0 when prompt + output fit the context) */
  windowRestarts: number;
}

/** What one step produced: a token per active session, and the sessions that finished. */
export interface StepResult {
  tokens: { id: string; token: number }[];
  finished: GenerationResult[];
}

export interface GeneratorOptions {
  /** tokens a restarted window keeps (1 … context length); default half the context */
  keep?: number;
  /** how activation rows cross from one stage to the next: exactly (f32, the default) or rounded to binary16 (f16 frames) */
  activations?: ActivationCodec;
}

interface Active {
  id: string;
  request: GenerationRequest;
  sampler: Sampler;
  stops: Uint8Array[];
  /** prompt + generated tokens */
  sequence: number[];
  promptTokens: number;
  generated: number[];
  /** the last sampled token, not yet fed to the model */
  pending: number;
  windowRestarts: number;
}

export class Generator {
  private readonly waiting: Active[] = [];
  private readonly active = new Map<string, Active>();
  private readonly keep: number;
  private readonly activations: ActivationCodec;
  private nextId = 0;

  constructor(
    private readonly stages: readonly StageInference[],
    options: GeneratorOptions = {},
  ) {
    if (stages.length === 0) throw new RangeError('a generator needs at least one stage');
    const config = stages[0].config;
    const parts = partCount(config);
    let at = 0;
    for (const s of stages) {
      if (s.range.from !== at || (s.config !== config && JSON.stringify(s.config) !== JSON.stringify(config))) {
        throw new RangeError(`the stages must cover the model's parts in order: expected one from part ${at}, got [${s.range.from}, ${s.range.to})`);
      }
      at = s.range.to;
    }
    if (at !== parts) throw new RangeError(`the stages cover parts [0, ${at}) of ${parts}`);
    const T = config.contextLength;
    this.keep = options.keep ?? Math.max(1, Math.floor(T / 2));
    if (!(Number.isInteger(this.keep) && this.keep >= 1 && this.keep <= T)) throw new RangeError(`keep must be an integer in [1, ${T}], got ${this.keep}`);
    this.activations = options.activations ?? 'f32';
    if (this.activations !== 'f32' && this.activations !== 'f16') throw new RangeError(`activations must be 'f32' or 'f16', got ${String(this.activations)}`);
  }

  /** Sessions generating, and requests waiting for room to join. */
  get load(): { active: number; waiting: number } {
    return { active: this.active.size, waiting: this.waiting.length };
  }

  /** Queues a request; it joins at the next step with room. Returns its id. */
  add(request: GenerationRequest): string {
    const V = this.stages[0].config.vocabSize;
    if (!(Number.isInteger(request.maxTokens) && request.maxTokens >= 1)) throw new RangeError(`maxTokens must be an integer ≥ 1, got ${request.maxTokens}`);
    const prompt = Array.from(request.prompt.length ? request.prompt : [10]);
    prompt.forEach((t, i) => {
      if (!(Number.isInteger(t) && t >= 0 && t < V)) throw new RangeError(`prompt token ${t} at ${i} is outside the vocabulary of ${V}`);
    });
    const id = `g${this.nextId++}`;
    this.waiting.push({
      id, request, sampler: new Sampler(request.sampling), stops: stopSequences(request.stop),
      sequence: prompt, promptTokens: prompt.length, generated: [], pending: -1, windowRestarts: 0,
    });
    return id;
  }

  /** Drops a request, waiting or active, and frees its caches. */
  cancel(id: string): void {
    const w = this.waiting.findIndex((a) => a.id === id);
    if (w >= 0) this.waiting.splice(w, 1);
    if (this.active.delete(id)) for (const s of this.stages) s.leave(id);
  }

  /** One step: waiting requests join (prefill) while there is room, every other session decodes one token. */
  step(): StepResult {
    const T = this.stages[0].config.contextLength;
    const result: StepResult = { tokens: [], finished: [] };
    const emit = (a: Active, logits: Float32Array): void => {
      const token = a.sampler.next(logits);
      result.tokens.push({ id: a.id, token });
      a.generated.push(token);
      a.sequence.push(token);
      a.pending = token;
      const cut = stopAt(a.generated, a.stops);
      if (cut >= 0 || a.generated.length >= a.request.maxTokens) {
        result.finished.push({
          id: a.id, tokens: cut >= 0 ? a.generated.slice(0, cut) : a.generated.slice(), finishReason: cut >= 0 ? 'stop' : 'length',
          sampledTokens: a.generated.length, promptTokens: a.promptTokens, windowRestarts: a.windowRestarts,
        });
        this.active.delete(a.id);
        for (const s of this.stages) s.leave(a.id);
      }
    };
    // sessions already running: feed each its pending token, restarting full windows
    const decoding: Active[] = [];
    for (const a of [...this.active.values()]) {
      if (this.stages[0].position(a.id) < T) decoding.push(a);
      else emit(a, this.restartWindow(a));
    }
    if (decoding.length) {
      const logits = this.forward(decoding.map((a) => ({ session: a.id, input: Int32Array.of(a.pending) })));
      const V = this.stages[0].config.vocabSize;
      decoding.forEach((a, i) => emit(a, logits.subarray(i * V, (i + 1) * V)));
    }
    // newcomers: join every stage and prefill the prompt
    const room = Math.min(...this.stages.map((s) => s.maxSessions));
    while (this.waiting.length && this.active.size < room) {
      const a = this.waiting.shift()!;
      this.active.set(a.id, a);
      for (const s of this.stages) s.join(a.id);
      const window = a.sequence.length <= T ? a.sequence : this.windowOf(a);
      emit(a, this.forward([{ session: a.id, input: Int32Array.from(window) }]));
    }
    return result;
  }

  /** Steps until every request has finished; returns their results in the order they finished. */
  runToEnd(): GenerationResult[] {
    const done: GenerationResult[] = [];
    while (this.active.size || this.waiting.length) done.push(...this.step().finished);
    return done;
  }

  /** The last `keep` tokens of a session's sequence: a restarted window. */
  private windowOf(a: Active): number[] {
    return a.sequence.slice(-this.keep);
  }

  /** Empties a session's caches and prefills its last `keep` tokens; returns the logits of the last. */
  private restartWindow(a: Active): Float32Array {
    a.windowRestarts++;
    for (const s of this.stages) {
      s.leave(a.id);
      s.join(a.id);
    }
    return this.forward([{ session: a.id, input: Int32Array.from(this.windowOf(a)) }]);
  }

  /** Runs a batch through the stages in order; returns the last stage's logits, one row per session. */
  private forward(batch: SessionRows[]): Float32Array {
    let rows: SessionRows[] = batch;
    let out: Float32Array = new Float32Array(0);
    for (const stage of this.stages) {
      out = stage.run(rows);
      if (stage.isLast) break;
      // cut the activation rows back into sessions for the next stage
      const C = stage.config.channels;
      let off = 0;
      rows = rows.map((r) => {
        const n = stage.isFirst ? r.input.length : r.input.length / C;
        const input = acrossBoundary(out.subarray(off * C, (off + n) * C), this.activations);
        off += n;
        return { session: r.session, input };
      });
    }
    return out;
  }
}
