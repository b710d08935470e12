// The forward-only inference path of a GPT stage: the parts [from, to) of the
// model (./gpt.ts's parts: embedding, blocks, final norm + head), run with a
// KV cache per session. A call takes rows from one or more sessions, each
// session at its own position:
//
//   prefill(session, prompt)   the prompt's rows in one pass
//   decode([{session, row}…])  one row per session, a batch of sessions
//
// and both go through `run`, which takes any mix (continuous batching:
// sessions join and leave between calls). The first stage takes token ids and
// adds each row's position embedding; a later stage takes the activation rows
// (width C) of the stage before it; the last stage applies the final layer
// norm and the head to each session's last row and returns its logits.
//
// Every architecture of src/model/arch.ts: the blocks are src/model/block.ts's
// blockForwardCached. The kernels are the training path's (sgemm, the norms,
// GELU or SwiGLU, residual), whose rows never mix, plus attention over the
// cache, which sums in the training kernel's order: the byte GPT's logits are
// bitwise identical to GptStage.forward on the whole prefix, and a Llama's
// agree with it to rounding (test/inference/stage-inference.test.ts,
// test/model/hf/reference.test.ts).
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import { blockForwardCached, blockShape, cachedScratch, headNormForward, type BlockShape, type BlockTensors, type CachedScratch } from '../model/block.ts';
import { type GptConfig, validateGptConfig } from '../model/config.ts';
import { createRopeTable, type RopeTable } from '../model/rope.ts';
import { headPart, partCount, partParams, type StageRange } from '../model/parts.ts';
import { FlatTensors, ParamLayout, type ParamSpec } from '../model/params.ts';
import * as L from '../model/layers.ts';
import { mergeLora } from '../model/lora-merge.ts';
import { validateLoraSpec, type LoraSpec } from '../model/lora.ts';
import { NimbleError } from '../protocol/errors.ts';
import { KvCache, kvLayerOffsets } from './kv-cache.ts';

/** The flat parameter layout of the parts `range`: the one GptStage lays its buffer out by. */
export function stageParamLayout(config: GptConfig, range: StageRange): ParamLayout {
  const specs: ParamSpec[] = [];
  for (let p = range.from; p < range.to; p++) specs.push(...partParams(config, p));
  return new ParamLayout(specs);
}

export interface StageInferenceOptions {
  /** Sessions held at once, each with its KV cache. Default 16. */
  maxSessions?: number;
  /** Rows one call runs (a prompt's tokens plus the batch's sessions). Default max(context length, maxSessions). */
  maxRows?: number;
  /**
   * A call of at most this many rows runs its kernels on the calling thread
   * alone (Kernels.serial): on a narrow model a few rows' kernels are so small
   * that waking the other threads costs more than their share saves. From
   * 512 channels a row's matrix products are large enough to split (sgemm
   * splits a product of few rows by columns). Same results either way.
   * Default 4 below 512 channels, else 0.
   */
  serialRows?: number;
  /**
   * LoRA adapters over the base `weights`: the spec, and the adapters of the
   * stage's blocks (laid out by src/model/lora.ts's loraLayout). They are
   * merged into the weights at load (W + (alpha / r) B A, as PEFT's merge),
   * so the stage then serves at the base model's cost.
   */
  lora?: { spec: LoraSpec; adapters: Float32Array };
}

/** One session's rows in a call: token ids (first stage) or activation rows of width C (later stages). */
export interface SessionRows {
  session: string;
  input: Int32Array | Float32Array;
}

/** A session's rows would not fit its context: nothing was run. */
export class ContextOverflowError extends NimbleError {
  override readonly name = 'ContextOverflowError';
  constructor(
    readonly session: string,
    readonly position: number,
    readonly rows: number,
    readonly contextLength: number,
  ) {
    super('context_overflow', `session ${session} is at position ${position}: ${rows} more token${rows === 1 ? '' : 's'} would pass the context length ${contextLength}`, 400);
  }
}

