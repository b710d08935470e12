// A miner's pipeline work: the job queue (new microbatches from the
// orchestrator, activations and gradients from peers), the pump that runs one
// job at a time (gradients first, forwards while an activation slot is free),
// forward and backward execution on the stage runner, and the sends: an
// activation to a next-stage replica picked at random by weight (the others
// tried if it fails), a gradient back to the previous hop of the microbatch's
// route. Every forward is recorded for a possible spot check and every piece
// of work reported for the next heartbeat.
import type { CheckMeta } from '../protocol/check-bundle.ts';
import { encodeFrame, readFrameHeader } from '../protocol/frame.ts';
import type { BackwardMeta, ForwardMeta, MicrobatchTask, Peer, WorkReport } from '../protocol/messages.ts';
import type { ForwardRecords } from './forward-records.ts';
import type { StageRunner } from './stage-runner.ts';
import type { Throttle } from './throttle.ts';

/** A new microbatch (stage 0 loads its batch), or an activation or gradient a peer sent. */
export type Job =
  | { kind: 'start'; task: MicrobatchTask }
  | { kind: 'forward'; meta: ForwardMeta; data: Float32Array; frame: Uint8Array; sha: string }
  | { kind: 'backward'; meta: BackwardMeta; data: Float32Array };

/** A hop of a microbatch's route: a miner and its peer URL. */
export interface Hop {
  id: string;
  url: string;
}

/**
 * Fault injection for tests: a dishonest miner that changes each activation
 * before it sends it, or the loss it reports. Not exposed on the command line.
 */
export interface Tamper {
  activation?: (activation: Float32Array) => void;
  loss?: (loss: number) => number;
}

/** The counters the pipeline adds to. */
export interface PipelineStats {
  forward: number;
  backward: number;
  bytesSent: number;
}

export interface PipelineDeps {
  /** the stage held now, or null */
  runner(): StageRunner | null;
  /** true while no job may start (a stage loading, a merge round open) */
  paused(): boolean;
  /** this miner as a hop of a route (its URL is known once the peer API listens) */
  self(): Hop;
  /** sends a signed POST to a peer; rejects when it is not accepted */
  post(url: string, body: Uint8Array): Promise<unknown>;
  throttle: Throttle;
  records: ForwardRecords;
  stats: PipelineStats;
  /** work done, for the next heartbeat */
  report(r: WorkReport): void;
  /** keeps a background send until the miner stops */
  track(p: Promise<unknown>): void;
  log(line: string): void;
  tamper?: Tamper;
}

export class Pipeline {
  private readonly queue: Job[] = [];
  /** per microbatch held: the route its activation took, this miner last */
  private readonly routes = new Map<number, Hop[]>();
  private peers: Peer[] = [];
  private pumping = false;
  private stopped = false;

  constructor(private readonly deps: PipelineDeps) {}

  /** The stage held now (what the peer API checks work against), or null. */
  get runner(): StageRunner | null {
    return this.deps.runner();
  }

  /** Jobs waiting. */
  get queued(): number {
    return this.queue.length;
  }

  /** New microbatches waiting (not counting activations and gradients). */
  get startsQueued(): number {
    return this.queue.filter((j) => j.kind === 'start').length;
  }

  /** The next stage's replicas, to send activations to. */
  setPeers(peers: Peer[]): void {
    this.peers = peers;
  }

  /** Queues a job; `pump()` starts it. */
  enqueue(job: Job): void {
    this.queue.push(job);
  }

  /** Queues a job and starts working if idle. */
  push(job: Job): void {
    this.queue.push(job);
    void this.pump();
  }

  /** Lets a microbatch go: its queued jobs, its slot (reported dropped when `reason` is given) and its route. */
  abandon(microbatch: number, reason?: string): void {
    const runner = this.deps.runner();
    for (let i = this.queue.length - 1; i >= 0; i--) {
      if (jobMicrobatch(this.queue[i]) === microbatch) this.queue.splice(i, 1);
    }
    if (runner?.holds(microbatch)) {
      runner.release(microbatch);
      if (reason) this.deps.report({ runId: runner.runId, microbatch, stage: runner.assignment.stage, phase: 'dropped', bytesSent: 0, reason });
    }
    this.routes.delete(microbatch);
  }

