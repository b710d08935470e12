// A miner: joins the orchestrator with its key and measured hardware, holds the
// stage it is assigned, runs forward and backward work for microbatches that
// flow through it (activations from the previous stage's miners, gradients
// from the next), steps its inner optimizer, and does its share of each merge
// round. Heartbeats carry its reports and bring its instructions; it keeps
// each recent forward (weights, input, output) until the heartbeat that
// reported it is answered, so that it can prove it in a spot check.
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { Engine } from '../engine/engine.ts';
import { decodePartitionFrame, decodePartitionFrames } from '../merge/pseudo-gradient.ts';
import type { Partition } from '../merge/partition.ts';
import { AuthError, NimbleError } from '../protocol/errors.ts';
import { encodeCheckBundle } from '../protocol/check-bundle.ts';
import { decodeFrame, encodeFrame, readFrameHeader } from '../protocol/frame.ts';
import {
  BackwardMeta,
  ForwardMeta,
  HeartbeatReply,
  JoinReply,
  parse,
  type HeartbeatRequest,
  type MergeTask,
  type MicrobatchTask,
  type Peer,
  type StageAssignment,
  type WorkReport,
} from '../protocol/messages.ts';
import { RequestVerifier } from '../protocol/signing.ts';
import { HttpError, SignedClient } from './client.ts';
import { ForwardRecords } from './forward-records.ts';
import { measureHardware } from './hardware.ts';
import { loadOrCreateIdentity } from './identity.ts';
import { StageRunner } from './stage-runner.ts';
import { Throttle } from './throttle.ts';

export interface MinerOptions {
  orchestrator: string;
  dataDir: string;
  name?: string;
  threads?: number;
  throttle?: number;
  host?: string;
  port?: number;
  /** microbatches in flight (activation slots) */
  slots?: number;
  /** wait this long before merging partitions: lets failure tests kill a merger mid-round */
  mergeDelayMs?: number;
  log?: (line: string) => void;
  /** sign with this key (a wallet's) instead of <dataDir>/miner-key.json */
  privateKey?: `0x${string}`;
  /**
   * Fault injection for tests: a dishonest miner that changes each activation
   * before it sends it, or the loss it reports. Not exposed on the command line.
   */
  tamper?: { activation?: (activation: Float32Array) => void; loss?: (loss: number) => number };
}

type Job =
  | { kind: 'start'; task: MicrobatchTask }
  | { kind: 'forward'; meta: ForwardMeta; data: Float32Array; frame: Uint8Array; sha: string }
  | { kind: 'backward'; meta: BackwardMeta; data: Float32Array };

/** A microbatch held longer than this is let go (its gradient is not coming). */
const SLOT_TIMEOUT_MS = 60_000;
const MAX_QUEUE = 64;
const MAX_PEER_FRAME_BYTES = 64 << 20;

export class Miner {
  readonly address: string;
  url = '';
  private readonly client: SignedClient;
  private readonly verifier = new RequestVerifier();
  private readonly throttle: Throttle;
  private readonly app: FastifyInstance;
  private runner: StageRunner | null = null;
  private loading: Promise<void> | null = null;
  private readonly queue: Job[] = [];
  private readonly routes = new Map<number, { id: string; url: string }[]>();
  private peers: Peer[] = [];
  private reports: WorkReport[] = [];
  /** peer requests refused, by verified sender, for the next heartbeat */
  private rejected: { sender: string; reason: string }[] = [];
  private pumping = false;
  private stopped = false;
  private heartbeatMs = 250;
  private timer: NodeJS.Timeout | null = null;
  private merging: Promise<void> | null = null;
  private mergeTask: MergeTask | null = null;
  private readonly mergedParts = new Set<string>();
  private uploadedRound = 0;
  private savedRound = 0;
  private readonly sends = new Set<Promise<unknown>>();
  private readonly records = new ForwardRecords();
  private readonly log: (line: string) => void;
  /** counters for the CLI and tests */
  readonly stats = { forward: 0, backward: 0, merges: 0, bytesSent: 0, rejected: 0 };

  private constructor(
    private readonly options: MinerOptions,
    private readonly engine: Engine,
    privateKey: `0x${string}`,
    throttle: Throttle,
  ) {
    this.client = new SignedClient(options.orchestrator, privateKey);
    this.address = this.client.address;
    this.throttle = throttle;
    this.log = options.log ?? (() => {});
    this.app = this.buildPeerApi();
  }