/** The stage's activation buffers, sized for maxRows rows. */
interface Scratch extends CachedScratch {
  last?: Tensor; logits?: Tensor;
  table: L.IntBuffer;
}

export class StageInference {
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly isFirst: boolean;
  readonly isLast: boolean;
  readonly maxSessions: number;
  readonly maxRows: number;
  readonly serialRows: number;
  /** global indices of the blocks this stage holds */
  private readonly blockIds: number[] = [];
  private readonly sessions = new Map<string, KvCache>();
  private readonly scratch: Scratch;
  private readonly shape: BlockShape;
  /** rotary embeddings' table (null with learned positions) */
  private readonly rope: RopeTable | null = null;
  private readonly tensors: Tensor[] = [];
  private released = false;

  /** `weights` are laid out by stageParamLayout(config, range) (a GptStage's params.flat, or a checkpoint's tensors copied by ./load.ts). */
  constructor(
    private readonly engine: Engine,
    readonly config: GptConfig,
    readonly range: StageRange,
    weights: Float32Array,
    options: StageInferenceOptions = {},
  ) {
    validateGptConfig(config);
    const parts = partCount(config);
    if (!(Number.isInteger(range.from) && Number.isInteger(range.to) && 0 <= range.from && range.from < range.to && range.to <= parts)) {
      throw new RangeError(`bad stage range [${range.from}, ${range.to}) for ${parts} parts`);
    }
    const { contextLength: T, channels: C, vocabSize: V } = config;
    this.isFirst = range.from === 0;
    this.isLast = range.to === parts;
    this.maxSessions = options.maxSessions ?? 16;
    this.maxRows = options.maxRows ?? Math.max(T, this.maxSessions);
    this.serialRows = options.serialRows ?? (C < 512 ? 4 : 0);
    if (!(Number.isInteger(this.serialRows) && this.serialRows >= 0)) throw new RangeError(`serialRows must be an integer ≥ 0, got ${this.serialRows}`);
    for (const [name, v] of [['maxSessions', this.maxSessions], ['maxRows', this.maxRows]] as const) {
      if (!(Number.isInteger(v) && v >= 1 && v <= 1 << 16)) throw new RangeError(`${name} must be an integer in [1, 65536], got ${v}`);
    }
    this.layout = stageParamLayout(config, range);
    if (weights.length !== this.layout.size) throw new RangeError(`stage [${range.from}, ${range.to}) takes ${this.layout.size} weights, got ${weights.length}`);
    this.params = new FlatTensors(this.layout, engine);
    const lora = options.lora;
    this.params.flat.data.set(lora ? mergeLora(config, validateLoraSpec(lora.spec, config), range, this.layout, weights, lora.adapters) : weights);
    for (let p = Math.max(1, range.from); p < Math.min(range.to, headPart(config)); p++) this.blockIds.push(p - 1);

    const R = this.maxRows;
    const t = (shape: number[]): Tensor => {
      const x = engine.tensor(shape);
      this.tensors.push(x);
      return x;
    };
    this.shape = blockShape(config);
    if (this.shape.arch.position === 'rope' && this.blockIds.length > 0) {
      this.rope = createRopeTable(engine, this.shape.arch, T);
      this.tensors.push(this.rope.tensor);
    }
    this.scratch = {
      ...cachedScratch(this.shape, t, R),
      ...(this.isLast ? { last: t([R, C]), logits: t([R, V]) } : {}),
      table: engine.int32(2 * R),
    };
  }

  /** Width of each output row: the vocabulary (logits) on the last stage, else the channels. */
  get outputWidth(): number {
    return this.isLast ? this.config.vocabSize : this.config.channels;
  }

  /** Blocks this stage holds (each keeps keys and values per session). */
  get blocks(): number {
    return this.blockIds.length;
  }

  /** A new session with an empty cache. */
  join(session: string): void {
    this.checkAlive();
    if (this.sessions.has(session)) throw new Error(`session ${session} is already on this stage`);
    if (this.sessions.size >= this.maxSessions) throw new Error(`this stage holds ${this.maxSessions} sessions already: session ${session} must wait for one to leave`);
    this.sessions.set(session, new KvCache(this.engine, this.config, this.blockIds.length));
  }

