// A miner's pipeline work: the job queue (new microbatches from the
// orchestrator, activations and gradients from peers), the pump that runs one
// job at a time (one forward, one backward: ./job-order.ts; a forward only
// while an activation slot is free; between two it lets in the I/O that came
// during the first, and only then sends a heartbeat that came due:
// whenSettled), forward and backward execution on the stage runner, and the
// sends: an activation to a next-stage replica picked at random by weight
// (the others tried if it fails), a gradient back to the replica the
// activation came from (at the URL the orchestrator gave for it). Each send
// is answered with the receiver's receipt, which goes into the report of
// that hop; every forward is recorded for a possible spot check.
import type { CheckMeta } from '../protocol/check-bundle.ts';
import { encodeFrame, readFrameHeader } from '../protocol/frame.ts';
import type { BackwardMeta, ForwardMeta, MicrobatchTask, Peer, PeerAccepted, WorkReport } from '../protocol/messages.ts';
import type { ForwardRecords } from './forward-records.ts';
import { nextJobIndex } from './job-order.ts';
import type { Tamper } from './tamper.ts';
import type { StageRunner } from './stage-runner.ts';
import type { Throttle } from './throttle.ts';

/** A new microbatch (stage 0 loads its batch), or an activation or gradient a peer sent (checked by the peer API). */
export type Job =
  | { kind: 'start'; task: MicrobatchTask }
  | { kind: 'forward'; meta: ForwardMeta; data: Float32Array; frame: Uint8Array; sha: string; sender: string }
  | { kind: 'backward'; meta: BackwardMeta; data: Float32Array; sha: string };

/** The counters the pipeline adds to. */
export interface PipelineStats {
  forward: number;
  backward: number;
  bytesSent: number;
  /** each job's time, added up by kind (absent: not timed; the miner's /health shows them, ./peer-api.ts JobTimeSums) */
  jobTimes?: Record<'forward' | 'backward', { count: number; ms: number; msSquared: number; cpuMs?: number }>;
}

export interface PipelineDeps {
  /** the stage held now, or null */
  runner(): StageRunner | null;
  /** true while no job may start (a stage loading, a merge round open) */
  paused(): boolean;
  /** sends a signed frame to a peer; resolves with its receipt, rejects when it is not accepted */
  send(url: string, body: Uint8Array): Promise<PeerAccepted>;
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

/** Passes over the next-stage replicas before an activation is given up, and the wait before the second (then twice that). */
const SEND_ROUNDS = 3;
const SEND_RETRY_MS = 400;

/** A microbatch between its forward and its backward here. */
interface Held {
  attempt: number;
  /** who sent its activation (null at stage 0), where its gradient goes */
  upstream: string | null;
  /** who took its activation (receipted it), where its gradient comes from */
  downstream: string | null;
  /** the replica its activation is being sent to: its gradient may come back before the answer to the send does */
  sendingTo: string | null;
  /**
   * Its backward ran before the answer to its activation's send came (the
   * receiver computed and sent the gradient back first). It stays held until
   * that answer's receipt goes into this hop's forward report: without that
   * report the orchestrator would see the microbatch neither held nor started
   * here, send it again, and the hops' evidence would no longer chain up.
   */
  backwardDone: boolean;
}

export class Pipeline {
  private readonly queue: Job[] = [];
  private readonly held = new Map<number, Held>();
  private nextPeers: readonly Peer[] = [];
  private previousPeers: readonly Peer[] = [];
  private pumping = false;
  /** the last job taken was a backward: the next is a forward if one can start (nextJob) */
  private lastWasBackward = false;
  private stopped = false;
  /** between a job's end and the handling of the I/O that came during it (whenSettled) */
  private settling = false;
  private readonly onSettled: (() => void)[] = [];

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

  /** The neighbouring stages' replicas, from the latest heartbeat reply. */
  setPeers(previous: readonly Peer[], next: readonly Peer[]): void {
    this.previousPeers = previous;
    this.nextPeers = next;
  }

  previousStage(): readonly Peer[] {
    return this.previousPeers;
  }

  nextStage(): readonly Peer[] {
    return this.nextPeers;
  }

  /** Every microbatch (and attempt) held: queued, or between forward and backward. For the heartbeat. */
  heldWork(): { microbatch: number; attempt: number }[] {
    const out = new Map<number, number>();
    for (const j of this.queue) out.set(jobMicrobatch(j), jobAttempt(j));
    for (const [microbatch, h] of this.held) out.set(microbatch, h.attempt);
    return [...out].map(([microbatch, attempt]) => ({ microbatch, attempt }));
  }