  static async start(options: MinerOptions): Promise<Miner> {
    const throttle = new Throttle(options.throttle ?? 1); // a bad share throws before any thread starts
    const privateKey = options.privateKey ?? loadOrCreateIdentity(options.dataDir).privateKey;
    const engine = await Engine.create({ threads: options.threads });
    const miner = new Miner(options, engine, privateKey, throttle);
    try {
      await miner.app.listen({ host: options.host ?? '127.0.0.1', port: options.port ?? 0 });
      const addr = miner.app.server.address() as AddressInfo;
      const host = options.host && options.host !== '0.0.0.0' ? options.host : '127.0.0.1';
      miner.url = `http://${host}:${addr.port}`;
      await miner.join();
    } catch (err) {
      await miner.stop();
      throw err;
    }
    miner.schedule(0);
    return miner;
  }

  get stageInfo(): { runId: string; stage: number; round: number } | null {
    return this.runner ? { runId: this.runner.runId, stage: this.runner.assignment.stage, round: this.runner.round } : null;
  }

  private async join(): Promise<void> {
    const hardware = measureHardware(this.engine, this.throttle);
    const probe = randomBytes(1 << 20);
    let bandwidthMbps: number;
    for (let attempt = 0; ; attempt++) {
      try {
        const t0 = performance.now();
        await this.client.request('POST', '/bandwidth', probe);
        bandwidthMbps = (probe.length * 8) / ((performance.now() - t0) * 1000);
        break;
      } catch (err) {
        if (attempt >= 40 || this.stopped) throw new Error(`cannot reach the orchestrator at ${this.options.orchestrator}: ${(err as Error).message}`, { cause: err });
        await sleep(Math.min(2000, 100 * 2 ** attempt));
      }
    }
    const reply = await this.client.postJson(
      '/miners/join',
      { name: this.options.name ?? `miner-${this.address.slice(2, 8)}`, url: this.url, hardware, bandwidthMbps },
      JoinReply,
      'join reply',
    );
    this.heartbeatMs = reply.heartbeatMs;
    this.log(`joined as ${this.address}: ${hardware.gflops.toFixed(1)} GFLOP/s, ${hardware.threads} threads, ${bandwidthMbps.toFixed(0)} Mbit/s to the orchestrator`);
  }

