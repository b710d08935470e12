// Deployments on the orchestrator (docs/inference.md, "Deploy"): a published
// GPT that its owner deploys is planned onto miners that serve inference
// (src/inference/deploy-plan.ts: weights + KV caches in memory, forward speed,
// `replicas` per stage), each miner is told its stage through its heartbeat
// (a DeploymentAssignment, apart from training's StageAssignment) and reports
// back as it downloads, checks and loads the weights. Replicas that leave are
// replaced on the clock; a miner that fails to load a deployment is not given
// it again; a deployment nobody sent a request to for its idle limit is
// undeployed. The state is ../state/deployments.ts; the registry's deployed
// flag is kept in step by ./deployment-registry.ts; the routes are
// ../routes/deployments.ts.
//
// A miner holds one thing at a time: a training stage or a deployment stage.
// Training's planner (../training/run-planner.ts) leaves alone the miners holding a
// deployment stage and those that serve only inference; this one leaves alone
// the miners holding a training stage and those that only train. Free miners
// that do both go to whichever asks first.
import { randomBytes } from 'node:crypto';
import type { DeploymentView } from '../../api/deployments.ts';
import { DEFAULT_DEPLOY_SESSIONS, inferenceStageCost, pickReplacements, planDeployment, uploadBytesPerToken, type ServingMiner } from '../../inference/deploy-plan.ts';
import { gptConfigOf, modelParts } from '../../model/model-ref.ts';
import { formatBytes, PlanError } from '../../planner/errors.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { DeploymentAssignment, DeploymentReport, Peer } from '../../protocol/messages.ts';
import type { DeploymentRecord, RegistryEntry, ReplicaReport } from '../state/deployments.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MinerRecord } from '../state/miners.ts';
import type { ModelRecord } from '../state/models.ts';

/** A deployment nobody sent a request to for this long is undeployed (the issue's default). */
export const DEFAULT_IDLE_LIMIT_MS = 24 * 3_600_000;
/** Deployments one owner may have live at once. */
export const MAX_LIVE_DEPLOYMENTS_PER_OWNER = 8;

export interface DeploymentOptions {
  /** the default idle limit (a deploy request may ask for another) */
  idleLimitMs: number;
  /** sessions each stage keeps room for (KV caches: what placement sizes memory with) */
  sessions: number;
}

export const DEPLOYMENT_DEFAULTS: DeploymentOptions = { idleLimitMs: DEFAULT_IDLE_LIMIT_MS, sessions: DEFAULT_DEPLOY_SESSIONS };

/** What a deploy asks for, once its signer is known to own the model. */
export interface DeployInput {
  model: ModelRecord;
  /** the model's owner (on the registry; the store's on an unpaid network) */
  owner: string;
  /** its ModelRegistry entry (null: an unpaid network) */
  registry: RegistryEntry | null;
  replicas?: number;
  stages?: number;
  idleLimitMs?: number;
}

export class Deployments {
  readonly options: DeploymentOptions;

  constructor(
    private readonly state: OrchestratorState,
    options: Partial<DeploymentOptions> = {},
    private readonly now: () => number = Date.now,
    private readonly log: (line: string) => void = () => {},
  ) {
    this.options = { ...DEPLOYMENT_DEFAULTS, ...options };
  }

  /** Records a deployment of `input.model` and plans it if miners are free (else it waits, saying why). */
  deploy(input: DeployInput): DeploymentRecord {
    const { model } = input;
    checkDeployable(model);
    const parts = modelParts(model.model);
    if (input.stages !== undefined && input.stages > parts) throw new NimbleError('invalid', `${model.model} has ${parts} parts; it cannot be cut into ${input.stages} stages`);
    // a name is one owner's: another owner's model under it (a row stored before names were owned) is not served by it
    const holder = this.state.models.nameOwner(model.name);
    if (holder && holder.toLowerCase() !== input.owner.toLowerCase()) throw new NimbleError('name_taken', `the model name '${model.name}' is ${holder}'s: ${input.owner} cannot deploy a model under it`, 409);
    const live = this.state.deployments.liveOf(model.sha256);
    if (live) throw new NimbleError('conflict', `model ${model.sha256} ('${model.name}') is deployed already (${live.id}, ${live.status}); undeploy it first`);
    if (this.state.deployments.countLiveOf(input.owner) >= MAX_LIVE_DEPLOYMENTS_PER_OWNER) {
      throw new NimbleError('too_many_deployments', `${input.owner} has ${MAX_LIVE_DEPLOYMENTS_PER_OWNER} deployments live; undeploy one first`, 429);
    }
    const id = `dep-${randomBytes(6).toString('hex')}`;
    const d = this.state.deployments.insert(
      {
        id,
        sha256: model.sha256,
        name: model.name,
        owner: input.owner,
        model: model.model,
        replicas: input.replicas ?? 1,
        requestedStages: input.stages ?? null,
        sessions: this.options.sessions,
        registry: input.registry,
        idleLimitMs: input.idleLimitMs ?? this.options.idleLimitMs,
      },
      this.now(),
    );
    this.log(`deployment ${id} of ${model.name} (${model.sha256.slice(0, 12)}) by ${input.owner}`);
    this.place(d);
    return this.state.deployments.get(id)!;
  }

