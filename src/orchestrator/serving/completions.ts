// The serving path on the orchestrator (docs/inference.md, "Serve" and
// "Failover and determinism"): for a checked completion request
// (./completion-request.ts), one serving replica is picked for each stage of
// the model's live deployment, and the orchestrator drives the generation
// stage by stage over the miners' POST /infer (src/miner/serve-api.ts): token
// ids to stage 0, each stage's activation frame (f16 by default) relayed to
// the next, the last stage's logits back; it samples (../inference/sampling.ts:
// deterministic given the seed and the logits) and feeds the token back.
// Concurrent generations routed through the same replicas share each step's
// frames (./stage-lanes.ts: continuous batching), sent on one serving channel
// per miner (./stage-channels.ts). The session is keyed by the
// request id on every miner and freed at the end (or by the miners' idle
// sweep).
//
// Why relay through the orchestrator rather than miner to miner: the
// orchestrator must see every token anyway (to stream it, to check stop
// sequences, to bill it and to replay a session on another replica when one
// dies), so a relay costs one more hop per stage and nothing else; miners keep
// no knowledge of a request, and a malformed frame from a miner is refused
// here (decodeFrame's checks) before it reaches the next one.
//
// Failover: the orchestrator holds each session's whole state (its tokens, the
// start of its context window, the sampler's seed and draws). When a stage
// call fails in a way another replica may fix (unreachable, a timeout, a 5xx,
// a malformed frame, a miner that lost the stage or the session), that miner
// is excluded for the rest of the request, another serving replica of the
// stage takes its place, and the session's window (the tokens since its last
// reset, the token being fed included) is replayed with `reset` through every
// stage; the cached path's prefill gives the logits a token-by-token decode
// gives, bit for bit, so the text goes on exactly as without the failure. At
// most `maxFailovers` per request; a 4xx saying our request was bad is never
// replayed.
//
// The step mirrors ../inference/generator.ts for one session (prompt window,
// restart of a full context window with its last `keep` tokens, one sampler
// draw per token, stop sequences), so the text is the one generateCached gives
// for the same checkpoint, seed and options, cut into the deployment's stages
// with its activations rounded as the frames round them (`activations: 'f16'`
// unless the orchestrator was given codec f32).
import { randomBytes } from 'node:crypto';
import type { ActivationCodec } from '../../inference/activations.ts';
import { gptConfigOf } from '../../model/model-ref.ts';
import { Sampler } from '../../inference/sampling.ts';
import { tokenLogprob, type TokenLogprob } from '../../inference/logprobs.ts';
import { TextOutput } from '../../inference/text-output.ts';
import { orchestratorAddress } from '../../protocol/network.ts';
import type { Peer } from '../../protocol/messages.ts';
import { RequestSigner } from '../../protocol/signing.ts';
import { OpenAiError, type CompletionRequest } from './completion-request.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { StageCallError, StageLane, type LaneStep } from './stage-lanes.ts';
import { StageChannels } from './stage-channels.ts';
import { StallDeadlines } from './stall-deadlines.ts';
import { Admission } from './admission.ts';
import { ServingTokenizers, type TokenizerBundleLookup } from './tokenizers.ts';
import type { DeploymentRecord } from '../state/deployments.ts';

export { OpenAiError, parseCompletionRequest, type CompletionRequest } from './completion-request.ts';

/** Sessions one frame carries at most (the miners take up to 48; the meta stays well under its 4 KiB). */
const MAX_BATCH_SESSIONS = 32;
/** Replicas tried again per request by default after a failed stage call. */
export const DEFAULT_MAX_FAILOVERS = 3;

/**
 * The live deployment serving `model`: a sha256's, or for a name its owner's
 * newest live deployment under it (a name is one owner's:
 * ../state/models.ts); a 404 or 409 naming why not.
 */
