// Shared fakes of the coordinator tests: a real Coordinator on a real
// OrchestratorState and FsBlobStore in a temp dir, a clock the test moves by
// hand, and fake miners that behave like honest miners of src/miner/: each
// joins with its own session key, heartbeats naming the run, stage and merge
// round it holds and the microbatches it holds, follows the reply (takes the
// microbatches, lets go of the abandoned ones), receipts the frames its
// neighbours hand it, and claims its hops with the frame shas and receipts of
// a real miner (forward, last, backward, dropped). `report` builds a claim by
// hand, for the malformed and stale ones. Builders for the merge-round uploads
// of a real miner too (pseudo-gradients, merged partitions and stage states
// that pass the orchestrator's checks, made with the miner's own functions).
// No child process, no network.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { Engine } from '../../src/engine/engine.ts';
import { createOuterState, outerStep } from '../../src/merge/outer.ts';
import { partitionVector } from '../../src/merge/partition.ts';
import { decodePartitionFrame, encodePseudoGradientPartitions } from '../../src/merge/pseudo-gradient.ts';
import { decodeMergedDelta, mergePartition } from '../../src/miner/merge-round.ts';
import { encodeCheckpoint, stageTensors } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { GptStage } from '../../src/model/gpt.ts';
import { rangeParamCount } from '../../src/model/parts.ts';
import { FsBlobStore } from '../../src/orchestrator/blobs/blobs.ts';
import { Coordinator, COORDINATOR_DEFAULTS, type CoordinatorOptions } from '../../src/orchestrator/training/coordinator.ts';
import type { OrchestratorIdentity } from '../../src/orchestrator/identity.ts';
import { OrchestratorState } from '../../src/orchestrator/state/index.ts';
import { closeSharedPostgres, sharedPostgres } from '../helpers/postgres-server.ts';
import type { MergeRoundRecord, RoundKey } from '../../src/orchestrator/state/merge-rounds.ts';
import type { RunRecord } from '../../src/orchestrator/state/runs.ts';
import { DEFAULT_BLOCK_SIZE } from '../../src/protocol/codec.ts';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { signReceipt } from '../../src/protocol/evidence.ts';
import type { HeartbeatReply, HeartbeatRequest, JoinReply, MergeTask, MicrobatchTask, StageAssignment, WorkReport } from '../../src/protocol/messages.ts';
import { domainOf } from '../../src/protocol/network.ts';
import { SessionKey } from '../../src/protocol/session-key.ts';
import { randomVector } from '../merge/helpers.ts';

/** The model every coordinator test trains: 4 parts, cut in 2 stages as parts [0, 3) and [3, 4). */
export const MODEL = 'gpt-micro';
export const CONFIG = gptConfig(MODEL);

/** What every fake miner measures when it joins: equal miners, memory to spare. */
export const HARDWARE = { gflops: 10, threads: 1, memoryBytes: 1 << 30 };

/** The bytes a fake miner says it sent with each frame it hands on (a hop that hands nothing on sends 0). */
export const FRAME_BYTES = 10;

/** The developer who asks for every run of the tests (the signer of a POST /runs). */
export const OWNER = privateKeyToAccount(generatePrivateKey()).address;

/** A fresh miner address, as a miner's key file would give it. */
export function newMinerId(): string {
  return privateKeyToAccount(generatePrivateKey()).address;
}