  /** Ends a live deployment: its miners let go of their stages at their next heartbeat. */
  undeploy(id: string, reason: string): DeploymentRecord {
    const d = this.state.deployments.get(id);
    if (!d) throw new NimbleError('not_found', `unknown deployment ${id}`);
    if (d.status === 'undeployed') throw new NimbleError('conflict', `deployment ${id} was undeployed already (${d.undeployReason ?? 'no reason'})`);
    this.state.deployments.undeploy(id, reason, this.now());
    this.log(`deployment ${id} of ${d.name} undeployed: ${reason}`);
    return this.state.deployments.get(id)!;
  }

  /** A request used the model's live deployment (the serving path calls this): it is not idle. */
  noteRequest(id: string): void {
    this.state.deployments.touch(id, this.now());
  }

  /** The clock: idle deployments are undeployed, the others get replicas where some are missing. */
  tick(): void {
    this.collectIdle();
    for (const d of this.state.deployments.live()) {
      try {
        this.place(d);
      } catch (err) {
        this.log(`deployment ${d.id}: placement failed: ${(err as Error).message}`);
      }
    }
  }

  /** Undeploys every live deployment without a request for its idle limit; returns them. */
  collectIdle(): DeploymentRecord[] {
    const now = this.now();
    const out: DeploymentRecord[] = [];
    for (const d of this.state.deployments.live()) {
      if (now - d.lastRequestAt < d.idleLimitMs) continue;
      out.push(this.undeploy(d.id, `idle: no request for ${formatDuration(d.idleLimitMs)}`));
    }
    return out;
  }

  /**
   * A miner's heartbeat: records what it reported of its deployment stage and
   * answers with the stage it is to hold (null: none). A miner that reports
   * it failed to load its stage is let go of it and not given it again.
   */
  heartbeat(minerId: string, report: DeploymentReport | undefined): DeploymentAssignment | null {
    const held = this.state.deployments.replicaOf(minerId);
    if (!held) return null;
    const d = this.state.deployments.get(held.deploymentId);
    const stage = d ? this.state.deployments.stages(d.id)[held.stage] : undefined;
    const model = d ? this.state.models.get(d.sha256) : undefined;
    if (!d || d.status === 'undeployed' || !stage || !model) {
      this.state.deployments.unassign(minerId);
      return null;
    }
    const now = this.now();
    const about = report && report.deploymentId === d.id && report.stage === held.stage ? report : null;
    if (about?.state === 'failed' || (about?.state === 'serving' && about.sha256 !== d.sha256)) {
      const detail = about.state === 'failed' ? (about.detail ?? 'failed to load the stage') : `reported serving a file of sha256 ${about.sha256 ?? 'unknown'}, not ${d.sha256}`;
      this.state.deployments.refuse(d.id, minerId, detail, now);
      this.log(`deployment ${d.id}: miner ${minerId} refused stage ${held.stage}: ${detail}`);
      this.updateStatus(d);
      return null;
    }
    // a miner that says nothing of this stage (it restarted, or has not started loading) is loading it
    const next: ReplicaReport = about ?? { state: 'loading' };
    const changed = held.state !== next.state || held.verifiedBy !== (next.verifiedBy ?? null) || held.sha256 !== (next.sha256 ?? null) || held.detail !== (next.detail ?? null);
    if (changed) {
      this.state.deployments.report(minerId, next, now);
      if (next.state === 'serving') this.log(`deployment ${d.id}: miner ${minerId} serves stage ${held.stage} [${stage.fromPart}, ${stage.toPart}) (weights checked against ${next.verifiedBy === 'chain' ? 'the ModelRegistry' : 'the stored sha256'})`);
      this.updateStatus(d);
    }
    const stages = this.state.deployments.stages(d.id);
    return {
      deploymentId: d.id,
      sha256: d.sha256,
      bytes: model.bytes,
      model: d.model,
      stage: held.stage,
      stageCount: stages.length,
      from: stage.fromPart,
      to: stage.toPart,
      maxSessions: d.sessions,
      registry: d.registry,
      previousStage: this.servingPeers(d.id, held.stage - 1),
      nextStage: this.servingPeers(d.id, held.stage + 1),
    };
  }