export function deploymentFor(c: Coordinator, model: string): DeploymentRecord {
  const live = c.state.deployments.live();
  const bySha = live.find((d) => d.sha256 === model);
  if (bySha) return bySha;
  const owner = c.state.models.nameOwner(model)?.toLowerCase();
  const named = live.filter((d) => d.name === model && (owner === undefined || d.owner.toLowerCase() === owner));
  if (owner === undefined && new Set(named.map((d) => d.owner.toLowerCase())).size > 1) {
    throw new OpenAiError(409, `the model name '${model}' is deployed by several owners and owned by none: ask for a model by its sha256`, 'model_ambiguous', 'model');
  }
  const newest = named.at(-1);
  if (newest) return newest;
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
  /** sessions in the frame this step was part of (its bytes are this session's share) */
  batch?: number;
}

/** A session moved off a failed replica: its window replayed on another. */
export interface Failover {
  deployment: DeploymentRecord;
  session: string;
  stage: number;
  /** the miner that failed, and the one replaying the window */
  from: string;
  to: string;
  /** tokens replayed (the window since the session's last reset) */
  replayed: number;
  reason: string;
}

/** Watches generations; every method is optional and must not throw (an error is logged and ignored). */
export interface CompletionObserver {
  /** a stage answered a step with a well-formed frame */
  stageStep?(step: StageStep): void;
  /** a session's window is being replayed on another replica of a stage that failed */
  failover?(f: Failover): void;
  /** a generation ended (for good or not): its request, and its result when it finished */
  completed?(deployment: DeploymentRecord, request: CompletionRequest, result: CompletionResult | null): void;
}

export interface CompletionResult {
  id: string;
  /** the text, as UTF-8 */
  bytes: Uint8Array;
  finishReason: 'stop' | 'length';
  promptTokens: number;
  completionTokens: number;
  /** each sampled token's logprobs (null: not asked for) */
  logprobs?: TokenLogprob[] | null;
}

/** Options of the serving path. */
export interface CompletionsOptions {
  /** how activations cross stage boundaries: f16 frames (the default, half the bytes) or f32 */
  codec?: ActivationCodec;
  /** a stage call's timeout in ms (default 30,000): a miner silent this long is failed over */
  timeoutMs?: number;
  /** failovers per request at most (default DEFAULT_MAX_FAILOVERS) */
  maxFailovers?: number;
  /** how long a request waits for room on full replicas before a 503 (default ./admission.ts's WAIT_MS) */
  queueWaitMs?: number;
  /**
   * lanes per route (default: one per stage of the route, at most
   * MAX_DEFAULT_LANES): the sessions on the same replicas are split into this
   * many groups, each stepping on its own, so that while one group's frame is
   * on stage 1 the next group's is on stage 0 (a pipeline); 1 sends every
   * ready session in one frame per stage and step. With 2 stages, 2 lanes
   * served 1.3 times the tokens/s of 1 lane ("Serve figures").
   */
  lanesPerRoute?: number;
  /** where a model's tokenizer bundle is (./tokenizers.ts); absent: every model is a byte-level GPT */
  tokenizerBundle?: TokenizerBundleLookup;
}

/**
 * A miner whose call failed (unreachable, hung, a 5xx) is left out of new
 * routes for this long while other replicas of its stage serve; the
 * deployment drops it for good when it misses its heartbeats.
 */
export const SUSPECT_MS = 30_000;

/** Generations a replica of `d` holds at once (its miners' KV cache sessions). */
function sessionsOf(d: DeploymentRecord): number {
  return Number.isInteger(d.sessions) && d.sessions > 0 ? d.sessions : 1;
}

/** The most lanes a route gets by default (one per stage up to this). */
export const MAX_DEFAULT_LANES = 4;