  // ---- heartbeats --------------------------------------------------------------

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.heartbeat(), ms);
  }

  private async heartbeat(): Promise<void> {
    const runner = this.runner;
    const reports = this.reports;
    this.reports = [];
    const rejected = this.rejected.splice(0, 1024);
    const req: HeartbeatRequest = {
      rejected,
      // ask for a slot's worth more than is free, so a new microbatch is at hand when a slot frees
      freeSlots: runner && !this.mergeOpen() ? runner.freeSlotCount + runner.stage.slotCount - this.queue.filter((j) => j.kind === 'start').length : 0,
      queue: this.queue.length,
      reports: reports.slice(0, 4096),
      ...(runner ? { runId: runner.runId, stage: runner.assignment.stage, round: runner.round, uploadedRound: this.uploadedRound } : {}),
    };
    req.freeSlots = Math.max(0, req.freeSlots);
    this.reports.unshift(...reports.slice(4096));
    let reply: HeartbeatReply;
    try {
      reply = await this.client.postJson('/miners/heartbeat', req, HeartbeatReply, 'heartbeat reply');
      this.answerChecks(req.reports, reply.checks);
    } catch (err) {
      this.reports.unshift(...req.reports);
      this.rejected.unshift(...rejected);
      if (err instanceof HttpError && err.status === 404) await this.join().catch(() => {});
      else if (err instanceof HttpError && err.status === 403) {
        // refused (too little stake): stop working, try to join again now and then
        this.log(`refused by the orchestrator: ${err.message}`);
        this.dropStage();
        this.reports = [];
        await this.join().catch(() => {});
        this.schedule(5000);
        return;
      } else this.log(`heartbeat failed: ${(err as Error).message}`);
      this.schedule(Math.max(500, this.heartbeatMs * 2));
      return;
    }
    try {
      await this.follow(reply);
    } catch (err) {
      this.log(`heartbeat handling failed: ${(err as Error).message}`);
    }
    this.schedule(this.heartbeatMs);
  }

  private async follow(reply: HeartbeatReply): Promise<void> {
    await this.hold(reply.assignment);
    const runner = this.runner;
    for (const id of reply.abandon) this.abandon(id);
    if (!runner) return;
    for (const id of runner.heldLongerThan(SLOT_TIMEOUT_MS, Date.now())) this.abandon(id, 'no gradient came back');
    this.peers = reply.nextStage;
    for (const task of reply.microbatches) this.queue.push({ kind: 'start', task });
    this.mergeTask = reply.merge;
    if (reply.merge && !this.merging) {
      this.merging = this.doMerge(runner, reply.merge)
        .catch((err) => this.log(`merge round ${reply.merge!.round} failed: ${(err as Error).message}`))
        .finally(() => (this.merging = null));
    }
    void this.pump();
  }

  /** Takes on, keeps, reloads or drops the assigned stage. */
  private async hold(a: StageAssignment | null): Promise<void> {
    if (this.loading) return this.loading;
    const current = this.runner;
    if (!a) {
      if (current) this.dropStage();
      return;
    }
    const same = current && current.runId === a.runId && current.assignment.stage === a.stage && current.assignment.from === a.from && current.assignment.to === a.to;
    const stale = same && current.round < a.round && !this.mergeOpen();
    if (same && !stale) return;
    this.loading = (async () => {
      if (!same) {
        this.dropStage();
        this.runner = new StageRunner(this.engine, a, inFlightLimit(a, this.options.slots ?? 3));
        this.uploadedRound = a.round;
        this.savedRound = a.round;
        this.log(`holding stage ${a.stage} [${a.from}, ${a.to}) of ${a.runId}`);
      }
      if (a.stateBlob) {
        const bytes = await this.client.request('GET', `/blobs/${a.stateBlob}`);
        this.runner!.loadState(bytes, a.round);
        this.uploadedRound = a.round;
        this.savedRound = a.round;
        this.log(`loaded the merged state of round ${a.round}`);
      }
    })().finally(() => (this.loading = null));
    return this.loading;
  }

  /** Uploads the records the orchestrator asked to check; lets the other reported forwards go. */
  private answerChecks(reports: readonly WorkReport[], checks: readonly number[]): void {
    const asked = new Set(checks);
    for (const r of reports) if (r.phase === 'forward' && !asked.has(r.microbatch)) this.records.drop(r.microbatch);
    for (const id of asked) {
      const bundle = this.records.take(id);
      if (!bundle) {
        this.log(`spot check of microbatch ${id}: no longer kept`);
        continue;
      }
      const body = encodeCheckBundle(bundle);
      this.track(
        this.client.request('POST', `/runs/${bundle.meta.runId}/checks/${id}`, body).then(
          () => void (this.stats.bytesSent += body.length),
          (err) => this.log(`spot check of microbatch ${id}: ${(err as Error).message}`),
        ),
      );
    }
  }

  private dropStage(): void {
    this.records.clear();
    this.queue.length = 0;
    this.routes.clear();
    this.runner?.dispose();
    this.runner = null;
  }

  private abandon(microbatch: number, reason?: string): void {
    const runner = this.runner;
    for (let i = this.queue.length - 1; i >= 0; i--) {
      const j = this.queue[i];
      const id = j.kind === 'start' ? j.task.id : j.meta.microbatch;
      if (id === microbatch) this.queue.splice(i, 1);
    }
    if (runner?.holds(microbatch)) {
      runner.release(microbatch);
      if (reason) this.report({ runId: runner.runId, microbatch, stage: runner.assignment.stage, phase: 'dropped', bytesSent: 0, reason });
    }
    this.routes.delete(microbatch);
  }

  private report(r: WorkReport): void {
    this.reports.push(r);
  }

  /** A merge round this replica has not applied yet is open: training pauses. */
  private mergeOpen(): boolean {
    return Boolean(this.runner && this.mergeTask && this.mergeTask.round > this.runner.round);
  }

  // ---- training work -------------------------------------------------------------

  private nextJob(): Job | undefined {
    const runner = this.runner;
    if (!runner || this.loading || this.mergeOpen()) return undefined;
    const b = this.queue.findIndex((j) => j.kind === 'backward');
    if (b >= 0) return this.queue.splice(b, 1)[0];
    if (runner.freeSlotCount === 0) return undefined;
    return this.queue.shift();
  }

  private async pump(): Promise<void> {
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (;;) {
        if (this.stopped) return;
        const job = this.nextJob();
        if (!job) return;
        const runner = this.runner!;
        try {
          await this.throttle.run(() => this.execute(runner, job));
        } catch (err) {
          const id = job.kind === 'start' ? job.task.id : job.meta.microbatch;
          this.log(`microbatch ${id}: ${(err as Error).message}`);
          runner.release(id);
          this.report({ runId: runner.runId, microbatch: id, stage: runner.assignment.stage, phase: 'dropped', bytesSent: 0, reason: (err as Error).message.slice(0, 200) });
        }
        await new Promise((r) => setImmediate(r)); // let I/O in
      }
    } finally {
      this.pumping = false;
    }
  }

  private execute(runner: StageRunner, job: Job): void {
    const a = runner.assignment;
    const last = a.stage === a.stageCount - 1;
    const me = { id: this.address, url: this.url };
    if (job.kind === 'start' || job.kind === 'forward') {
      const id = job.kind === 'start' ? job.task.id : job.meta.microbatch;
      const shard = job.kind === 'start' ? job.task.shard : job.meta.shard;
      const step = job.kind === 'start' ? job.task.step : job.meta.step;
      const route = job.kind === 'start' ? [] : job.meta.route;
      const input = job.kind === 'forward' ? { frame: job.frame, sha: job.sha } : null;
      const checkMeta = { runId: a.runId, microbatch: id, stage: a.stage, round: runner.round, samples: runner.samples, shard };
      if (last) {
        const weights = this.records.snapshot(runner.stage.params.flat.data);
        let result: { loss: number; dInput: Float32Array | null };
        try {
          result = runner.forwardBackwardLast(id, shard, job.kind === 'forward' ? job.data : null);
        } catch (err) {
          this.records.recycle(weights);
          throw err;
        }
        const loss = this.options.tamper?.loss?.(result.loss) ?? result.loss;
        this.stats.forward++;
        this.stats.backward++;
        this.records.add({ meta: checkMeta, weights, input: input?.frame ?? null, output: null });
        let bytes = 0;
        if (result.dInput && a.stage > 0) bytes = this.sendBackward(runner, route[a.stage - 1], { runId: a.runId, microbatch: id, stage: a.stage - 1 }, result.dInput);
        this.report({ runId: a.runId, microbatch: id, stage: a.stage, phase: 'forward', loss, bytesSent: 0, ...(input ? { inputSha: input.sha } : {}) });
        this.report({ runId: a.runId, microbatch: id, stage: a.stage, phase: 'backward', bytesSent: bytes });
        return;
      }
      const out = job.kind === 'start' ? runner.forwardFirst(id, shard) : runner.forwardMiddle(id, job.data);
      this.stats.forward++;
      this.options.tamper?.activation?.(out);
      const fullRoute = [...route, me];
      this.routes.set(id, fullRoute);
      const body = this.frame(runner, out, { runId: a.runId, microbatch: id, shard, step, stage: a.stage + 1, route: fullRoute });
      const used = runner.forwardWeights(id)!;
      // the forward ran with weights predicted `predictedSteps` inner steps ahead
      checkMeta.samples += used.predictedSteps;
      this.records.add({ meta: checkMeta, weights: this.records.snapshot(used.weights), input: input?.frame ?? null, output: body });
      this.sendForward(runner, id, body, { outputSha: readFrameHeader(body).header.sha256, ...(input ? { inputSha: input.sha } : {}) });
      return;
    }
    const id = job.meta.microbatch;
    const dInput = runner.backward(id, job.data);
    this.stats.backward++;
    const route = this.routes.get(id) ?? [];
    this.routes.delete(id);
    let bytes = 0;
    if (dInput && a.stage > 0) bytes = this.sendBackward(runner, route[a.stage - 1], { runId: a.runId, microbatch: id, stage: a.stage - 1 }, dInput);
    this.report({ runId: a.runId, microbatch: id, stage: a.stage, phase: 'backward', bytesSent: bytes });
  }

  private frame(runner: StageRunner, data: Float32Array, meta: ForwardMeta | BackwardMeta): Uint8Array {
    const C = runner.stage.config.channels;
    return encodeFrame(data, [data.length / C, C], runner.assignment.codec, meta);
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
          await this.client.request('POST', `${peer.url}/forward`, body);
          this.stats.bytesSent += body.length;
          this.report({ runId: a.runId, microbatch, stage: a.stage, phase: 'forward', next: peer.id, bytesSent: body.length, ...commit });
          return;
        } catch (err) {
          this.log(`forward of microbatch ${microbatch} to ${peer.url} failed: ${(err as Error).message}`);
        }
      }
      this.records.drop(microbatch);
      this.abandon(microbatch, 'no next-stage replica accepted the activation');
    };
    this.track(attempt());
  }

  private sendBackward(runner: StageRunner, to: { id: string; url: string } | undefined, meta: BackwardMeta, grad: Float32Array): number {
    if (!to) return 0;
    const body = this.frame(runner, grad, meta);
    this.track(
      this.client.request('POST', `${to.url}/backward`, body).then(
        () => void (this.stats.bytesSent += body.length),
        (err) => this.log(`gradient of microbatch ${meta.microbatch} to ${to.url} failed: ${(err as Error).message}`),
      ),
    );
    return body.length;
  }

  private track(p: Promise<unknown>): void {
    this.sends.add(p);
    void p.finally(() => this.sends.delete(p));
  }

  // ---- the peer API -------------------------------------------------------------

  private buildPeerApi(): FastifyInstance {
    const app = Fastify({ logger: false, bodyLimit: MAX_PEER_FRAME_BYTES });
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: MAX_PEER_FRAME_BYTES }, (_req, body, done) => done(null, body));
    app.setErrorHandler((err: Error & { statusCode?: number }, req: FastifyRequest, reply: FastifyReply) => {
      let status = 500;
      if (err instanceof AuthError) status = 401;
      else if (err instanceof NimbleError) status = err.status;
      else if (err instanceof PeerError) status = err.status;
      else if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500) status = err.statusCode;
      if (status < 500) {
        this.stats.rejected++;
        const sender = (req as FastifyRequest & { sender?: string }).sender;
        if (sender && this.rejected.length < 1024) this.rejected.push({ sender, reason: err.message.slice(0, 256) });
      } else this.log(`peer request failed: ${err.message}`);
      reply.status(status).send({ error: status >= 500 ? 'internal error' : err.message });
    });
    const receive = async (req: FastifyRequest, kind: 'forward' | 'backward'): Promise<{ queued: number }> => {
      const body = Buffer.isBuffer(req.body) ? new Uint8Array(req.body.buffer, req.body.byteOffset, req.body.byteLength) : new Uint8Array(0);
      (req as FastifyRequest & { sender?: string }).sender = await this.verifier.verify({ method: req.method, path: req.url, headers: req.headers, body });
      const runner = this.runner;
      if (!runner) throw new PeerError(409, 'this miner holds no stage');
      const { batchSize } = runner.assignment;
      const { contextLength: T, channels: C } = runner.stage.config;
      const frame = decodeFrame(body, { shape: [batchSize * T, C], codecs: ['f32', 'f16', 'int8-row'], maxBytes: MAX_PEER_FRAME_BYTES });
      if (this.queue.length >= MAX_QUEUE) throw new PeerError(503, 'queue full; try another replica');
      if (kind === 'forward') {
        const meta = parse(ForwardMeta, frame.meta, 'forward meta');
        if (meta.runId !== runner.runId || meta.stage !== runner.assignment.stage || meta.stage === 0) {
          throw new PeerError(409, `work for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${runner.assignment.stage} of ${runner.runId}`);
        }
        if (meta.route.length !== meta.stage) throw new PeerError(400, `route has ${meta.route.length} hops for stage ${meta.stage}`);
        this.queue.push({ kind: 'forward', meta, data: frame.data, frame: body, sha: readFrameHeader(body).header.sha256 });
      } else {
        const meta = parse(BackwardMeta, frame.meta, 'backward meta');
        if (meta.runId !== runner.runId || meta.stage !== runner.assignment.stage) {
          throw new PeerError(409, `gradient for run ${meta.runId} stage ${meta.stage}; this miner holds stage ${runner.assignment.stage} of ${runner.runId}`);
        }
        if (!runner.holds(meta.microbatch)) throw new PeerError(409, `microbatch ${meta.microbatch} is not held here (abandoned or unknown)`);
        this.queue.push({ kind: 'backward', meta, data: frame.data });
      }
      void this.pump();
      return { queued: this.queue.length };
    };
    app.post('/forward', async (req, reply) => {
      reply.status(202);
      return receive(req, 'forward');
    });
    app.post('/backward', async (req, reply) => {
      reply.status(202);
      return receive(req, 'backward');
    });
    app.get('/health', async () => ({ ok: true, address: this.address, stage: this.stageInfo, stats: this.stats }));
    return app;
  }

  // ---- merging -------------------------------------------------------------------

  private async doMerge(runner: StageRunner, task: MergeTask): Promise<void> {
    const partitions: Partition[] = task.partitions.map((p) => ({ index: p.index, start: p.start, end: p.end }));
    const base = `/runs/${runner.runId}/stages/${runner.assignment.stage}/rounds/${task.round}`;
    if (task.round <= runner.round) {
      // applied already; maybe still asked to save the state
      if (task.saveState && this.savedRound < task.round && runner.round === task.round) await this.saveState(runner, base, task.round);
      return;
    }
    // wait for in-flight work to finish before taking the pseudo-gradient
    while (this.pumping) await sleep(5);
    if (task.upload && this.uploadedRound < task.round) {
      const frames = runner.pseudoGradientFrames(partitions, task.round);
      for (let p = 0; p < frames.length; p++) {
        await this.client.request('POST', `${base}/pseudo-gradients/${p}?samples=${runner.samples}`, frames[p]);
        this.stats.bytesSent += frames[p].length;
      }
      this.uploadedRound = task.round;
    }
    if (task.merge.length && this.options.mergeDelayMs) await sleep(this.options.mergeDelayMs);
    for (const m of task.merge) {
      if (this.stopped) return;
      const key = `${runner.runId}/${task.round}/${m.partition}`;
      if (this.mergedParts.has(key)) continue;
      const part = partitions[m.partition];
      const inputs = [...m.inputs].sort((x, y) => (x.minerId < y.minerId ? -1 : 1));
      const slices: Float32Array[] = [];
      for (const input of inputs) slices.push(decodePartitionFrame(await this.client.request('GET', `/blobs/${input.blob}`), part));
      const weights = inputs.map((i) => i.samples);
      const frame = runner.mergePartition(slices, weights.some((w) => w > 0) ? weights : weights.map(() => 1), part, task.aggregator, task.round);
      await this.client.request('POST', `${base}/merged/${m.partition}`, frame);
      this.stats.bytesSent += frame.length;
      this.stats.merges++;
      this.mergedParts.add(key);
    }
    if (task.apply) {
      let delta: Float32Array | null = null;
      if (partitions.length) {
        const frames: Uint8Array[] = [];
        for (const a of [...task.apply].sort((x, y) => x.partition - y.partition)) frames.push(await this.client.request('GET', `/blobs/${a.blob}`));
        delta = decodePartitionFrames(frames, partitions, undefined, { codecs: ['int8-block', 'f16', 'f32'] });
      }
      runner.applyMerged(delta, task.round, task.outerLr, task.outerMomentum);
      this.log(`applied merge round ${task.round}`);
      if (task.saveState) await this.saveState(runner, base, task.round);
    }
  }

  private async saveState(runner: StageRunner, base: string, round: number): Promise<void> {
    const bytes = runner.encodeState(round);
    await this.client.request('POST', `${base}/state`, bytes);
    this.stats.bytesSent += bytes.length;
    this.savedRound = round;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.app.close().catch(() => {});
    await Promise.allSettled([...this.sends]);
    await this.merging?.catch(() => {});
    this.runner?.dispose();
    this.runner = null;
    await this.engine.close();
  }
}

class PeerError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Microbatches a stage keeps in flight: the miner's slots, but at most one
 * more than the stages from here to the end (1F1B's S − stage, plus one so
 * that network latency does not stall the pipeline). More would only add
 * gradient delay, since a stage's backward for a microbatch waits for every
 * later stage.
 */
export function inFlightLimit(a: Pick<StageAssignment, 'stage' | 'stageCount'>, slots: number): number {
  return Math.max(1, Math.min(slots, a.stageCount - a.stage + 1));
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