/** sha256 hex of a string: the stand-in for a frame's sha256. */
export function sha(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** A new orchestrator identity (what `loadOrCreateOrchestratorIdentity` keeps in the data dir). */
export function newIdentity(): OrchestratorIdentity {
  const key = SessionKey.generate();
  return { key, domain: domainOf(key.publicKey) };
}

/**
 * The engine the orchestrator's tests keep state in: SQLite, or PostgreSQL
 * with NIMBLE_TEST_DB=postgres (one real server per test file, started on
 * first use and stopped after the file's tests; a database per state).
 */
export const TEST_ENGINE: 'sqlite' | 'postgres' = process.env.NIMBLE_TEST_DB === 'postgres' ? 'postgres' : 'sqlite';
if (TEST_ENGINE === 'postgres') after(closeSharedPostgres);

/** Where a test's state goes: the file `name` in `dir` (SQLite; no dir: ':memory:'), or a new database (PostgreSQL). */
export async function stateTarget(dir?: string, name = 'o.sqlite'): Promise<string> {
  if (TEST_ENGINE === 'postgres') return await (await sharedPostgres()).createDatabase();
  return dir === undefined ? ':memory:' : join(dir, name);
}

/** A coordinator, its state and blobs in a temp dir, and a clock that only moves when told. */
export class Harness {
  /** the injected clock (ms) */
  now = 1_700_000_000_000;
  state!: OrchestratorState;
  blobs!: FsBlobStore;
  coordinator!: Coordinator;
  readonly options: Partial<CoordinatorOptions>;
  /** every miner that joined, by id */
  readonly miners = new Map<string, FakeMiner>();
  /** the fake replicas' engine (for encoding stage states), made on first use */
  private enginePromise: Promise<Engine> | null = null;

  private constructor(
    readonly dir: string,
    /** the state's file or database URL (the same across restarts) */
    readonly target: string,
    options: Partial<CoordinatorOptions>,
  ) {
    // spot checks off unless a test asks for them; one identity for the harness's life, as the data dir keeps it across restarts
    this.options = { ...COORDINATOR_DEFAULTS, spotChecks: { rate: 0 }, identity: newIdentity(), ...options, now: () => this.now };
  }

  /** A harness with the coordinator's defaults, spot checks off, overridden by `options`. */
  static async open(options: Partial<CoordinatorOptions> = {}): Promise<Harness> {
    const dir = mkdtempSync(join(tmpdir(), 'nimble-coordinator-'));
    const h = new Harness(dir, await stateTarget(dir), options);
    await h.start();
    return h;
  }

  private async start(): Promise<void> {
    this.state = OrchestratorState.open(this.target);
    this.blobs = await FsBlobStore.open(join(this.dir, 'blobs'));
    this.coordinator = new Coordinator(this.state, this.blobs, this.options);
  }

  /** The network's signing domain (the same across restarts). */
  get domain(): string {
    return this.coordinator.identity.domain;
  }

  /** The orchestrator stops (its memory is lost) and starts again on the same database, blobs and key. */
  async restart(): Promise<void> {
    await this.coordinator.close();
    this.state.close();
    await this.start();
  }

  /** An engine of one thread, for the fake replicas' stage states. */
  engine(): Promise<Engine> {
    return (this.enginePromise ??= Engine.create({ threads: 1 }));
  }

  async close(): Promise<void> {
    await this.coordinator.close();
    if (this.enginePromise) await (await this.enginePromise).close();
    this.enginePromise = null;
    this.state.close();
    rmSync(this.dir, { recursive: true, force: true });
  }

  advance(ms: number): void {
    this.now += ms;
  }

  tick(): void {
    this.coordinator.tick();
  }

  /** A new miner joins (under a fresh address). */
  join(name: string): FakeMiner {
    const m = new FakeMiner(this, newMinerId(), name);
    this.miners.set(m.id, m);
    m.join();
    return m;
  }

  /** `count` miners named `${prefix}0`, `${prefix}1`, … join in order. */
  joinMany(prefix: string, count: number): FakeMiner[] {
    return Array.from({ length: count }, (_, i) => this.join(`${prefix}${i}`));
  }

  /** A run of gpt-micro on moby-dick cut in 2 stages, microbatches of 2 sequences unless told. */
  createRun(over: { steps?: number; mergeEvery?: number; batchSize?: number; minMiners?: number; stages?: number } = {}): RunRecord {
    return this.coordinator.createRun({ model: MODEL, data: 'moby-dick', steps: over.steps ?? 100, stages: over.stages ?? 2, batchSize: over.batchSize ?? 2, ...over }, OWNER);
  }

  run(id: string): RunRecord {
    const r = this.state.runs.get(id);
    assert.ok(r, `run ${id} exists`);
    return r;
  }

  /** The names of the miners assigned to each stage, sorted. */
  replicasByStage(runId: string): string[][] {
    const out: string[][] = [];
    for (const a of this.state.runs.assignments(runId)) (out[a.stage] ??= []).push(this.nameOf(a.minerId));
    return out.map((names) => names.sort());
  }

  /** The fake miners holding `stage`, sorted by id (the order merge rounds list replicas in). */
  replicas(runId: string, stage: number): FakeMiner[] {
    return this.state.runs
      .assignments(runId)
      .filter((a) => a.stage === stage)
      .map((a) => this.miner(a.minerId))
      .sort((a, b) => (a.id < b.id ? -1 : 1));
  }

  miner(id: string): FakeMiner {
    const m = this.miners.get(id);
    assert.ok(m, `miner ${id} is one of the test's`);
    return m;
  }

  nameOf(id: string): string {
    return this.miners.get(id)?.name ?? id;
  }

  /** The work log of a run summed per miner and kind, as { 'name/kind': units }. */
  work(runId: string): Record<string, number> {
    const out: Record<string, number> = {};
    for (const t of this.state.ledger.workTotals(runId)) out[`${this.nameOf(t.minerId)}/${t.kind}`] = t.units;
    return out;
  }
}

/** One hop of a microbatch's attempt, as a receipt names it (the receiver's stage). */
export interface Hop {
  runId: string;
  microbatch: number;
  attempt: number;
  stage: number;
  phase: 'forward' | 'backward';
}

/** A frame a fake miner received and receipted: its sha256 and who sent it. */
interface Received {
  sha: string;
  from: FakeMiner;
}

/**
 * A miner without an engine that behaves like an honest one: it heartbeats,
 * follows the replies, receipts the frames handed to it, and claims the hops
 * the test says it did. Its claims carry the attempt it holds (or `attempt`
 * when the test says otherwise).
 */
export class FakeMiner {
  /** the key it bound at join: it signs its receipts */
  key = SessionKey.generate();
  /** the assignment in the last heartbeat reply */
  assignment: StageAssignment | null = null;
  /** the merge round this miner has applied, when it differs from its assignment's (it reports it with each heartbeat) */
  applied: number | null = null;
  /** the last heartbeat reply it followed */
  reply: HeartbeatReply | null = null;
  /** what it holds, microbatch → attempt: queued (stage 0), or between forward and backward; named in every heartbeat */
  readonly held = new Map<number, number>();
  /** the tasks it was given (stage 0), by microbatch */
  readonly tasks = new Map<number, MicrobatchTask>();
  /** inner steps taken since its last pseudo-gradient upload (a real miner's `StageRunner.samples`): one per backward it claims */
  innerSteps = 0;
  /** the frames it received and receipted, by `microbatch/attempt/phase` */
  private readonly inbox = new Map<string, Received>();

  /** the peer URL it announces (nothing listens there) */
  readonly url: string;
  /** the uplink it says it measured when it joins, Mbit/s */
  bandwidthMbps = 100;

  constructor(
    readonly h: Harness,
    readonly id: string,
    readonly name: string,
  ) {
    this.url = `http://127.0.0.1:${7100 + h.miners.size}`;
  }

  join(): JoinReply {
    return this.h.coordinator.join(this.id, { name: this.name, url: this.url, hardware: HARDWARE, bandwidthMbps: this.bandwidthMbps, sessionKey: this.key.publicKey });
  }

  /** The miner process restarts: a new session key, nothing held, nothing known; it joins again. */
  restart(): JoinReply {
    this.key = SessionKey.generate();
    this.innerSteps = 0;
    this.forgetAll();
    this.assignment = null;
    this.applied = null;
    this.reply = null;
    return this.join();
  }

  // ---- heartbeats ------------------------------------------------------------------

  /**
   * The heartbeat a real miner sends: the run, stage and round of the
   * assignment it last received, what it holds, no free slots unless told.
   */
  request(req: Partial<HeartbeatRequest> = {}): HeartbeatRequest {
    const a = this.assignment;
    const current = a ? { runId: a.runId, stage: a.stage, round: this.applied ?? a.round } : {};
    const held = [...this.held].map(([microbatch, attempt]) => ({ microbatch, attempt }));
    return { freeSlots: 0, queue: 0, reports: [], held, ...current, ...req };
  }

  /** Sends `req` and follows the reply as a real miner does: a new assignment, then abandon, then the new microbatches. */
  send(req: HeartbeatRequest): HeartbeatReply {
    const reply = this.h.coordinator.heartbeat(this.id, req);
    const a = this.assignment;
    if (reply.assignment?.runId !== a?.runId || reply.assignment?.stage !== a?.stage) {
      // a new run or stage: the rounds applied and the work held of the old one mean nothing there
      this.applied = null;
      this.forgetAll();
    }
    this.assignment = reply.assignment;
    for (const id of reply.abandon) this.forget(id);
    for (const task of reply.microbatches) {
      this.forget(task.id);
      this.held.set(task.id, task.attempt);
      this.tasks.set(task.id, task);
    }
    this.reply = reply;
    return reply;
  }

  /** One heartbeat: `request(req)`, sent and followed. */
  beat(req: Partial<HeartbeatRequest> = {}): HeartbeatReply {
    return this.send(this.request(req));
  }

  /** One heartbeat with `freeSlots` free: the microbatches it was given. */
  take(freeSlots: number): number[] {
    return this.beat({ freeSlots }).microbatches.map((t) => t.id);
  }

  // ---- the peer API ----------------------------------------------------------------

  /** A neighbour hands this miner a frame (sha256 `frameSha`) of `hop`: it accepts it and answers with its receipt. */
  receive(from: FakeMiner, hop: Hop, frameSha: string): string {
    assert.equal(this.assignment?.runId, hop.runId, `${this.name} holds run ${hop.runId}`);
    assert.equal(this.assignment?.stage, hop.stage, `${this.name} holds stage ${hop.stage}`);
    this.inbox.set(`${hop.microbatch}/${hop.attempt}/${hop.phase}`, { sha: frameSha, from });
    if (hop.phase === 'forward') this.held.set(hop.microbatch, hop.attempt);
    return signReceipt(this.key, this.h.domain, { ...hop, frameSha });
  }

  /** The frame of microbatch `mb`'s attempt this miner received in `phase`, if any. */
  received(mb: number, attempt: number, phase: 'forward' | 'backward'): Received | undefined {
    return this.inbox.get(`${mb}/${attempt}/${phase}`);
  }

  // ---- claims ------------------------------------------------------------------------

  /**
   * The forward of microbatch `mb` at this miner's (not last) stage: the
   * activation goes to `to`, which receipts it; the claim carries the sha of
   * the frame sent and (past stage 0) of the frame received.
   */
  forward(mb: number, opts: { to: FakeMiner; attempt?: number }): WorkReport {
    const { runId, stage, stageCount } = this.at();
    assert.ok(stage < stageCount - 1, `${this.name} holds the last stage: its forward is last()`);
    const attempt = this.attemptOf(mb, opts.attempt);
    const outputSha = this.frameSha(mb, attempt, 'forward');
    const receipt = opts.to.receive(this, { runId, microbatch: mb, attempt, stage: stage + 1, phase: 'forward' }, outputSha);
    const inputSha = stage > 0 ? this.received(mb, attempt, 'forward')?.sha : undefined;
    return { runId, microbatch: mb, attempt, stage, phase: 'forward', next: opts.to.id, receipt, bytesSent: FRAME_BYTES, outputSha, ...(inputSha ? { inputSha } : {}) };
  }

  /** The last stage's forward of microbatch `mb`: the loss, and the sha of the activation received. */
  last(mb: number, opts: { loss: number; attempt?: number }): WorkReport {
    const { runId, stage, stageCount } = this.at();
    assert.equal(stage, stageCount - 1, `${this.name} holds the last stage`);
    const attempt = this.attemptOf(mb, opts.attempt);
    const inputSha = this.received(mb, attempt, 'forward')?.sha;
    return { runId, microbatch: mb, attempt, stage, phase: 'forward', loss: opts.loss, bytesSent: 0, ...(inputSha ? { inputSha } : {}) };
  }

  /**
   * The backward of microbatch `mb` at this miner's stage: past stage 0 the
   * gradient goes back to `to` (by default whoever sent the activation), which
   * receipts it; before the last stage the claim carries the sha of the
   * gradient received. The miner lets the microbatch go.
   */
  backward(mb: number, opts: { to?: FakeMiner; attempt?: number } = {}): WorkReport {
    const { runId, stage, stageCount } = this.at();
    const attempt = this.attemptOf(mb, opts.attempt);
    const r: WorkReport = { runId, microbatch: mb, attempt, stage, phase: 'backward', bytesSent: 0 };
    if (stage > 0) {
      const to = opts.to ?? this.received(mb, attempt, 'forward')?.from;
      assert.ok(to, `${this.name} knows whom to send microbatch ${mb}'s gradient to`);
      r.outputSha = this.frameSha(mb, attempt, 'backward');
      r.receipt = to.receive(this, { runId, microbatch: mb, attempt, stage: stage - 1, phase: 'backward' }, r.outputSha);
      r.next = to.id;
      r.bytesSent = FRAME_BYTES;
    }
    if (stage < stageCount - 1) {
      const input = this.received(mb, attempt, 'backward')?.sha;
      if (input) r.inputSha = input;
    }
    this.innerSteps++;
    this.forget(mb);
    return r;
  }

  /** The miner lets microbatch `mb` go and says so: a 'dropped' claim of the attempt it held. */
  dropped(mb: number, reason = 'queue full', attempt?: number): WorkReport {
    const { runId, stage } = this.at();
    const r: WorkReport = { runId, microbatch: mb, attempt: this.attemptOf(mb, attempt), stage, phase: 'dropped', bytesSent: 0, reason };
    this.forget(mb);
    return r;
  }

  /** The sha256 of the frame this miner sends in `phase` of microbatch `mb`'s attempt: distinct per hop and miner. */
  frameSha(mb: number, attempt: number, phase: 'forward' | 'backward'): string {
    const a = this.at();
    return sha(`${a.runId}/${mb}/${attempt}/${a.stage}/${phase}/${this.id}`);
  }

  private at(): StageAssignment {
    assert.ok(this.assignment, `${this.name} has an assignment (heartbeat first)`);
    return this.assignment;
  }

  private attemptOf(mb: number, attempt: number | undefined): number {
    const a = attempt ?? this.held.get(mb);
    assert.ok(a !== undefined, `${this.name} holds microbatch ${mb} (or the test names the attempt)`);
    return a;
  }

  /** Lets microbatch `mb` go: not held, its frames forgotten. */
  private forget(mb: number): void {
    this.held.delete(mb);
    this.tasks.delete(mb);
    for (const k of [...this.inbox.keys()]) if (k.startsWith(`${mb}/`)) this.inbox.delete(k);
  }

  private forgetAll(): void {
    this.held.clear();
    this.tasks.clear();
    this.inbox.clear();
  }
}

/**
 * A work report made by hand, for claims no honest miner makes (malformed,
 * stale, off the path): `phase` of microbatch `mb` at `stage`, of the attempt
 * named (FRAME_BYTES sent unless told).
 */
export function report(runId: string, mb: number, stage: number, phase: WorkReport['phase'], extra: Partial<WorkReport> & { attempt: number }): WorkReport {
  return { runId, microbatch: mb, stage, phase, bytesSent: FRAME_BYTES, ...extra };
}

/**
 * Microbatch `mb` through the pipeline `path` (one miner per stage, the first
 * holding it) as honest miners do it: the forwards hop to hop, the last
 * stage's forward with `loss` and its backward, then the backwards back to
 * stage 0. Each miner claims its hops in one heartbeat.
 */
export function completeAlong(mb: number, path: readonly FakeMiner[], loss = 5.5): void {
  const S = path.length;
  for (let s = 0; s < S - 1; s++) path[s].beat({ reports: [path[s].forward(mb, { to: path[s + 1] })] });
  path[S - 1].beat({ reports: [path[S - 1].last(mb, { loss }), path[S - 1].backward(mb)] });
  for (let s = S - 2; s >= 0; s--) path[s].beat({ reports: [path[s].backward(mb)] });
}

/** Microbatch `mb` of run `runId` through a 2-stage pipeline: `s0` (which holds it) forwards to `s1`, and the gradient comes back. */
export function completeMicrobatch(runId: string, mb: number, s0: FakeMiner, s1: FakeMiner, loss = 5.5): void {
  assert.equal(s0.assignment?.runId, runId, `${s0.name} holds run ${runId}`);
  completeAlong(mb, [s0, s1], loss);
}

/** Asserts `fn` throws (or rejects with) a NimbleError with `status`, and a message matching `message`. */
export async function expectNimbleError(fn: () => unknown, status: number, message?: RegExp): Promise<NimbleError> {
  let caught: unknown;
  try {
    await fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof NimbleError, `expected a NimbleError ${status}, got ${String(caught)}`);
  assert.equal(caught.status, status, caught.message);
  if (message) assert.match(caught.message, message);
  return caught;
}


// ---- a replica's half of a merge round ---------------------------------------------
//
// What an honest replica does in a round (src/miner/merge-round.ts), with the
// same functions: it uploads its pseudo-gradient (θ_start − θ after its inner
// steps, int8 frames with error feedback), merges the partitions it is given
// under the round's rule (`mergePartition`), and after the outer step
// (StageRunner.applyOuterStep) saves the stage state (StageRunner.encodeState).
// A fake replica trains nothing: its pseudo-gradient is random from a seed, as
// large as its inner AdamW steps move weights (about lr per step).

/** Parameters of a stage's parts. */
export function stageParamCount(h: Harness, runId: string, stage: number): number {
  const s = h.state.runs.stage(runId, stage)!;
  return rangeParamCount(CONFIG, { from: s.fromPart, to: s.toPart });
}

/** The round's key as a miner sees it in its task. */
export function roundKey(m: FakeMiner, task: MergeTask): RoundKey {
  return { runId: m.assignment!.runId, stage: m.assignment!.stage, round: task.round };
}

/** Merge round `round` of a stage as the orchestrator keeps it (asserted present). */
export function mergeRound(h: Harness, runId: string, stage: number, round: number): MergeRoundRecord {
  const r = h.state.mergeRounds.get({ runId, stage, round });
  assert.ok(r, `round ${round} of stage ${stage} exists`);
  return r;
}

/**
 * A fake replica's pseudo-gradient for its stage after `samples` inner steps:
 * random from `seed`, each value within ±lr·samples (an AdamW step moves a
 * weight by about lr; never more than adamMoveBound allows).
 */
export function fakePseudoGradient(h: Harness, m: FakeMiner, seed: number, samples: number): Float32Array {
  const a = m.assignment!;
  return randomVector(stageParamCount(h, a.runId, a.stage), seed, a.lr * samples);
}

/**
 * A replica's pseudo-gradient (by default `fakePseudoGradient` of the inner
 * steps it took) as a miner uploads it: one int8 frame per partition of
 * `task`, with error feedback over the whole vector and the round in the
 * frames' meta.
 */
export function pseudoGradientFrames(h: Harness, m: FakeMiner, task: MergeTask, seed: number, samples = m.innerSteps, pg = fakePseudoGradient(h, m, seed, samples)): Uint8Array[] {
  const k = roundKey(m, task);
  return encodePseudoGradientPartitions(pg, task.partitions, new ErrorFeedback(pg.length, DEFAULT_BLOCK_SIZE), { runId: k.runId, stage: k.stage, round: k.round });
}

/**
 * Uploads every partition of a replica's pseudo-gradient after `samples`
 * inner steps (by default the ones it took since its last upload), claiming
 * them as its weight; returns the blob ids.
 */
export async function uploadPseudoGradient(h: Harness, m: FakeMiner, task: MergeTask, seed: number, samples = m.innerSteps): Promise<string[]> {
  const frames = pseudoGradientFrames(h, m, task, seed, samples);
  const out: string[] = [];
  for (const [p, frame] of frames.entries()) out.push(await h.coordinator.mergeUploads.putPseudoGradient(m.id, roundKey(m, task), p, samples, frame));
  m.innerSteps = 0;
  return out;
}

/** The merged frame of one merge job of `task`, as a miner computes it: the inputs downloaded, merged under the round's rule. */
export async function mergedFrame(h: Harness, m: FakeMiner, task: MergeTask, job: MergeTask['merge'][number]): Promise<Uint8Array> {
  const part = task.partitions[job.partition];
  const slices = [];
  for (const input of job.inputs) slices.push({ minerId: input.minerId, samples: input.samples, slice: decodePartitionFrame(await h.blobs.get(input.blob), part) });
  return mergePartition(slices, { aggregator: task.aggregator, trim: task.trim, maxNorm: job.maxNorm }, part, roundKey(m, task));
}

/** Merges what the task says, as a miner does, and uploads each result; returns the blob ids. */
export async function mergeAndUpload(h: Harness, m: FakeMiner, task: MergeTask): Promise<string[]> {
  const out: string[] = [];
  for (const job of task.merge) out.push(await h.coordinator.mergeUploads.putMerged(m.id, roundKey(m, task), job.partition, await mergedFrame(h, m, task, job)));
  return out;
}

/** A stage's state after a round: weights, outer momentum, outer steps taken. */
export interface FakeStageState {
  weights: Float32Array;
  momentum: Float32Array;
  outerStep: number;
}

/**
 * The stage state a replica holds after applying merge round `round` (the
 * round must be applying): from the state the round started from, the outer
 * step of the chosen merged partitions with the run's outer lr and momentum;
 * with a single replica (no partitions) its own weights, the start minus its
 * pseudo-gradient (`seed`, `samples`), momentum and outer step unchanged.
 */
export async function appliedState(h: Harness, runId: string, stage: number, round: number, own: { seed?: number; samples?: number } = {}): Promise<FakeStageState> {
  const run = h.run(runId);
  const record = mergeRound(h, runId, stage, round);
  const start = await h.coordinator.stageStates.at(run, stage, round - 1);
  assert.ok(start, `the state round ${round} of stage ${stage} started from is kept`);
  const n = start.weights.length;
  if (record.partitions === 0) {
    const pg = randomVector(n, own.seed ?? 0, run.options.lr * (own.samples ?? 2));
    const weights = new Float32Array(n);
    for (let i = 0; i < n; i++) weights[i] = start.weights[i] - pg[i];
    return { weights, momentum: start.momentum.slice(), outerStep: start.outerStep };
  }
  assert.ok(record.plan.chosen, `round ${round} of stage ${stage} has chosen its merged partitions`);
  const frames: Uint8Array[] = [];
  for (const blob of record.plan.chosen) frames.push(await h.blobs.get(blob));
  const delta = decodeMergedDelta(frames, partitionVector(n, record.partitions));
  // StageRunner.applyOuterStep: the outer state carried from the round before, the step from the weights the round started at
  const outer = { ...createOuterState(n, { lr: run.options.outerLr, momentum: run.options.outerMomentum }), step: start.outerStep, momentumBuffer: start.momentum.slice() };
  const weights = outerStep(outer, start.weights, delta);
  return { weights, momentum: outer.momentumBuffer, outerStep: outer.step };
}

/** A stage state as StageRunner.encodeState writes it: the stage's named tensors, `outer.momentum`, `outerStep`; `step` is the round. */
export async function encodeStageState(h: Harness, runId: string, stage: number, step: number, state: FakeStageState): Promise<Uint8Array> {
  const s = h.state.runs.stage(runId, stage)!;
  const range = { from: s.fromPart, to: s.toPart };
  const g = new GptStage(await h.engine(), CONFIG, range, { batchSize: 1 });
  try {
    g.params.flat.data.set(state.weights);
    return encodeCheckpoint([...stageTensors(g), { name: 'outer.momentum', shape: [g.paramCount], data: state.momentum }], {
      config: CONFIG,
      range,
      step,
      extra: { outerStep: String(state.outerStep) },
    });
  } finally {
    g.release();
  }
}

/**
 * The stage state an honest replica saves after merge round `round`
 * (`appliedState`, encoded); `edit` changes it first, for a dishonest or
 * broken one, and `step` overrides the round the checkpoint names.
 */
export async function stageState(
  h: Harness,
  runId: string,
  stage: number,
  round: number,
  opts: { seed?: number; samples?: number; step?: number; edit?: (state: FakeStageState) => void } = {},
): Promise<Uint8Array> {
  const state = await appliedState(h, runId, stage, round, opts);
  opts.edit?.(state);
  return encodeStageState(h, runId, stage, opts.step ?? round, state);
}