  /** Ends a session and frees its cache. */
  leave(session: string): void {
    const cache = this.sessions.get(session);
    if (!cache) return;
    cache.release();
    this.sessions.delete(session);
  }

  has(session: string): boolean {
    return this.sessions.has(session);
  }

  /** The position a session's next token takes. */
  position(session: string): number {
    return this.cache(session).position;
  }

  /** Sessions on this stage, in the order they joined. */
  sessionIds(): string[] {
    return [...this.sessions.keys()];
  }

  /**
   * Feeds a session's prompt (or the activations of its rows) in one pass.
   * Returns every row's output activation (rows × C), or on the last stage
   * the logits of the last row (V).
   */
  prefill(session: string, input: Int32Array | Float32Array): Float32Array {
    return this.run([{ session, input }]);
  }

  /**
   * One step of a batch of sessions, one row each (a token id, or an
   * activation row of C floats), each at its own position. Returns one output
   * row per session, in order (sessions × C, or sessions × V logits).
   */
  decode(batch: readonly SessionRows[]): Float32Array {
    for (const b of batch) {
      const n = this.rowsOf(b.input);
      // a length that is no whole number of rows is refused by run's checks, with the reason
      if (Number.isInteger(n) && n !== 1) throw new RangeError(`decode takes one row per session; session ${b.session} has ${n}`);
    }
    return this.run(batch);
  }

  /**
   * Runs the rows of several sessions in one pass: each session's rows take
   * its next positions and attend over its cache. Returns the activations of
   * every row in order (non-last stage), or the logits of each session's last
   * row (last stage). Checks everything first: on an error nothing has run.
   */
  run(batch: readonly SessionRows[]): Float32Array {
    this.checkAlive();
    const caches = this.check(batch);
    const counts = batch.map((b) => this.rowsOf(b.input));
    const rows = counts.reduce((a, b) => a + b, 0);
    const s = this.scratch;
    // row table: the session's cache base and the row's position
    let r = 0;
    for (let i = 0; i < batch.length; i++) {
      const base = caches[i].ptr | 0;
      for (let j = 0; j < counts[i]; j++, r++) {
        s.table.data[2 * r] = base;
        s.table.data[2 * r + 1] = caches[i].position + j;
      }
    }
    this.input(batch, counts);
    const k = this.engine.kernels;
    const out = rows <= this.serialRows ? k.serial(() => this.forward(counts, rows)) : this.forward(counts, rows);
    for (let i = 0; i < batch.length; i++) caches[i].advance(counts[i]);
    return out;
  }

  /** The blocks, then (last stage) the final norm and head on each session's last row. The row table and the input are in place. */
  private forward(counts: readonly number[], rows: number): Float32Array {
    const { channels: C, vocabSize: V } = this.config;
    const s = this.scratch;
    for (let b = 0; b < this.blockIds.length; b++) this.block(b, rows);
    if (!this.isLast) return s.x.data.slice(0, rows * C);
    const k = this.engine.kernels;
    const P = this.params;
    const n = counts.length;
    let src = s.x;
    if (rows !== n) {
      let end = 0;
      for (let i = 0; i < n; i++) {
        end += counts[i];
        s.last!.data.set(s.x.data.subarray((end - 1) * C, end * C), i * C);
      }
      src = s.last!;
    }
    headNormForward(k, this.shape, (name) => (P.layout.byName.has(name) ? P.get(name) : null), s.ln, s.mean, s.rstd, src, n);
    L.linearForward(k, s.logits!, s.ln, P.get('lm_head.w'), null, n, C, V);
    return s.logits!.data.slice(0, n * V);
  }

  /** Frees the weights, the buffers and every session's cache. */
  release(): void {
    if (this.released) return;
    for (const id of [...this.sessions.keys()]) this.leave(id);
    this.released = true;
    for (const t of this.tensors) this.engine.free(t);
    this.engine.free(this.scratch.table);
    this.engine.free(this.params.flat);
  }

