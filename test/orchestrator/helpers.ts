// Shared fakes of the coordinator tests: a real Coordinator on a real
// OrchestratorState and FsBlobStore in a temp dir, a clock the test moves by
// hand, and fake miners that heartbeat the way src/miner/miner.ts does (naming
// the run, stage and merge round they hold), with builders for the work
// reports and the merge-round uploads of a real miner. No child process, no
// network.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { decodePartitionFrame, encodeMergedPartition, encodePseudoGradientPartitions } from '../../src/merge/pseudo-gradient.ts';
import { encodeCheckpoint } from '../../src/model/checkpoint.ts';
import { gptConfig } from '../../src/model/config.ts';
import { partParams, rangeParamCount } from '../../src/model/gpt.ts';
import type { NamedTensor } from '../../src/model/safetensors.ts';
import { FsBlobStore } from '../../src/orchestrator/blobs.ts';
import { Coordinator, COORDINATOR_DEFAULTS, type CoordinatorOptions } from '../../src/orchestrator/coordinator.ts';
import { OrchestratorState } from '../../src/orchestrator/state/index.ts';
import type { RoundKey } from '../../src/orchestrator/state/merge-rounds.ts';
import type { RunRecord } from '../../src/orchestrator/state/runs.ts';
import { DEFAULT_BLOCK_SIZE } from '../../src/protocol/codec.ts';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import type { HeartbeatReply, HeartbeatRequest, MergeTask, StageAssignment, WorkReport } from '../../src/protocol/messages.ts';
import { randomVector } from '../merge/helpers.ts';

/** The model every coordinator test trains: 4 parts, cut in 2 stages as parts [0, 3) and [3, 4). */
export const MODEL = 'gpt-micro';
export const CONFIG = gptConfig(MODEL);

/** What every fake miner measures when it joins: equal miners, memory to spare. */
export const HARDWARE = { gflops: 10, threads: 1, memoryBytes: 1 << 30 };