/** Drives generations through the stage miners. */
export class Completions {
  private readonly channels: StageChannels;
  private readonly deadlines: StallDeadlines;
  private readonly admission: Admission;
  /** miners whose calls failed lately, by id: until when new generations avoid them */
  private readonly suspects = new Map<string, number>();
  private readonly observers: CompletionObserver[] = [];
  private readonly lanes = new Map<string, StageLane>();
  private readonly codec: ActivationCodec;
  private readonly maxFailovers: number;
  /** null: one lane per stage of the route */
  private readonly lanesPerRoute: number | null;
  private turn = 0;
  private sessions = 0;
  /** each served model's tokenizer */
  readonly tokenizers: ServingTokenizers;

  constructor(private readonly c: Coordinator, options: CompletionsOptions = {}) {
    const { key, domain } = c.identity;
    this.channels = new StageChannels(new RequestSigner({ session: key, address: orchestratorAddress(key.publicKey) }, { domain }), options.timeoutMs ?? 30_000);
    this.deadlines = new StallDeadlines(options.timeoutMs ?? 30_000);
    this.admission = new Admission({ waitMs: options.queueWaitMs });
    this.codec = options.codec ?? 'f16';
    if (this.codec !== 'f16' && this.codec !== 'f32') throw new RangeError(`codec must be 'f16' or 'f32', got ${String(this.codec)}`);
    this.maxFailovers = options.maxFailovers ?? DEFAULT_MAX_FAILOVERS;
    if (!(Number.isInteger(this.maxFailovers) && this.maxFailovers >= 0)) throw new RangeError(`maxFailovers must be an integer ≥ 0, got ${this.maxFailovers}`);
    this.lanesPerRoute = options.lanesPerRoute ?? null;
    this.tokenizers = new ServingTokenizers(options.tokenizerBundle);
    if (this.lanesPerRoute !== null && !(Number.isInteger(this.lanesPerRoute) && this.lanesPerRoute >= 1 && this.lanesPerRoute <= 64)) {
      throw new RangeError(`lanesPerRoute must be an integer in [1, 64], got ${this.lanesPerRoute}`);
    }
  }

  /** Closes the serving channels to the miners (generations still running fail over or fail). */
  close(): void {
    this.channels.close();
  }

