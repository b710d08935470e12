// A miner: joins the orchestrator with its key and measured hardware, holds the
// stage it is assigned, runs forward and backward work for microbatches that
// flow through it (activations from the previous stage's miners, gradients
// from the next), steps its inner optimizer, and does its share of each merge
// round. Heartbeats carry its reports and bring its instructions; it keeps
// each recent forward (weights, input, output) until the heartbeat that
// reported it is answered, so that it can prove it in a spot check. A miner
// that serves inference may instead be given a stage of a deployed model,
// which it downloads, checks and loads (deployment.ts). It may be given the
// URLs of several orchestrators of one network: every call to them moves to
// the next when the one it talks to stops answering (src/http/failover.ts).
//
// This file is the lifecycle: start and stop, join, the heartbeat loop and
// following its reply. The work is done by
//   pipeline.ts      the job queue, forward/backward execution, sends to peers
//   peer-api.ts      the HTTP API peers send activations and gradients to
//   merge-round.ts   the miner's half of a merge round
//   spot-checks.ts   answers to spot checks (from forward-records.ts)
//   stage-runner.ts  the stage itself (engine side)
//   deployment.ts    a deployed model's stage, served for inference
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { Address } from 'viem';
import { Engine, type Backend, type BackendChoice, type SimdChoice } from '../engine/engine.ts';
import { OrchestratorClient } from '../api/client.ts';
import { SignedClient } from '../http/client.ts';
import { Failover } from '../http/failover.ts';
import type { HttpServer } from '../http/server.ts';
import { loadOrCreateKeyFile } from '../chain/key-file.ts';
import { NimbleError } from '../protocol/errors.ts';
import { HeartbeatReply, JoinReply, PeerAccepted, type HeartbeatRequest, type MergeTask, type ServeSetting, type StageAssignment, type WorkReport } from '../protocol/messages.ts';
import { SessionKey } from '../protocol/session-key.ts';
import { RequestSigner, RequestVerifier } from '../protocol/signing.ts';
import { blobFetch, DatasetCache, needsDataset } from './datasets.ts';
import { DeploymentServing } from './deployment.ts';
import type { RegistryLookup } from '../inference/verify.ts';
import { learnedRegistryLookup } from './chain.ts';
import { ForwardRecords } from './forward-records.ts';
import { measureHardware } from './hardware.ts';
import { httpMergeTransport, MergeRounds } from './merge-round.ts';
import { findNetwork, type Network } from '../api/network.ts';
import { buildPeerApi, type MinerStats } from './peer-api.ts';
import { serveRoutes, SESSION_IDLE_MS } from './serve-api.ts';
import { orchestratorAddress } from '../protocol/network.ts';
import { Pipeline } from './pipeline.ts';
import { CheckAnswers } from './spot-checks.ts';
import { stageDataReady } from './create-stage-trainer.ts';
import { inFlightLimit, StageRunner } from './stage-runner.ts';
import { tamperedServing, type Tamper } from './tamper.ts';
import { Throttle } from './throttle.ts';

/** Live nonces the orchestrator may hold at a miner: 1,000 serving calls a second over the 30 s replay window (a peer holds 3,000). */
export const ORCHESTRATOR_NONCES = 30_000;