  /** Forgets every job, route and forward record (the stage is dropped). */
  clear(): void {
    this.deps.records.clear();
    this.queue.length = 0;
    this.routes.clear();
  }

  /** Resolves once no job is running. */
  async idle(): Promise<void> {
    while (this.pumping) await sleep(5);
  }

  stop(): void {
    this.stopped = true;
  }

  /** Runs queued jobs until none may start. */
  async pump(): Promise<void> {
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (;;) {
        if (this.stopped) return;
        const job = this.nextJob();
        if (!job) return;
        const runner = this.deps.runner()!;
        try {
          await this.deps.throttle.run(() => this.execute(runner, job));
        } catch (err) {
          const id = jobMicrobatch(job);
          this.deps.log(`microbatch ${id}: ${(err as Error).message}`);
          runner.release(id);
          this.deps.report({ runId: runner.runId, microbatch: id, stage: runner.assignment.stage, phase: 'dropped', bytesSent: 0, reason: (err as Error).message.slice(0, 200) });
        }
        await new Promise((r) => setImmediate(r)); // let I/O in
      }
    } finally {
      this.pumping = false;
    }
  }

  private nextJob(): Job | undefined {
    const runner = this.deps.runner();
    if (!runner || this.deps.paused()) return undefined;
    const b = this.queue.findIndex((j) => j.kind === 'backward');
    if (b >= 0) return this.queue.splice(b, 1)[0];
    if (runner.freeSlotCount === 0) return undefined;
    return this.queue.shift();
  }

  private execute(runner: StageRunner, job: Job): void {
    if (job.kind === 'backward') this.backward(runner, job.meta.microbatch, job.data);
    else if (runner.assignment.stage === runner.assignment.stageCount - 1) this.forwardLast(runner, job);
    else this.forward(runner, job);
  }

  /** Last stage: forward to the loss and backward at once; the gradient goes back to the previous hop. */
  private forwardLast(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): void {
    const { records, stats } = this.deps;
    const a = runner.assignment;
    const w = work(runner, job);
    const weights = runner.copyWeights(records.buffer(runner.paramCount));
    let result: { loss: number; dInput: Float32Array | null };
    try {
      result = runner.forwardBackwardLast(w.id, w.shard, job.kind === 'forward' ? job.data : null);
    } catch (err) {
      records.recycle(weights);
      throw err;
    }
    const loss = this.deps.tamper?.loss?.(result.loss) ?? result.loss;
    stats.forward++;
    stats.backward++;
    records.add({ meta: w.checkMeta, weights, input: w.input?.frame ?? null, output: null });
    let bytes = 0;
    if (result.dInput && a.stage > 0) bytes = this.sendBackward(runner, w.route[a.stage - 1], { runId: a.runId, microbatch: w.id, stage: a.stage - 1 }, result.dInput);
    this.deps.report({ runId: a.runId, microbatch: w.id, stage: a.stage, phase: 'forward', loss, bytesSent: 0, ...(w.input ? { inputSha: w.input.sha } : {}) });
    this.deps.report({ runId: a.runId, microbatch: w.id, stage: a.stage, phase: 'backward', bytesSent: bytes });
  }

  /** First or middle stage: forward, keep the microbatch in a slot, send the activation on. */
  private forward(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): void {
    const a = runner.assignment;
    const w = work(runner, job);
    const out = job.kind === 'start' ? runner.forwardFirst(w.id, w.shard) : runner.forwardMiddle(w.id, job.data);
    this.deps.stats.forward++;
    this.deps.tamper?.activation?.(out);
    const fullRoute = [...w.route, this.deps.self()];
    this.routes.set(w.id, fullRoute);
    const body = frame(runner, out, { runId: a.runId, microbatch: w.id, shard: w.shard, step: w.step, stage: a.stage + 1, route: fullRoute });
    const used = runner.forwardWeights(w.id)!;
    // the forward ran with weights predicted `predictedSteps` inner steps ahead
    w.checkMeta.samples += used.predictedSteps;
    this.deps.records.add({ meta: w.checkMeta, weights: this.deps.records.snapshot(used.weights), input: w.input?.frame ?? null, output: body });
    this.sendForward(runner, w.id, body, { outputSha: readFrameHeader(body).header.sha256, ...(w.input ? { inputSha: w.input.sha } : {}) });
  }

  /** A gradient came back: backward, inner step, the input's gradient to the previous hop. */
  private backward(runner: StageRunner, id: number, dOutput: Float32Array): void {
    const a = runner.assignment;
    const dInput = runner.backward(id, dOutput);
    this.deps.stats.backward++;
    const route = this.routes.get(id) ?? [];
    this.routes.delete(id);
    let bytes = 0;
    if (dInput && a.stage > 0) bytes = this.sendBackward(runner, route[a.stage - 1], { runId: a.runId, microbatch: id, stage: a.stage - 1 }, dInput);
    this.deps.report({ runId: a.runId, microbatch: id, stage: a.stage, phase: 'backward', bytesSent: bytes });
  }

  /** Sends an activation frame to a next-stage replica chosen at random by weight; tries others if one fails. */
  private sendForward(runner: StageRunner, microbatch: number, body: Uint8Array, commit: { outputSha: string; inputSha?: string }): void {
    const candidates = [...this.peers];
    const a = runner.assignment;
    const attempt = async (): Promise<void> => {
      while (candidates.length) {
        const peer = pickWeighted(candidates);
        candidates.splice(candidates.indexOf(peer), 1);
        try {
          await this.deps.post(`${peer.url}/forward`, body);
          this.deps.stats.bytesSent += body.length;
          this.deps.report({ runId: a.runId, microbatch, stage: a.stage, phase: 'forward', next: peer.id, bytesSent: body.length, ...commit });
          return;
        } catch (err) {
          this.deps.log(`forward of microbatch ${microbatch} to ${peer.url} failed: ${(err as Error).message}`);
        }
      }
      this.deps.records.drop(microbatch);
      this.abandon(microbatch, 'no next-stage replica accepted the activation');
    };
    this.deps.track(attempt());
  }

  /** Sends a gradient frame back to `to` in the background; returns its size (0 when there is no hop). */
  private sendBackward(runner: StageRunner, to: Hop | undefined, meta: BackwardMeta, grad: Float32Array): number {
    if (!to) return 0;
    const body = frame(runner, grad, meta);
    this.deps.track(
      this.deps.post(`${to.url}/backward`, body).then(
        () => void (this.deps.stats.bytesSent += body.length),
        (err) => this.deps.log(`gradient of microbatch ${meta.microbatch} to ${to.url} failed: ${(err as Error).message}`),
      ),
    );
    return body.length;
  }
}