  expectsGradient(microbatch: number, attempt: number, sender: string): boolean {
    const h = this.held.get(microbatch);
    return Boolean(h && h.attempt === attempt && !h.backwardDone && (h.downstream === sender || h.sendingTo === sender) && this.deps.runner()?.holds(microbatch));
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

  /** Lets a microbatch go: its queued jobs and its slot (reported dropped when `reason` is given). */
  abandon(microbatch: number, reason?: string): void {
    const runner = this.deps.runner();
    let attempt = this.held.get(microbatch)?.attempt;
    for (let i = this.queue.length - 1; i >= 0; i--) {
      if (jobMicrobatch(this.queue[i]) !== microbatch) continue;
      attempt ??= jobAttempt(this.queue[i]);
      this.queue.splice(i, 1);
    }
    this.held.delete(microbatch);
    // its forward record stays: a spot check of it may still be open
    if (runner?.holds(microbatch)) runner.release(microbatch);
    if (runner && reason && attempt !== undefined) {
      this.deps.report({ runId: runner.runId, microbatch, attempt, stage: runner.assignment.stage, phase: 'dropped', bytesSent: 0, reason });
    }
  }

  /** Forgets every job, held microbatch and forward record (the stage is dropped). */
  clear(): void {
    this.deps.records.clear();
    this.queue.length = 0;
    this.held.clear();
  }

  /** Resolves once no job is running. */
  async idle(): Promise<void> {
    while (this.pumping) await sleep(5);
  }

  stop(): void {
    this.stopped = true;
  }

  /**
   * Runs fn now, or, when a job has just ended, once the I/O that came
   * during it has been handled. Node runs due timers before it polls for
   * I/O, so a heartbeat timer that came due during a job would otherwise go
   * out without the receipts and replies that reached the miner meanwhile,
   * and their reports would wait a whole heartbeat more.
   */
  whenSettled(fn: () => void): void {
    if (this.settling) this.onSettled.push(fn);
    else fn();
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
        const t0 = performance.now();
        const cpu0 = process.cpuUsage();
        let done = false;
        try {
          await this.execute(runner, job);
          done = true;
        } catch (err) {
          const id = jobMicrobatch(job);
          this.deps.log(`microbatch ${id}: ${(err as Error).message}`);
          this.abandon(id, (err as Error).message.slice(0, 200));
        }
        const workMs = performance.now() - t0;
        const sums = done ? this.deps.stats.jobTimes?.[job.kind === 'backward' ? 'backward' : 'forward'] : undefined;
        if (sums) {
          const cpu = process.cpuUsage(cpu0);
          sums.count++;
          sums.ms += workMs;
          sums.msSquared += workMs * workMs;
          sums.cpuMs = (sums.cpuMs ?? 0) + (cpu.user + cpu.system) / 1000;
        }
        await this.settle();
        await this.deps.throttle.rest(workMs);
      }
    } finally {
      this.pumping = false;
    }
  }

  /** Lets the I/O that came during a job in, then runs what waited for it (./miner.ts: a heartbeat), then lets what that sent leave. */
  private async settle(): Promise<void> {
    this.settling = true;
    try {
      // two turns of the event loop: a job that ended in the poll phase (started by a frame's request) has that phase behind it
      await nextTurn();
      await nextTurn();
    } finally {
      this.settling = false;
    }
    const waiting = this.onSettled.splice(0);
    for (const fn of waiting) fn();
    if (waiting.length) await nextTurn();
  }

  /** The next job, one forward one backward (./job-order.ts). */
  private nextJob(): Job | undefined {
    const runner = this.deps.runner();
    if (!runner || this.deps.paused()) return undefined;
    const next = nextJobIndex(this.queue, runner.freeSlotCount > 0, this.lastWasBackward);
    if (next < 0) return undefined;
    const job = this.queue.splice(next, 1)[0];
    this.lastWasBackward = job.kind === 'backward';
    return job;
  }

  private execute(runner: StageRunner, job: Job): Promise<void> {
    if (job.kind === 'backward') return this.backward(runner, job);
    if (runner.assignment.stage === runner.assignment.stageCount - 1) return this.forwardLast(runner, job);
    return this.forward(runner, job);
  }