export interface MinerOptions {
  /** the orchestrator's URL, or the URLs of the orchestrators of one network (it moves between them: src/http/failover.ts) */
  orchestrator: string | readonly string[];
  dataDir: string;
  name?: string;
  threads?: number;
  throttle?: number;
  host?: string;
  port?: number;
  /** microbatches in flight (activation slots) */
  slots?: number;
  /** the memory offered to the planner, at most the free memory (`--memory`; default: the free memory) */
  memoryBytes?: number;
  /** the GPU's memory, which WebGPU does not report (`--gpu-memory`; with the webgpu backend, the offer is at most this) */
  gpuMemoryBytes?: number;
  /** wait this long before merging partitions: lets failure tests kill a merger mid-round */
  mergeDelayMs?: number;
  log?: (line: string) => void;
  /** sign with this key (a wallet's) instead of <dataDir>/miner-key.json */
  privateKey?: `0x${string}`;
  /** fault injection for tests and benchmarks (tamper.ts); not exposed on the command line */
  tamper?: Tamper;
  /** what it offers: serve deployed models, train, or both (default both) */
  serve?: ServeSetting;
  /** where its GPT stages run (`--backend`; default wasm): src/engine/engine.ts */
  backend?: BackendChoice;
  /** which WASM kernel build it runs (`--simd`; default auto: relaxed SIMD when the runtime has it): src/engine/engine.ts */
  simd?: SimdChoice;
  /**
   * the ModelRegistry to check deployed models' weights against (null: none, so a paid network's are refused);
   * absent: the one of the chain the orchestrator names, checked on `chain.rpcUrl` or the orchestrator's RPC (./chain.ts)
   */
  registryLookup?: RegistryLookup | null;
  /** where the chain the orchestrator names is checked: --chain-rpc, and the data dir whose deployment.json must agree (default: options.dataDir) */
  chain?: { rpcUrl?: string; dataDir?: string };
}

/** A microbatch held longer than this is let go (its gradient is not coming). */
const SLOT_TIMEOUT_MS = 60_000;
/** Bandwidth probes at join; the fastest is the figure (./miner.ts probeBandwidth). */
const PROBES = 3;

/** Reports one heartbeat carries at most (the rest wait for the next). */
const MAX_REPORTS = 4096;

export class Miner {
  readonly address: string;
  url = '';
  /** counters for the CLI and tests */
  readonly stats: MinerStats = {
    forward: 0,
    backward: 0,
    merges: 0,
    bytesSent: 0,
    rejected: 0,
    jobTimes: { forward: { count: 0, ms: 0, msSquared: 0, cpuMs: 0 }, backward: { count: 0, ms: 0, msSquared: 0, cpuMs: 0 } },
  };
  /** signs with the wallet key: the bandwidth probe and joining */
  private readonly wallet: SignedClient;
  /** signs with the session key the join binds: everything after */
  private readonly client: SignedClient;
  private readonly sessionKey = SessionKey.generate();
  private readonly app: HttpServer;
  private readonly pipeline: Pipeline;
  private readonly merges: MergeRounds;
  private readonly records = new ForwardRecords();
  private readonly checks: CheckAnswers;
  /** uploaded datasets an edge stage trains on, downloaded once into <dataDir>/datasets */
  private readonly datasets: DatasetCache;
  private runner: StageRunner | null = null;
  /** the deployment stage it serves, if any */
  readonly serving: DeploymentServing;
  private loading: Promise<void> | null = null;
  private reports: WorkReport[] = [];
  private mergeTask: MergeTask | null = null;
  private stopped = false;
  private heartbeatMs = 250;
  private timer: NodeJS.Timeout | null = null;
  /** background sends (activations, gradients, check bundles), awaited on stop */
  private readonly sends = new Set<Promise<unknown>>();
  private readonly log: (line: string) => void;
  /** says which chain deployed models are checked on, once joined (none: the lookup was given, or it trains only) */
  private readonly checkChain: () => Promise<void> = async () => {};