  /** Rows an input holds (token ids, or activation rows of C floats). */
  private rowsOf(input: Int32Array | Float32Array): number {
    return this.isFirst ? input.length : input.length / this.config.channels;
  }

  private cache(session: string): KvCache {
    const c = this.sessions.get(session);
    if (!c) throw new Error(`session ${session} is not on this stage (join it first)`);
    return c;
  }

  /** Validates a batch before anything runs; returns each session's cache. */
  private check(batch: readonly SessionRows[]): KvCache[] {
    const { contextLength: T, channels: C, vocabSize: V } = this.config;
    if (batch.length === 0) throw new RangeError('a call takes at least one session');
    const seen = new Set<string>();
    let rows = 0;
    const caches = batch.map(({ session, input }) => {
      if (seen.has(session)) throw new RangeError(`session ${session} appears twice in one call`);
      seen.add(session);
      const cache = this.cache(session);
      let n: number;
      if (this.isFirst) {
        if (!(input instanceof Int32Array)) throw new TypeError(`the first stage takes token ids (Int32Array) for session ${session}`);
        n = input.length;
        for (let i = 0; i < n; i++) {
          const tok = input[i];
          if (!(tok >= 0 && tok < V)) throw new RangeError(`token ${tok} at ${i} of session ${session} is outside the vocabulary of ${V}`);
        }
      } else {
        if (!(input instanceof Float32Array) || input.length % C !== 0) throw new TypeError(`stage [${this.range.from}, ${this.range.to}) takes activation rows of ${C} floats for session ${session}`);
        n = input.length / C;
        for (let i = 0; i < input.length; i++) {
          if (!Number.isFinite(input[i])) throw new RangeError(`activation of session ${session} has a non-finite value at ${i}`);
        }
      }
      if (n < 1) throw new RangeError(`session ${session} has no rows`);
      if (cache.position + n > T) throw new ContextOverflowError(session, cache.position, n, T);
      rows += n;
      return cache;
    });
    if (rows > this.maxRows) throw new RangeError(`a call of ${rows} rows exceeds this stage's ${this.maxRows}: split it`);
    return caches;
  }

  /** The residual stream entering the first block: token + position embeddings, or the rows received. */
  private input(batch: readonly SessionRows[], counts: readonly number[]): void {
    const { channels: C } = this.config;
    const x = this.scratch.x.data;
    if (!this.isFirst) {
      let off = 0;
      for (const b of batch) {
        x.set(b.input, off);
        off += b.input.length;
      }
      return;
    }
    const wte = this.params.get('wte').data;
    const learned = this.shape.arch.position === 'learned';
    const wpe = learned ? this.params.get('wpe').data : null;
    const table = this.scratch.table.data;
    let r = 0;
    for (let i = 0; i < batch.length; i++) {
      const tokens = batch[i].input;
      for (let j = 0; j < counts[i]; j++, r++) {
        const e = tokens[j] * C, p = table[2 * r + 1] * C, o = r * C;
        // one float32 add per element, as embeddingForward; rotary positions: the token's embedding alone
        if (wpe) for (let c = 0; c < C; c++) x[o + c] = wte[e + c] + wpe[p + c];
        else x.set(wte.subarray(e, e + C), o);
      }
    }
  }

  /** Block `b` of the stage on `rows` rows: src/model/block.ts's blockForwardCached, over each session's cache. */
  private block(b: number, rows: number): void {
    const p = `h.${this.blockIds[b]}.`;
    const P: BlockTensors = (name) => (this.layout.byName.has(p + name) ? this.params.get(p + name) : null);
    blockForwardCached(this.engine.kernels, this.shape, P, this.scratch, this.scratch.table, kvLayerOffsets(this.config, b), this.rope, rows);
  }

  private checkAlive(): void {
    if (this.released) throw new Error('stage inference was released');
  }
}