  /** How activations cross stage boundaries on this path. */
  get activations(): ActivationCodec {
    return this.codec;
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

  /**
   * One serving replica per stage with room for one more generation (the
   * least loaded, round-robin among equals, leaving out suspects while others
   * serve); null when a stage has none with room; a 503 when a stage has no
   * serving replica at all.
   */
  route(d: DeploymentRecord): Peer[] | null {
    const stages = this.c.state.deployments.stages(d.id);
    if (stages.length === 0 || d.status !== 'serving') throw new OpenAiError(503, `model '${d.name}' is deployed but not serving yet (${d.status}${d.message ? `: ${d.message}` : ''})`, 'model_not_ready', 'model');
    const turn = this.turn++;
    const room = sessionsOf(d);
    const route: Peer[] = [];
    for (const s of stages) {
      const peers = this.c.deployments.servingPeers(d.id, s.stage);
      if (peers.length === 0) throw new OpenAiError(503, `stage ${s.stage} of model '${d.name}' has no serving replica right now`, 'model_not_ready', 'model');
      // replicas that failed a call lately are left out while others serve
      const trusted = peers.filter((p) => !this.suspected(p.id));
      const open = (trusted.length > 0 ? trusted : peers).filter((p) => this.admission.loadOf(p.id) < room);
      if (open.length === 0) return null;
      const least = Math.min(...open.map((p) => this.admission.loadOf(p.id)));
      const best = open.filter((p) => this.admission.loadOf(p.id) === least);
      route.push(best[turn % best.length]);
    }
    return route;
  }

  /** Generations deployment `d` holds at once: its sessions per replica times its fewest replicas of a stage. */
  private room(d: DeploymentRecord): number {
    const stages = this.c.state.deployments.stages(d.id);
    const replicas = stages.map((s) => this.c.deployments.servingPeers(d.id, s.stage).length);
    return sessionsOf(d) * Math.max(1, Math.min(...replicas));
  }

  /** Miner `id` failed a call: new routes leave it out for SUSPECT_MS. */
  private suspect(id: string): void {
    if (this.suspects.size >= 10_000) for (const [k, until] of this.suspects) if (Date.now() >= until) this.suspects.delete(k);
    this.suspects.set(id, Date.now() + SUSPECT_MS);
  }

  /** Whether a call to miner `id` failed within the last SUSPECT_MS. */
  private suspected(id: string): boolean {
    const until = this.suspects.get(id);
    if (until === undefined) return false;
    if (Date.now() < until) return true;
    this.suspects.delete(id);
    return false;
  }

  /**
   * Generates for a checked request on deployment `d` (its prompt in the
   * model's tokens: ./completion-request.ts withTokenizer), calling `onBytes`
   * with the bytes of text that may be shown after each token (a stop
   * sequence is held back until it can no longer start) and the logprobs of
   * the tokens sampled since the last call, when asked for. It ends at
   * max_tokens, an eos token of the model's tokenizer or a stop sequence.
   * `aborted()` ends it early (the client left).
   */
  async generate(
    d: DeploymentRecord, r: CompletionRequest, onBytes: (bytes: Uint8Array, logprobs: TokenLogprob[]) => void = () => {}, aborted: () => boolean = () => false, onId: (id: string) => void = () => {},
  ): Promise<CompletionResult> {
    const config = gptConfigOf(d.model);
    const tokenizer = await this.tokenizers.of(d);
    const sequence = Array.from(r.prompt.length ? r.prompt : tokenizer.encode(''));
    if (!sequence.every((t) => Number.isInteger(t) && t >= 0 && t < config.vocabSize)) throw new OpenAiError(400, `a prompt token is outside the model's vocabulary [0, ${config.vocabSize})`, 'invalid_value', 'prompt');
    this.c.deployments.noteRequest(d.id);
    let route = await this.admission.admit(d.id, `model '${d.name}'`, () => this.route(d), this.room(d), aborted);
    const id = `cmpl-${randomBytes(12).toString('hex')}`;
    onId(id);
    const T = config.contextLength;
    const keep = Math.max(1, Math.floor(T / 2));
    const sampler = new Sampler({ temperature: r.temperature, topP: r.topP, seed: r.seed });
    const promptTokens = sequence.length;
    const output = new TextOutput(tokenizer, r.stop);
    const k = r.logprobs ?? null;
    const logprobs: TokenLogprob[] = [];
    let shown = 0;
    let generated = 0;
    /** every miner this session ran on (each is told to free it at the end) */
    const touched = new Map<string, Peer>(route.map((p) => [p.id, p]));
    const excluded = new Set<string>();
    const group = this.sessions++ % (this.lanesPerRoute ?? Math.min(route.length, MAX_DEFAULT_LANES));
    let failovers = 0;
    /** where the session's context window starts in `sequence` (what a replay prefills) */
    let windowStart = sequence.length <= T ? 0 : sequence.length - keep;

    /** One step: the rows through every stage, failing over (replaying the window) while replicas are left. */
    const step = async (tokens: readonly number[], reset: boolean): Promise<Float32Array> => {
      for (;;) {
        try {
          return await this.lane(d, route, group, config.channels, config.vocabSize, T).submit({ session: id, tokens, reset });
        } catch (err) {
          if (!(err instanceof StageCallError)) throw err;
          excluded.add(err.peer.id);
          // a miner full of sessions (503) is busy, not broken
          if (err.retryable && err.status !== 503) this.suspect(err.peer.id);
          const next = err.retryable && failovers < this.maxFailovers ? this.replica(d, err.stage, excluded) : null;
          if (!next) {
            const why = !err.retryable ? '' : failovers >= this.maxFailovers ? ` (after ${failovers} failovers)` : ' (no other replica of the stage is serving)';
            throw new OpenAiError(err.status === 503 ? 503 : 502, `${err.message}${why}`.slice(0, 600), err.status === 503 ? 'overloaded' : 'upstream_error');
          }
          failovers++;
          this.admission.move(err.peer.id, next.id);
          route = route.map((p, s) => (s === err.stage ? next : p));
          touched.set(next.id, next);
          tokens = sequence.slice(windowStart);
          reset = true;
          this.c.log(`completions: ${id}: ${err.message}; replaying its ${tokens.length}-token window on miner ${next.id}`);
          const f: Failover = { deployment: d, session: id, stage: err.stage, from: err.peer.id, to: next.id, replayed: tokens.length, reason: err.message };
          this.notify((o) => o.failover?.(f));
        }
      }
    };

    let result: CompletionResult | null = null;
    const show = (): void => {
      const bytes = output.take();
      if (bytes.length > 0 || shown < logprobs.length) onBytes(bytes, logprobs.slice(shown));
      shown = logprobs.length;
    };
    try {
      let logits = await step(sequence.slice(windowStart), true);
      let position = sequence.length - windowStart;
      for (;;) {
        const token = sampler.next(logits);
        if (k !== null) logprobs.push(tokenLogprob(logits, token, k));
        generated++;
        sequence.push(token);
        if (output.push(token) || generated >= r.maxTokens) {
          output.finish();
          show();
          result = { id, bytes: output.text(), finishReason: output.finishReason, promptTokens, completionTokens: generated, logprobs: k === null ? null : logprobs };
          return result;
        }
        show();
        if (aborted()) throw new OpenAiError(499, 'the client went away', 'client_closed');
        if (position < T) {
          logits = await step([token], false);
          position++;
        } else {
          // the window is full: start it again with its last `keep` tokens
          windowStart = sequence.length - keep;
          logits = await step(sequence.slice(windowStart), true);
          position = keep;
        }
      }
    } finally {
      this.admission.release(route.map((p) => p.id));
      const done = result;
      this.notify((o) => o.completed?.(d, r, done));
      const body = new TextEncoder().encode(JSON.stringify({ deploymentId: d.id, session: id }));
      for (const p of touched.values()) this.channels.call(p, 'end', body).catch(() => {});
    }
  }

  /** A serving replica of `stage` not excluded, not suspected if one is left (the first in the deployment's order, so that sessions failing over together share steps again); null when none. */
  private replica(d: DeploymentRecord, stage: number, excluded: ReadonlySet<string>): Peer | null {
    const left = this.c.deployments.servingPeers(d.id, stage).filter((p) => !excluded.has(p.id));
    return left.find((p) => !this.suspected(p.id)) ?? left[0] ?? null;
  }

  /** Lane `group` of `route` on `d` (generations on the same replicas and in the same group share its steps). */
  private lane(d: DeploymentRecord, route: readonly Peer[], group: number, C: number, V: number, T: number): StageLane {
    const key = `${d.id} ${group} ${route.map((p) => `${p.id}@${p.url}`).join(' ')}`;
    const existing = this.lanes.get(key);
    if (existing) return existing;
    const sessions = sessionsOf(d);
    const lane: StageLane = new StageLane(route, {
      deploymentId: d.id, channels: C, vocab: V, codec: this.codec,
      // the miners' StageInference runs max(T, sessions) rows per call
      maxRows: Math.max(T, sessions), maxSessions: Math.min(sessions, MAX_BATCH_SESSIONS),
      call: (peer, body, timeoutMs) => this.channels.call(peer, 'infer', body, timeoutMs),
      deadlines: this.deadlines,
      onStep: (s: LaneStep) => {
        const step: StageStep = {
          deployment: d, session: s.session, stage: s.stage, minerId: s.peer.id, reset: s.reset, rows: s.rows,
          input: s.input, output: s.output, bytesSent: s.bytesSent, bytesReceived: s.bytesReceived, batch: s.batch,
        };
        this.notify((o) => o.stageStep?.(step));
      },
      onIdle: () => {
        if (this.lanes.get(key) === lane) this.lanes.delete(key);
      },
    });
    this.lanes.set(key, lane);
    return lane;
  }
}
