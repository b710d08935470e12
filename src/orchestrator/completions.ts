// The serving path on the orchestrator (docs/inference.md, "Serve"): an
// OpenAI-style completion request is checked, one serving replica is picked
// for each stage of the model's live deployment, and the orchestrator drives
// the generation stage by stage over the miners' POST /infer
// (src/miner/serve-api.ts): token ids to stage 0, each stage's activation
// frame relayed to the next, the last stage's logits back; the orchestrator
// samples (./inference/sampling.ts: deterministic given the seed and the
// logits) and feeds the token back. The session is keyed by the request id on
// every miner and freed at the end (or by the miners' idle sweep).
//
// Why relay through the orchestrator rather than miner to miner: the
// orchestrator must see every token anyway (to stream it, to check stop
// sequences, and later to bill it and to replay a session on another replica
// when one dies), so a relay costs one more hop per stage and nothing else;
// miners keep no knowledge of a request, and a malformed frame from a miner is
// refused here (decodeFrame's checks) before it reaches the next one. A
// miner-to-miner chain (the neighbours are in each miner's assignment) would
// save the extra hop; it is left for later.
//
// The step mirrors ../inference/generator.ts for one session (prompt window,
// restart of a full context window with its last `keep` tokens, one sampler
// draw per token, stop sequences), so the text is the one generateCached
// gives for the same checkpoint, seed and options whenever the frames are f32
// (the default: f16 frames round the activations between stages, and the text
// may then differ).
import { randomBytes } from 'node:crypto';
import { MAX_COMPLETION_TOKENS, MAX_PROMPT_BYTES, MAX_STOP_BYTES, MAX_STOPS, MAX_TEMPERATURE, type OpenAiErrorBody } from '../api/completions.ts';
import { SignedClient } from '../http/client.ts';
import { gptConfigOf } from '../model/model-ref.ts';
import { Sampler, stopAt, stopSequences } from '../inference/sampling.ts';
import { NimbleError } from '../protocol/errors.ts';
import { decodeFrame, encodeFrame } from '../protocol/frame.ts';
import { orchestratorAddress } from '../protocol/network.ts';
import type { Peer } from '../protocol/messages.ts';
import { RequestSigner } from '../protocol/signing.ts';
import type { Coordinator } from './coordinator.ts';
import type { DeploymentRecord } from './state/deployments.ts';

const MAX_FRAME_BYTES = 64 << 20;

/** A checked request. */
export interface CompletionRequest {
  model: string;
  prompt: Uint8Array;
  maxTokens: number;
  temperature: number;
  topP: number;
  seed: number;
  stop: Uint8Array[];
  stream: boolean;
}