  /** Throws when the stage was dropped or replaced while a job of `runner` ran (on a GPU, the job awaits its readback). */
  private stillHeld(runner: StageRunner): void {
    if (this.stopped || this.deps.runner() !== runner) throw new Error('the stage was dropped while the microbatch ran');
  }

  /** Last stage: forward to the loss and backward at once; the gradient goes back to the replica the activation came from. */
  private async forwardLast(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): Promise<void> {
    const { records, stats } = this.deps;
    const a = runner.assignment;
    const w = work(runner, job);
    const weights = runner.keepWeights();
    let result: { loss: number; dInput: Float32Array | null };
    try {
      result = await runner.forwardBackwardLast(w.id, w.shard, job.kind === 'forward' ? job.data : null);
      this.stillHeld(runner);
    } catch (err) {
      weights.release();
      throw err;
    }
    const loss = this.deps.tamper?.loss?.(result.loss) ?? result.loss;
    stats.forward++;
    stats.backward++;
    records.add({ meta: w.checkMeta, weights, input: w.input?.frame ?? null, output: null });
    const hop = { runId: a.runId, microbatch: w.id, attempt: w.attempt, stage: a.stage };
    this.deps.report({ ...hop, phase: 'forward', loss, bytesSent: 0, ...(w.input ? { inputSha: w.input.sha } : {}) });
    if (result.dInput && a.stage > 0) this.sendBackward(runner, w.upstream, { ...hop, stage: a.stage - 1 }, result.dInput, null);
    else this.deps.report({ ...hop, phase: 'backward', bytesSent: 0 });
  }

  /** First or middle stage: forward, keep the microbatch in a slot, send the activation on. */
  private async forward(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): Promise<void> {
    const a = runner.assignment;
    const w = work(runner, job);
    const out = job.kind === 'start' ? await runner.forwardFirst(w.id, w.shard) : await runner.forwardMiddle(w.id, job.data);
    this.stillHeld(runner);
    this.deps.stats.forward++;
    this.deps.tamper?.activation?.(out);
    this.held.set(w.id, { attempt: w.attempt, upstream: w.upstream, downstream: null, sendingTo: null, backwardDone: false });
    const body = frame(runner, out, { runId: a.runId, microbatch: w.id, attempt: w.attempt, shard: w.shard, step: w.step, stage: a.stage + 1, ticket: w.ticket });
    const used = runner.keepForwardWeights(w.id)!;
    // the forward ran with weights predicted `predictedSteps` inner steps ahead
    w.checkMeta.samples += used.predictedSteps;
    this.deps.records.add({ meta: w.checkMeta, weights: used.weights, input: w.input?.frame ?? null, output: body });
    this.sendForward(runner, w, body);
  }

  /** A gradient came back: backward, inner step, the input's gradient to the replica the activation came from. */
  private async backward(runner: StageRunner, job: Extract<Job, { kind: 'backward' }>): Promise<void> {
    const a = runner.assignment;
    const id = job.meta.microbatch;
    const dInput = await runner.backward(id, job.data);
    this.stillHeld(runner);
    const h = this.held.get(id);
    // the answer to the activation's send still to come: its forward report waits for the receipt in it
    if (h && h.downstream === null && h.sendingTo !== null) h.backwardDone = true;
    else this.held.delete(id);
    this.deps.stats.backward++;
    const hop = { runId: a.runId, microbatch: id, attempt: job.meta.attempt, stage: a.stage };
    if (dInput && a.stage > 0) this.sendBackward(runner, h?.upstream ?? null, { ...hop, stage: a.stage - 1 }, dInput, job.sha);
    else this.deps.report({ ...hop, phase: 'backward', bytesSent: 0, inputSha: job.sha });
  }