  /** The replicas of stage `stage` of a deployment that report serving and are alive, as peers (empty past either end). */
  servingPeers(id: string, stage: number): Peer[] {
    const out: Peer[] = [];
    for (const r of this.state.deployments.replicas(id)) {
      if (r.stage !== stage || r.state !== 'serving') continue;
      const m = this.state.miners.get(r.minerId);
      if (m && m.alive) out.push({ id: m.id, url: m.url, sessionKey: m.sessionKey, weight: 1 });
    }
    return out;
  }

  /** Miners holding a deployment stage (training leaves them alone). */
  busyMiners(): Set<string> {
    return this.state.deployments.busyMiners();
  }

  /**
   * Keeps a live deployment placed: replicas that can no longer serve (gone,
   * training only, holding a training stage) are let go; the first time, the
   * model is cut and placed, later missing replicas are replaced by the
   * fastest free miners that fit; then its status follows its replicas.
   */
  place(d: DeploymentRecord): void {
    const training = this.trainingMiners();
    for (const r of this.state.deployments.replicas(d.id)) {
      const m = this.state.miners.get(r.minerId);
      if (m && m.alive && m.serve !== 'training' && !training.has(m.id)) continue;
      this.state.deployments.unassign(r.minerId);
      this.log(`deployment ${d.id}: miner ${r.minerId} left stage ${r.stage} (${!m || !m.alive ? 'gone' : m.serve === 'training' ? 'it trains only' : 'it holds a training stage'})`);
    }
    const free = this.freeMiners(d.id, training);
    const stages = this.state.deployments.stages(d.id);
    const now = this.now();
    if (stages.length === 0) {
      let plan;
      try {
        plan = planDeployment({ config: gptConfigOf(d.model), miners: free.map(capacity), replicas: d.replicas, stages: d.requestedStages ?? undefined, sessions: d.sessions });
      } catch (err) {
        if (!(err instanceof PlanError)) throw err;
        this.state.deployments.setMessage(d.id, `waiting for miners that serve inference: ${err.message}`);
        return;
      }
      this.state.tx(() => {
        this.state.deployments.insertStages(d.id, plan.stages.map((s) => ({ from: s.range.from, to: s.range.to, memoryBytes: s.memoryBytes })));
        plan.stages.forEach((s, i) => s.miners.forEach((m) => this.state.deployments.assign(d.id, i, m, now)));
        this.state.deployments.setMessage(d.id, null);
      });
      this.log(`deployment ${d.id} planned: ${plan.stages.map((s, i) => `stage ${i} [${s.range.from}, ${s.range.to}) on ${s.miners.join(', ')} (${Math.round(s.throughputTokensPerS)} tokens/s, limited by ${s.limitedBy})`).join('; ')}`);
    } else {
      const held = this.state.deployments.replicas(d.id);
      let left = free;
      const short: string[] = [];
      for (const s of stages) {
        const need = d.replicas - held.filter((r) => r.stage === s.stage).length;
        if (need <= 0) continue;
        const config = gptConfigOf(d.model);
        const range = { from: s.fromPart, to: s.toPart };
        const load = { flopsPerToken: inferenceStageCost(config, range, d.sessions).flopsPerToken, uploadBytesPerToken: uploadBytesPerToken(config, range) };
        const picked = pickReplacements(s.memoryBytes, load, left.map(capacity), need);
        for (const m of picked) {
          this.state.deployments.assign(d.id, s.stage, m.id, now);
          this.log(`deployment ${d.id}: miner ${m.id} takes stage ${s.stage} [${s.fromPart}, ${s.toPart})`);
        }
        left = left.filter((m) => !picked.some((p) => p.id === m.id));
        if (picked.length < need) short.push(`stage ${s.stage} has ${d.replicas - need + picked.length} of ${d.replicas} replicas (no free miner serving inference with ${formatBytes(s.memoryBytes)} and upload bandwidth)`);
      }
      const message = short.length ? `waiting for miners: ${short.join('; ')}` : null;
      if (message !== d.message) this.state.deployments.setMessage(d.id, message);
    }
    this.updateStatus(this.state.deployments.get(d.id)!);
  }