/** An error in the OpenAI shape: `{ error: { message, type, param, code } }`. */
export class OpenAiError extends NimbleError {
  override readonly name = 'OpenAiError';
  constructor(
    status: number,
    message: string,
    code: string,
    readonly param: string | null = null,
    readonly type: string = status >= 500 ? 'server_error' : 'invalid_request_error',
  ) {
    super(code, message, status);
  }
  body(): OpenAiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

const bad = (param: string, message: string): OpenAiError => new OpenAiError(400, message, 'invalid_value', param);

/** Checks a request body; throws an OpenAiError naming the first problem. */
export function parseCompletionRequest(body: unknown): CompletionRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new OpenAiError(400, 'the body must be a JSON object', 'invalid_body');
  const b = body as Record<string, unknown>;
  const model = b.model;
  if (typeof model !== 'string' || model.length === 0 || model.length > 256) throw bad('model', 'model must be a string of 1 to 256 characters (a deployed model\'s name or sha256)');
  const prompt = promptBytes(b.prompt);
  const num = (name: string, dflt: number): number => {
    const v = b[name];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(name, `${name} must be a number`);
    return v;
  };
  const maxTokens = num('max_tokens', 16);
  if (!(Number.isInteger(maxTokens) && maxTokens >= 1 && maxTokens <= MAX_COMPLETION_TOKENS)) throw bad('max_tokens', `max_tokens must be an integer in [1, ${MAX_COMPLETION_TOKENS}], got ${maxTokens}`);
  const temperature = num('temperature', 1);
  if (!(temperature >= 0 && temperature <= MAX_TEMPERATURE)) throw bad('temperature', `temperature must be in [0, ${MAX_TEMPERATURE}], got ${temperature}`);
  const topP = num('top_p', 1);
  if (!(topP > 0 && topP <= 1)) throw bad('top_p', `top_p must be in (0, 1], got ${topP}`);
  const seed = num('seed', 0);
  if (!Number.isSafeInteger(seed)) throw bad('seed', `seed must be an integer, got ${seed}`);
  const n = num('n', 1);
  if (n !== 1) throw bad('n', 'only n = 1 is served');
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== 'boolean') throw bad('stream', 'stream must be a boolean');
  let stops: unknown[] = [];
  if (typeof b.stop === 'string') stops = [b.stop];
  else if (Array.isArray(b.stop)) stops = b.stop;
  else if (b.stop !== undefined && b.stop !== null) throw bad('stop', 'stop must be a string or an array of strings');
  if (stops.length > MAX_STOPS) throw bad('stop', `at most ${MAX_STOPS} stop sequences`);
  for (const s of stops) {
    if (typeof s !== 'string' || s.length === 0 || !wellFormed(s)) throw bad('stop', 'each stop sequence must be a non-empty string of valid Unicode');
    if (new TextEncoder().encode(s).length > MAX_STOP_BYTES) throw bad('stop', `a stop sequence is at most ${MAX_STOP_BYTES} bytes of UTF-8`);
  }
  return { model, prompt, maxTokens, temperature, topP, seed, stop: stopSequences(stops as string[]), stream: b.stream === true };
}

/** The prompt as bytes (the tokenizer is bytes): a string (UTF-8), an array of one string, or an array of byte tokens. */
function promptBytes(p: unknown): Uint8Array {
  if (Array.isArray(p) && p.length === 1 && typeof p[0] === 'string') p = p[0];
  let bytes: Uint8Array;
  if (typeof p === 'string') {
    if (!wellFormed(p)) throw bad('prompt', 'prompt is not valid Unicode (a lone surrogate)');
    if (p.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is over ${MAX_PROMPT_BYTES} bytes of UTF-8`, 'prompt_too_long', 'prompt');
    bytes = new TextEncoder().encode(p);
  } else if (Array.isArray(p)) {
    if (p.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is over ${MAX_PROMPT_BYTES} tokens`, 'prompt_too_long', 'prompt');
    if (!p.every((t) => Number.isInteger(t) && t >= 0 && t <= 255)) throw bad('prompt', 'a prompt of tokens holds byte values (integers in [0, 255]): the tokenizer is bytes');
    bytes = Uint8Array.from(p as number[]);
  } else throw bad('prompt', 'prompt must be a string, an array of one string, or an array of byte tokens');
  if (bytes.length > MAX_PROMPT_BYTES) throw new OpenAiError(400, `prompt is ${bytes.length} bytes of UTF-8, over ${MAX_PROMPT_BYTES}`, 'prompt_too_long', 'prompt');
  return bytes;
}

/** No lone surrogate (what TextEncoder would silently replace). */
function wellFormed(s: string): boolean {
  return !/\p{Cs}/u.test(s);
}

/** The live deployment serving `model` (a name or sha256); a 404 or 409 naming why not. */
export function deploymentFor(c: Coordinator, model: string): DeploymentRecord {
  const live = c.state.deployments.live().find((d) => d.sha256 === model || d.name === model);
  if (live) return live;
  const stored = c.state.models.list().find((m) => m.sha256 === model || m.name === model);
  if (stored) throw new OpenAiError(409, `model '${model}' is stored but not deployed: its owner deploys it with nbcli model deploy`, 'model_not_deployed', 'model');
  throw new OpenAiError(404, `the model '${model}' does not exist`, 'model_not_found', 'model');
}