  /**
   * Sends an activation frame to a next-stage replica chosen at random by
   * weight; tries others if one refuses. When all refuse, tries again a
   * heartbeat or two later (SEND_ROUNDS passes in all): a replica that has
   * just taken its stage learns of this one as a neighbour on its own next
   * heartbeat.
   */
  private sendForward(runner: StageRunner, w: Work, body: Uint8Array): void {
    const a = runner.assignment;
    const commit = { outputSha: readFrameHeader(body).header.sha256, ...(w.input ? { inputSha: w.input.sha } : {}) };
    const attempt = async (): Promise<void> => {
      for (let pass = 0; pass < SEND_ROUNDS; pass++) {
        if (pass > 0) await new Promise((r) => setTimeout(r, SEND_RETRY_MS * pass));
        const h = this.held.get(w.id);
        if (!h || h.attempt !== w.attempt) return; // let go meanwhile
        const candidates = [...this.nextPeers];
        while (candidates.length) {
          const peer = pickWeighted(candidates);
          candidates.splice(candidates.indexOf(peer), 1);
          try {
            const sending = this.held.get(w.id);
            if (sending) sending.sendingTo = peer.id;
            const { receipt } = await this.deps.send(`${peer.url}/forward`, body);
            const held = this.held.get(w.id);
            if (!held || held.attempt !== w.attempt) return; // let go meanwhile
            held.downstream = peer.id;
            this.deps.stats.bytesSent += body.length;
            this.deps.report({ runId: a.runId, microbatch: w.id, attempt: w.attempt, stage: a.stage, phase: 'forward', next: peer.id, receipt, bytesSent: body.length, ...commit });
            if (held.backwardDone) this.held.delete(w.id);
            return;
          } catch (err) {
            this.deps.log(`forward of microbatch ${w.id} to ${peer.url} failed: ${(err as Error).message}`);
            // its gradient came back, yet the send's answer (and the receipt in it) was lost: nothing to report the forward with
            if (this.held.get(w.id)?.backwardDone) return this.abandon(w.id, 'the answer to the activation was lost after its gradient came back');
          }
        }
      }
      this.abandon(w.id, 'no next-stage replica accepted the activation');
    };
    this.deps.track(attempt());
  }

  /**
   * Sends a gradient frame to the replica the activation came from, in the
   * background, then reports this hop's backward with its receipt (or drops
   * the microbatch when it cannot be handed back).
   */
  private sendBackward(runner: StageRunner, upstream: string | null, meta: BackwardMeta, grad: Float32Array, inputSha: string | null): void {
    const hop = { runId: meta.runId, microbatch: meta.microbatch, attempt: meta.attempt, stage: runner.assignment.stage };
    const dropped = (reason: string): void => this.deps.report({ ...hop, phase: 'dropped', bytesSent: 0, reason });
    const to = this.previousPeers.find((p) => p.id === upstream);
    if (!to) return dropped('the replica the activation came from is no longer a previous-stage replica');
    const body = frame(runner, grad, meta);
    const outputSha = readFrameHeader(body).header.sha256;
    this.deps.track(
      this.deps.send(`${to.url}/backward`, body).then(
        ({ receipt }) => {
          this.deps.stats.bytesSent += body.length;
          this.deps.report({ ...hop, phase: 'backward', next: to.id, receipt, bytesSent: body.length, outputSha, ...(inputSha ? { inputSha } : {}) });
        },
        (err) => {
          this.deps.log(`gradient of microbatch ${meta.microbatch} to ${to.url} failed: ${(err as Error).message}`);
          dropped(`the gradient was not accepted: ${(err as Error).message.slice(0, 150)}`);
        },
      ),
    );
  }
}

/** What a forward job is about. */
interface Work {
  id: number;
  attempt: number;
  shard: number;
  step: number;
  ticket: string;
  /** who sent the activation (null at stage 0) */
  upstream: string | null;
  input: { frame: Uint8Array; sha: string } | null;
  checkMeta: CheckMeta;
}

function work(runner: StageRunner, job: Exclude<Job, { kind: 'backward' }>): Work {
  const a = runner.assignment;
  const t = job.kind === 'start' ? { ...job.task, microbatch: job.task.id } : job.meta;
  return {
    id: t.microbatch,
    attempt: t.attempt,
    shard: t.shard,
    step: t.step,
    ticket: t.ticket,
    upstream: job.kind === 'forward' ? job.sender : null,
    input: job.kind === 'forward' ? { frame: job.frame, sha: job.sha } : null,
    checkMeta: { runId: a.runId, microbatch: t.microbatch, stage: a.stage, round: runner.round, samples: runner.samples, shard: t.shard },
  };
}

function jobMicrobatch(job: Job): number {
  return job.kind === 'start' ? job.task.id : job.meta.microbatch;
}

function jobAttempt(job: Job): number {
  return job.kind === 'start' ? job.task.attempt : job.meta.attempt;
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

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Resolves on the event loop's next check phase: the timers and I/O due before it have run. */
function nextTurn(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}