  /** serving when every stage has a live replica serving verified weights, else deploying. */
  private updateStatus(d: DeploymentRecord): void {
    if (d.status === 'undeployed') return;
    const stages = this.state.deployments.stages(d.id);
    const replicas = this.state.deployments.replicas(d.id);
    const serving = stages.length > 0 && stages.every((s) => replicas.some((r) => r.stage === s.stage && r.state === 'serving' && this.state.miners.get(r.minerId)?.alive));
    const status = serving ? 'serving' : 'deploying';
    if (status === d.status) return;
    this.state.deployments.setStatus(d.id, status, this.now());
    this.log(`deployment ${d.id} of ${d.name}: ${status}`);
  }

  /** Alive miners that serve inference, hold no stage of a run or a deployment, and never failed to load this one. */
  private freeMiners(deploymentId: string, training: Set<string>): MinerRecord[] {
    const busy = this.state.deployments.busyMiners();
    const refused = new Set(this.state.deployments.refusals(deploymentId).map((r) => r.minerId));
    return this.state.miners.list(true).filter((m) => m.serve !== 'training' && m.evicted === null && !training.has(m.id) && !busy.has(m.id) && !refused.has(m.id));
  }

  /** Miners holding a stage of an active training run. */
  private trainingMiners(): Set<string> {
    return new Set(this.state.runs.active().flatMap((r) => this.state.runs.assignments(r.id).map((a) => a.minerId)));
  }
}

/** Only a GPT deploys: a classifier is refused, saying why. */
export function checkDeployable(model: ModelRecord): void {
  if (model.kind !== 'gpt') {
    throw new NimbleError('invalid', `model ${model.sha256} ('${model.name}') is an MLP classifier (${model.model}): it classifies and never generates text, so it cannot be deployed for generation`);
  }
}

function capacity(m: MinerRecord): ServingMiner {
  return { id: m.id, gflops: m.gflops, memoryBytes: m.memoryBytes, bandwidthMbps: m.bandwidthMbps };
}

/** "24 h", "90 min", "45 s". */
export function formatDuration(ms: number): string {
  if (ms >= 3_600_000 && ms % 3_600_000 === 0) return `${ms / 3_600_000} h`;
  if (ms >= 60_000 && ms % 60_000 === 0) return `${ms / 60_000} min`;
  return `${Math.round(ms / 1000)} s`;
}

/** A deployment as the API shows it: its stages, each stage's miners and what they reported. */
export function deploymentView(state: OrchestratorState, d: DeploymentRecord): DeploymentView {
  const replicas = state.deployments.replicas(d.id);
  return {
    id: d.id,
    sha256: d.sha256,
    name: d.name,
    owner: d.owner,
    model: d.model,
    status: d.status,
    replicas: d.replicas,
    requestedStages: d.requestedStages,
    sessions: d.sessions,
    stages: state.deployments.stages(d.id).map((s) => ({
      stage: s.stage,
      parts: [s.fromPart, s.toPart],
      memoryBytes: s.memoryBytes,
      miners: replicas
        .filter((r) => r.stage === s.stage)
        .map((r) => {
          const m = state.miners.get(r.minerId);
          return { id: r.minerId, name: m?.name ?? null, alive: m?.alive ?? false, state: r.state, verifiedBy: r.verifiedBy, sha256: r.sha256, detail: r.detail };
        }),
    })),
    message: d.message,
    refused: state.deployments.refusals(d.id).map((r) => ({ id: r.minerId, detail: r.detail, at: r.at })),
    registry: d.registry ? { ...d.registry, deployed: d.registryDeployed } : null,
    idleLimitMs: d.idleLimitMs,
    lastRequestAt: d.lastRequestAt,
    createdAt: d.createdAt,
    servingAt: d.servingAt,
    undeployedAt: d.undeployedAt,
    undeployReason: d.undeployReason,
  };
}

/** The newest deployment of a stored model, as the API shows it (null: never deployed). */
export function deploymentViewOf(state: OrchestratorState, sha256: string): DeploymentView | null {
  const d = state.deployments.latestOf(sha256);
  return d ? deploymentView(state, d) : null;
}