/** A fresh miner address, as a miner's key file would give it. */
export function newMinerId(): string {
  return privateKeyToAccount(generatePrivateKey()).address;
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

  private constructor(
    readonly dir: string,
    options: Partial<CoordinatorOptions>,
  ) {
    // spot checks off unless a test asks for them
    this.options = { ...COORDINATOR_DEFAULTS, spotChecks: { rate: 0 }, ...options, now: () => this.now };
  }

  /** A harness with the coordinator's defaults, spot checks off, overridden by `options`. */
  static async open(options: Partial<CoordinatorOptions> = {}): Promise<Harness> {
    const h = new Harness(mkdtempSync(join(tmpdir(), 'nimble-coordinator-')), options);
    await h.start();
    return h;
  }

  private async start(): Promise<void> {
    this.state = OrchestratorState.open(join(this.dir, 'o.sqlite'));
    this.blobs = await FsBlobStore.open(join(this.dir, 'blobs'));
    this.coordinator = new Coordinator(this.state, this.blobs, this.options);
  }

  /** The orchestrator stops (its memory is lost) and starts again on the same database and blobs. */
  async restart(): Promise<void> {
    this.state.close();
    await this.start();
  }

  close(): void {
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
    return this.coordinator.createRun({ model: MODEL, data: 'moby-dick', steps: over.steps ?? 100, stages: over.stages ?? 2, batchSize: over.batchSize ?? 2, ...over });
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

/** A miner without an engine: it heartbeats and reports what the test says it did. */
export class FakeMiner {
  /** the assignment in the last heartbeat reply */
  assignment: StageAssignment | null = null;
  /** the merge round this miner has applied, when it differs from its assignment's (it reports it with each heartbeat) */
  applied: number | null = null;
  /** the last heartbeat reply */
  last: HeartbeatReply | null = null;

  /** the peer URL it announces (nothing listens there) */
  readonly url: string;

  constructor(
    readonly h: Harness,
    readonly id: string,
    readonly name: string,
  ) {
    this.url = `http://127.0.0.1:${7100 + h.miners.size}`;
  }

  join(): void {
    this.h.coordinator.join(this.id, { name: this.name, url: this.url, hardware: HARDWARE, bandwidthMbps: 100 });
  }

  /**
   * Heartbeats as a real miner does: naming the run, stage and round of the
   * assignment it last received, with no free slots unless told.
   */
  beat(req: Partial<HeartbeatRequest> = {}): HeartbeatReply {
    const a = this.assignment;
    const held = a ? { runId: a.runId, stage: a.stage, round: this.applied ?? a.round } : {};
    const reply = this.h.coordinator.heartbeat(this.id, { freeSlots: 0, queue: 0, reports: [], ...held, ...req });
    // a new run or stage: the rounds applied of the old one mean nothing there
    if (reply.assignment?.runId !== a?.runId || reply.assignment?.stage !== a?.stage) this.applied = null;
    this.assignment = reply.assignment;
    this.last = reply;
    return reply;
  }

  /** One heartbeat with `freeSlots` free: the microbatches it was given. */
  take(freeSlots: number): number[] {
    return this.beat({ freeSlots }).microbatches.map((t) => t.id);
  }
}

/** A work report of `phase` for microbatch `mb` at `stage` (10 bytes sent unless told). */
export function report(runId: string, mb: number, stage: number, phase: WorkReport['phase'], extra: Partial<WorkReport> = {}): WorkReport {
  return { runId, microbatch: mb, stage, phase, bytesSent: 10, ...extra };
}

/**
 * Microbatch `mb` through a 2-stage pipeline as the miners report it: the
 * stage-0 forward (sent to `s1`), the last stage's forward with `loss` and its
 * backward, then the stage-0 backward.
 */
export function completeMicrobatch(runId: string, mb: number, s0: FakeMiner, s1: FakeMiner, loss = 5.5): void {
  s0.beat({ reports: [report(runId, mb, 0, 'forward', { next: s1.id })] });
  s1.beat({ reports: [report(runId, mb, 1, 'forward', { loss }), report(runId, mb, 1, 'backward')] });
  s0.beat({ reports: [report(runId, mb, 0, 'backward')] });
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

/** Parameters of a stage's parts. */
export function stageParamCount(h: Harness, runId: string, stage: number): number {
  const s = h.state.runs.stage(runId, stage)!;
  return rangeParamCount(CONFIG, { from: s.fromPart, to: s.toPart });
}

/** The round's key as a miner sees it in its task. */
export function roundKey(m: FakeMiner, task: MergeTask): RoundKey {
  return { runId: m.assignment!.runId, stage: m.assignment!.stage, round: task.round };
}

/**
 * A replica's pseudo-gradient for its stage (small random values from
 * `seed`), one int8 frame per partition of `task`, with error feedback over
 * the whole vector as a miner keeps it.
 */
export function pseudoGradientFrames(h: Harness, m: FakeMiner, task: MergeTask, seed: number): Uint8Array[] {
  const n = stageParamCount(h, m.assignment!.runId, m.assignment!.stage);
  return encodePseudoGradientPartitions(randomVector(n, seed, 0.01), task.partitions, new ErrorFeedback(n, DEFAULT_BLOCK_SIZE));
}

/** Uploads every partition of a replica's pseudo-gradient; returns the blob ids. */
export async function uploadPseudoGradient(h: Harness, m: FakeMiner, task: MergeTask, seed: number, samples = 2): Promise<string[]> {
  const frames = pseudoGradientFrames(h, m, task, seed);
  const out: string[] = [];
  for (const [p, frame] of frames.entries()) out.push(await h.coordinator.merges.putPseudoGradient(m.id, roundKey(m, task), p, samples, frame));
  return out;
}

/** Merges what the task says (a sample-weighted mean of the inputs, downloaded from the blob store) and uploads each result. */
export async function mergeAndUpload(h: Harness, m: FakeMiner, task: MergeTask): Promise<string[]> {
  const out: string[] = [];
  for (const job of task.merge) {
    const p = task.partitions[job.partition];
    const sum = new Float32Array(p.end - p.start);
    let weight = 0;
    for (const input of job.inputs) {
      const slice = decodePartitionFrame(await h.blobs.get(input.blob), p);
      for (let i = 0; i < sum.length; i++) sum[i] += slice[i] * input.samples;
      weight += input.samples;
    }
    for (let i = 0; i < sum.length; i++) sum[i] /= weight;
    out.push(await h.coordinator.merges.putMerged(m.id, roundKey(m, task), job.partition, encodeMergedPartition(sum, p)));
  }
  return out;
}

/** A stage state as a replica saves it after merge round `round`: its parts' tensors, the outer momentum, `outerStep`. */
export function stageState(h: Harness, runId: string, stage: number, round: number): Uint8Array {
  const s = h.state.runs.stage(runId, stage)!;
  const tensors: NamedTensor[] = [];
  for (let part = s.fromPart; part < s.toPart; part++) {
    for (const spec of partParams(CONFIG, part)) {
      const n = spec.shape.reduce((a, b) => a * b, 1);
      tensors.push({ name: spec.name, shape: [...spec.shape], data: new Float32Array(n).fill(0.01) });
    }
  }
  const n = stageParamCount(h, runId, stage);
  tensors.push({ name: 'outer.momentum', shape: [n], data: new Float32Array(n) });
  return encodeCheckpoint(tensors, { config: CONFIG, range: { from: s.fromPart, to: s.toPart }, step: round, extra: { outerStep: String(round) } });
}