  private constructor(
    private readonly options: MinerOptions,
    private readonly engine: Engine,
    privateKey: `0x${string}`,
    private readonly throttle: Throttle,
    network: Network,
    /** the orchestrator URLs, shared by every client of the orchestrator so that they move together */
    private readonly orchestrators: Failover,
  ) {
    const { domain } = network;
    this.wallet = new SignedClient(orchestrators, new RequestSigner(privateKey, { domain }));
    this.address = this.wallet.address;
    this.client = new SignedClient(orchestrators, new RequestSigner({ session: this.sessionKey, address: this.address as Address }, { domain }));
    this.log = options.log ?? (() => {});
    this.datasets = new DatasetCache(join(options.dataDir, 'datasets'), blobFetch(this.client), this.log);
    const api = new OrchestratorClient(orchestrators, { network });
    let lookup = options.registryLookup;
    if (lookup === undefined && options.serve !== 'training') {
      const learned = learnedRegistryLookup({ api, rpcUrl: options.chain?.rpcUrl, dataDir: options.chain?.dataDir ?? options.dataDir, log: this.log });
      lookup = learned.lookup;
      this.checkChain = learned.check;
    }
    this.serving = new DeploymentServing({
      engine,
      dir: join(options.dataDir, 'models'),
      address: this.address,
      // signed: the file of a model not (yet) published is read only by the miners serving it (src/orchestrator/blobs/access.ts)
      open: (sha256, offset, signal) => this.client.open(`/models/${encodeURIComponent(sha256)}/file`, offset > 0 ? { range: `bytes=${offset}-` } : {}, signal),
      lookup: lookup ?? null,
      log: this.log,
    });
    this.checks = new CheckAnswers(this.records, (runId, id, body) => this.client.request('POST', `/runs/${runId}/checks/${id}`, body), this.log);
    this.pipeline = new Pipeline({
      runner: () => this.runner,
      paused: () => Boolean(this.loading) || this.mergeOpen(),
      send: (url, body) => this.client.postBytes(url, body, PeerAccepted, 'peer answer'),
      throttle,
      records: this.records,
      stats: this.stats,
      report: (r) => this.reports.push(r),
      track: (p) => this.track(p),
      log: this.log,
      tamper: options.tamper,
    });
    this.merges = new MergeRounds({
      transport: httpMergeTransport(this.client),
      stats: this.stats,
      log: this.log,
      idle: () => this.pipeline.idle(),
      stopped: () => this.stopped,
      mergeDelayMs: options.mergeDelayMs,
      tamper: options.tamper,
    });
    // a peer's session key comes from the orchestrator's lists of this miner's neighbours
    // and the orchestrator signs the serving calls with its own key (./serve-api.ts)
    const orchestrator = orchestratorAddress(network.orchestratorKey);
    const neighbour = (id: string): string | undefined =>
      id.toLowerCase() === orchestrator.toLowerCase()
        ? network.orchestratorKey
        : [...this.pipeline.previousStage(), ...this.pipeline.nextStage()].find((p) => p.id === id)?.sessionKey;
    // the orchestrator signs one serving call per token and stage over HTTP: its own quota, not a peer's
    const verifier = new RequestVerifier({ domain, notBefore: Date.now(), sessionKeyOf: neighbour, quotaOf: (a) => (a.toLowerCase() === orchestrator.toLowerCase() ? ORCHESTRATOR_NONCES : undefined) });
    this.app = buildPeerApi({
      verifier,
      network: { ...network, sessionKey: this.sessionKey, previousStage: () => this.pipeline.previousStage(), nextStage: () => this.pipeline.nextStage() },
      work: this.pipeline,
      stats: this.stats,
      health: () => ({ ok: true, address: this.address, stage: this.stageInfo, stats: this.stats }),
      log: this.log,
    });
    const serve = serveRoutes(this.app, { served: () => tamperedServing(this.serving.served(), this.options.tamper?.inference), orchestrator, verifier, log: this.log });
    setInterval(() => serve.sweep(), SESSION_IDLE_MS / 4).unref();
  }

  static async start(options: MinerOptions): Promise<Miner> {
    const throttle = new Throttle(options.throttle ?? 1); // a bad share throws before any thread starts
    const privateKey = options.privateKey ?? loadOrCreateKeyFile(join(options.dataDir, 'miner-key.json')).privateKey;
    const orchestrators = new Failover(options.orchestrator, (from, to, why) => options.log?.(`orchestrator ${from} ${why}; now using ${to}`));
    const network = await findNetwork(orchestrators);
    const engine = await Engine.create({ threads: options.threads, backend: options.backend, simd: options.simd });
    const miner = new Miner(options, engine, privateKey, throttle, network, orchestrators);
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
    void miner.checkChain();
    miner.schedule(0);
    return miner;
  }

  /** where its GPT stages run */
  get backend(): Backend {
    return this.engine.backend;
  }

  get stageInfo(): { runId: string; stage: number; round: number } | null {
    return this.runner ? { runId: this.runner.runId, stage: this.runner.assignment.stage, round: this.runner.round } : null;
  }