/**
 * What one stage miner did for one step of a generation, handed to the
 * observers (the inference work log, spot checks, traffic figures): the frame
 * it was sent and the one it answered, decoded.
 */
export interface StageStep {
  deployment: DeploymentRecord;
  session: string;
  stage: number;
  /** the miner that ran it */
  minerId: string;
  /** true when the step began the session's window again (a prefill) */
  reset: boolean;
  /** rows run: the window's tokens on a prefill, else 1 */
  rows: number;
  /** token ids (stage 0) or activation rows [rows, C] */
  input: Float32Array;
  /** activation rows [rows, C], or the last stage's logits [1, V] */
  output: Float32Array;
  /** bytes of the frame sent and of the one received */
  bytesSent: number;
  bytesReceived: number;
}

/** Watches generations; every method is optional and must not throw (an error is logged and ignored). */
export interface CompletionObserver {
  /** a stage answered a step with a well-formed frame */
  stageStep?(step: StageStep): void;
  /** a generation ended (for good or not): its request, and its result when it finished */
  completed?(deployment: DeploymentRecord, request: CompletionRequest, result: CompletionResult | null): void;
}

export interface CompletionResult {
  id: string;
  bytes: Uint8Array;
  finishReason: 'stop' | 'length';
  promptTokens: number;
  completionTokens: number;
}

/** Drives generations through the stage miners. */
export class Completions {
  private readonly client: SignedClient;
  private readonly observers: CompletionObserver[] = [];
  private turn = 0;

  constructor(private readonly c: Coordinator, private readonly options: { codec?: 'f32' | 'f16'; timeoutMs?: number } = {}) {
    const { key, domain } = c.identity;
    this.client = new SignedClient('http://127.0.0.1', new RequestSigner({ session: key, address: orchestratorAddress(key.publicKey) }, { domain }), options.timeoutMs ?? 30_000);
  }

  /** Adds an observer of every generation from now on. */
  observe(o: CompletionObserver): void {
    this.observers.push(o);
  }

  private notify(call: (o: CompletionObserver) => void): void {
    for (const o of this.observers) {
      try {
        call(o);
      } catch (err) {
        this.c.log(`completions: an observer failed: ${(err as Error).message}`);
      }
    }
  }

  /** One serving replica per stage (round-robin among those serving); a 503 when a stage has none. */
  route(d: DeploymentRecord): Peer[] {
    const stages = this.c.state.deployments.stages(d.id);
    if (stages.length === 0 || d.status !== 'serving') throw new OpenAiError(503, `model '${d.name}' is deployed but not serving yet (${d.status}${d.message ? `: ${d.message}` : ''})`, 'model_not_ready', 'model');
    const turn = this.turn++;
    return stages.map((s) => {
      const peers = this.c.deployments.servingPeers(d.id, s.stage);
      if (peers.length === 0) throw new OpenAiError(503, `stage ${s.stage} of model '${d.name}' has no serving replica right now`, 'model_not_ready', 'model');
      return peers[turn % peers.length];
    });
  }