/** What a forward job is about: its microbatch, shard, step, route so far, input frame and spot-check meta. */
function work(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): {
  id: number;
  shard: number;
  step: number;
  route: Hop[];
  input: { frame: Uint8Array; sha: string } | null;
  checkMeta: CheckMeta;
} {
  const a = runner.assignment;
  const id = job.kind === 'start' ? job.task.id : job.meta.microbatch;
  const shard = job.kind === 'start' ? job.task.shard : job.meta.shard;
  return {
    id,
    shard,
    step: job.kind === 'start' ? job.task.step : job.meta.step,
    route: job.kind === 'start' ? [] : job.meta.route,
    input: job.kind === 'forward' ? { frame: job.frame, sha: job.sha } : null,
    checkMeta: { runId: a.runId, microbatch: id, stage: a.stage, round: runner.round, samples: runner.samples, shard },
  };
}

function jobMicrobatch(job: Job): number {
  return job.kind === 'start' ? job.task.id : job.meta.microbatch;
}

/** An activation or gradient as a frame in the run's codec. */
function frame(runner: StageRunner, data: Float32Array, meta: ForwardMeta | BackwardMeta): Uint8Array {
  const C = runner.activationShape[1];
  return encodeFrame(data, [data.length / C, C], runner.assignment.codec, meta);
}

function pickWeighted(peers: Peer[]): Peer {
  const total = peers.reduce((a, p) => a + Math.max(p.weight, 1e-6), 0);
  let r = Math.random() * total;
  for (const p of peers) {
    r -= Math.max(p.weight, 1e-6);
    if (r <= 0) return p;
  }
  return peers[peers.length - 1];
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