  /**
   * Mbit/s to the orchestrator: the fastest of PROBES signed 1 MiB uploads
   * (the first also opens the connection; a probe slowed by a busy moment on
   * either side is not the link's speed). Waits for an orchestrator that is
   * not up yet.
   */
  private async probeBandwidth(): Promise<number> {
    const probe = randomBytes(1 << 20);
    let best = 0;
    for (let attempt = 0, done = 0; done < PROBES; attempt++) {
      try {
        const t0 = performance.now();
        await this.wallet.request('POST', '/bandwidth', probe);
        best = Math.max(best, (probe.length * 8) / ((performance.now() - t0) * 1000));
        done++;
      } catch (err) {
        if (done > 0) return best;
        if (attempt >= 40 || this.stopped) throw new Error(`cannot reach the orchestrator at ${this.orchestrators.describe()}: ${(err as Error).message}`, { cause: err });
        await sleep(Math.min(2000, 100 * 2 ** attempt));
      }
    }
    return best;
  }

  private async join(): Promise<void> {
    const hardware = await measureHardware(this.engine, this.throttle, this.options.memoryBytes, this.options.gpuMemoryBytes);
    const bandwidthMbps = await this.probeBandwidth();
    const reply = await this.wallet.postJson(
      '/miners/join',
      { name: this.options.name ?? `miner-${this.address.slice(2, 8)}`, url: this.url, hardware, bandwidthMbps, sessionKey: this.sessionKey.publicKey, serve: this.options.serve ?? 'both' },
      JoinReply,
      'join reply',
    );
    this.heartbeatMs = reply.heartbeatMs;
    const backend = hardware.backend === 'webgpu' ? `WebGPU on ${hardware.adapter}${hardware.softwareAdapter ? ' (a software adapter: right answers at CPU speed, for tests)' : ''}` : 'WASM';
    this.log(`joined as ${this.address}: ${hardware.gflops.toFixed(1)} GFLOP/s on ${backend}, ${hardware.threads} threads, ${bandwidthMbps.toFixed(0)} Mbit/s to the orchestrator, serving ${this.options.serve ?? 'both'}`);
    if (this.engine.backendNote) this.log(this.engine.backendNote);
  }

  // ---- heartbeats --------------------------------------------------------------

  private schedule(ms: number): void {
    if (this.stopped) return;
    // a timer that comes due during a job waits for the I/O that came meanwhile (./pipeline.ts whenSettled)
    const due = (): void => {
      if (!this.stopped) void this.heartbeat();
    };
    this.timer = setTimeout(() => this.pipeline.whenSettled(due), ms);
  }