  /**
   * Generates for a checked request on deployment `d`, calling `onBytes` with
   * the bytes that may be shown after each token (a stop sequence is held back
   * until it can no longer start). `aborted()` ends it early (the client left).
   */
  async generate(
    d: DeploymentRecord, r: CompletionRequest, onBytes: (bytes: Uint8Array) => void = () => {}, aborted: () => boolean = () => false, onId: (id: string) => void = () => {},
  ): Promise<CompletionResult> {
    const config = gptConfigOf(d.model);
    if (config.vocabSize !== 256) throw new OpenAiError(400, `model '${d.name}' is not a byte-level GPT (vocabulary ${config.vocabSize})`, 'unsupported_model', 'model');
    const route = this.route(d);
    this.c.deployments.noteRequest(d.id);
    const id = `cmpl-${randomBytes(12).toString('hex')}`;
    onId(id);
    const T = config.contextLength;
    const keep = Math.max(1, Math.floor(T / 2));
    const sampler = new Sampler({ temperature: r.temperature, topP: r.topP, seed: r.seed });
    const sequence = Array.from(r.prompt.length ? r.prompt : [10]);
    const promptTokens = sequence.length;
    const generated: number[] = [];
    const hold = r.stop.reduce((m, s) => Math.max(m, s.length - 1), 0);
    let sent = 0;
    let result: CompletionResult | null = null;
    try {
      let window = sequence.length <= T ? sequence : sequence.slice(-keep);
      let logits = await this.forward(d, route, id, window, true, config.channels, config.vocabSize);
      let position = window.length;
      for (;;) {
        const token = sampler.next(logits);
        generated.push(token);
        sequence.push(token);
        const cut = stopAt(generated, r.stop);
        if (cut >= 0 || generated.length >= r.maxTokens) {
          const end = cut >= 0 ? cut : generated.length;
          if (end > sent) onBytes(Uint8Array.from(generated.slice(sent, end)));
          result = { id, bytes: Uint8Array.from(generated.slice(0, end)), finishReason: cut >= 0 ? 'stop' : 'length', promptTokens, completionTokens: generated.length };
          return result;
        }
        const safe = generated.length - hold;
        if (safe > sent) {
          onBytes(Uint8Array.from(generated.slice(sent, safe)));
          sent = safe;
        }
        if (aborted()) throw new OpenAiError(499, 'the client went away', 'client_closed');
        if (position < T) {
          logits = await this.forward(d, route, id, [token], false, config.channels, config.vocabSize);
          position++;
        } else {
          window = sequence.slice(-keep);
          logits = await this.forward(d, route, id, window, true, config.channels, config.vocabSize);
          position = window.length;
        }
      }
    } finally {
      const done = result;
      this.notify((o) => o.completed?.(d, r, done));
      for (const p of route) {
        const body = new TextEncoder().encode(JSON.stringify({ deploymentId: d.id, session: id }));
        this.client.request('POST', new URL('/infer/end', p.url).href, body, 'application/json').catch(() => {});
      }
    }
  }

  /** Token ids through every stage; the last stage's logits. A miner's bad answer is a 502 naming it, never a crash. */
  private async forward(d: DeploymentRecord, route: Peer[], session: string, tokens: number[], reset: boolean, C: number, V: number): Promise<Float32Array> {
    let data: Float32Array = Float32Array.from(tokens);
    let shape = [tokens.length];
    for (let stage = 0; stage < route.length; stage++) {
      const peer = route[stage];
      const last = stage === route.length - 1;
      const body = encodeFrame(data, shape, 'f32', { deploymentId: d.id, stage, session, reset, codec: this.options.codec ?? 'f32' });
      const input = data;
      let answer: Uint8Array;
      try {
        answer = await this.client.request('POST', new URL('/infer', peer.url).href, body);
      } catch (err) {
        const e = err as NimbleError;
        const status = e.status === 503 ? 503 : 502;
        throw new OpenAiError(status, `stage ${stage} (miner ${peer.id}) failed: ${e.message}`.slice(0, 500), status === 503 ? 'overloaded' : 'upstream_error');
      }
      try {
        const frame = decodeFrame(answer, { shape: last ? [1, V] : [tokens.length, C], codecs: ['f32', 'f16'], maxBytes: MAX_FRAME_BYTES });
        for (let i = 0; i < frame.data.length; i++) if (!Number.isFinite(frame.data[i])) throw new Error(`a non-finite value at ${i}`);
        data = frame.data;
        shape = frame.shape;
      } catch (err) {
        throw new OpenAiError(502, `stage ${stage} (miner ${peer.id}) answered with a malformed frame: ${(err as Error).message}`.slice(0, 500), 'upstream_error');
      }
      const step: StageStep = { deployment: d, session, stage, minerId: peer.id, reset, rows: tokens.length, input, output: data, bytesSent: body.byteLength, bytesReceived: answer.byteLength };
      this.notify((o) => o.stageStep?.(step));
    }
    return data;
  }
}