  private async heartbeat(): Promise<void> {
    const sentAt = performance.now();
    const runner = this.runner;
    const reports = this.reports;
    this.reports = reports.splice(MAX_REPORTS);
    const deployment = this.serving.report();
    const req: HeartbeatRequest = {
      ...(deployment ? { deployment } : {}),
      held: this.pipeline.heldWork().slice(0, MAX_REPORTS),
      // ask for a slot's worth more than is free, so a new microbatch is at hand when a slot frees
      freeSlots: runner && !this.mergeOpen() ? Math.max(0, runner.freeSlotCount + runner.slotCount - this.pipeline.startsQueued) : 0,
      queue: this.pipeline.queued,
      reports: this.options.tamper?.reports ? this.options.tamper.reports(reports) : reports,
      ...(runner ? { runId: runner.runId, stage: runner.assignment.stage, round: runner.round, uploadedRound: this.merges.uploadedRound } : {}),
    };
    let reply: HeartbeatReply;
    try {
      reply = await this.client.postJson('/miners/heartbeat', req, HeartbeatReply, 'heartbeat reply');
      for (const p of this.checks.answer(reports, reply.checks)) this.track(p.then((bytes) => void (this.stats.bytesSent += bytes)));
    } catch (err) {
      this.reports.unshift(...reports);
      const status = err instanceof NimbleError ? err.status : 0;
      if (status === 404) await this.join().catch(() => {});
      else if (status === 403) {
        // refused (too little stake): stop working, try to join again now and then
        this.log(`refused by the orchestrator: ${(err as Error).message}`);
        this.dropStage();
        this.serving.follow(null);
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
    // the period runs from the send: a busy miner's round trip (its reply waits for the job running) does not stretch it
    this.schedule(Math.max(0, this.heartbeatMs - (performance.now() - sentAt)));
  }

  private async follow(reply: HeartbeatReply): Promise<void> {
    this.serving.follow(reply.deployment);
    await this.hold(reply.assignment);
    const runner = this.runner;
    for (const id of reply.abandon) this.pipeline.abandon(id);
    if (!runner) return;
    for (const id of runner.heldLongerThan(SLOT_TIMEOUT_MS, Date.now())) this.pipeline.abandon(id, 'no gradient came back');
    this.pipeline.setPeers(reply.previousStage, reply.nextStage);
    for (const task of reply.microbatches) this.pipeline.enqueue({ kind: 'start', task });
    this.mergeTask = reply.merge;
    if (reply.merge) this.merges.start(runner, reply.merge);
    void this.pipeline.pump();
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
    // an edge stage of a run on an uploaded dataset is taken once the dataset is here (downloaded in the background, heartbeats going on)
    const corpus = (!same || !a.stateBlob) && needsDataset(a) ? this.datasets.prepare(a.data) : undefined;
    if (corpus === null) {
      if (current) this.dropStage();
      return;
    }
    // so is an MLP's, once its features are built (in the background the first time, heartbeats going on)
    if ((!same || !a.stateBlob) && !stageDataReady(a, this.log)) {
      if (current) this.dropStage();
      return;
    }
    this.loading = (async () => {
      if (!same || !a.stateBlob) {
        // a new stage, or one whose rounds ended without a saved state: its state is the initial one
        this.dropStage();
        this.runner = new StageRunner(this.engine, a, inFlightLimit(a, this.options.slots ?? 3), corpus);
        // a GPU stage keeps its records' weights on the GPU: fewer of them when they are large
        this.records.maxRecords = this.runner.keptWeightsLimit;
        try {
          await this.runner.ready();
        } catch (err) {
          this.dropStage();
          throw new Error(`cannot hold stage ${a.stage} of ${a.runId}: ${(err as Error).message}`, { cause: err });
        }
        this.runner.lazy = this.options.tamper?.lazy ?? false;
        this.runner.round = a.round;
        this.merges.reset(a.round);
        this.log(`holding stage ${a.stage} [${a.from}, ${a.to}) of ${a.runId}`);
        if (!a.stateBlob && a.init) {
          // a job's later run: the stage starts from its parts of the checkpoint the earlier run ended with
          this.runner.loadInitial(await this.client.request('GET', `/blobs/${a.init}`));
          this.log(`loaded its initial weights from checkpoint ${a.init.slice(0, 12)}`);
        }
      }
      if (a.stateBlob) {
        const bytes = await this.client.request('GET', `/blobs/${a.stateBlob}`);
        this.runner!.loadState(bytes, a.round);
        this.merges.reset(a.round);
        this.log(`loaded the merged state of round ${a.round}`);
      }
    })().finally(() => (this.loading = null));
    return this.loading;
  }

  private dropStage(): void {
    this.pipeline.clear();
    this.checks.clear();
    this.runner?.dispose();
    this.runner = null;
  }

  /** A merge round this replica has not applied yet is open: training pauses. */
  private mergeOpen(): boolean {
    return Boolean(this.runner && this.mergeTask && this.mergeTask.round > this.runner.round);
  }

  private track(p: Promise<unknown>): void {
    this.sends.add(p);
    void p.finally(() => this.sends.delete(p));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.pipeline.stop();
    if (this.timer) clearTimeout(this.timer);
    await this.app.close().catch(() => {});
    await Promise.allSettled([...this.sends]);
    await this.merges.settled().catch(() => {});
    await this.serving.stop().catch(() => {});
    this.runner?.dispose();
    this.runner = null;
    await this.engine.close();
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
