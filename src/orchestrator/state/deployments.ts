// Deployed models (docs/inference.md, "Deploy"): a published GPT served by
// miners, cut into stages, each held by `replicas` miners. Its own tables,
// apart from training runs':
//
//   deployments          one row per deploy: the model (sha256, name, owner,
//                        reference), replicas, the stage count asked for,
//                        sessions per stage, status, the ModelRegistry entry
//                        and the deployed flag last seen on it, the idle limit
//                        and the last request;
//   deployment_stages    the cut, once planned: parts [from, to) and memory;
//   deployment_miners    who holds which stage, and what the miner last
//                        reported (loading, serving, and how it checked the
//                        weights); a miner holds at most one deployment stage;
//   deployment_refusals  miners that failed to load a deployment (a file
//                        that did not verify, weights that did not load):
//                        they are not given it again.
//
// Status: deploying (planned or waiting for miners, stages loading) ⇄
// serving (every stage has a replica serving verified weights) →
// undeployed (by its owner, or idle past its limit), final. At most one
// deployment of a model is not undeployed.
import { Type, type Static } from '@sinclair/typebox';
import { all, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const DEPLOYMENT_MIGRATIONS: Migrations = {
  store: 'deployments',
  steps: [
    `CREATE TABLE IF NOT EXISTS deployments (
      id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL, model TEXT NOT NULL,
      replicas INTEGER NOT NULL, requested_stages INTEGER, sessions INTEGER NOT NULL, status TEXT NOT NULL, message TEXT,
      registry_chain_id INTEGER, registry_address TEXT, registry_model_id INTEGER, registry_deployed INTEGER,
      idle_limit_ms INTEGER NOT NULL, last_request_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL, serving_at INTEGER, undeployed_at INTEGER, undeploy_reason TEXT
    );
    CREATE UNIQUE INDEX IF NOT EXISTS deployments_live ON deployments (sha256) WHERE status != 'undeployed';
    CREATE INDEX IF NOT EXISTS deployments_by_model ON deployments (sha256, created_at);
    CREATE TABLE IF NOT EXISTS deployment_stages (
      deployment_id TEXT NOT NULL, stage INTEGER NOT NULL, from_part INTEGER NOT NULL, to_part INTEGER NOT NULL, memory_bytes INTEGER NOT NULL,
      PRIMARY KEY (deployment_id, stage)
    );
    CREATE TABLE IF NOT EXISTS deployment_miners (
      miner_id TEXT PRIMARY KEY, deployment_id TEXT NOT NULL, stage INTEGER NOT NULL,
      state TEXT NOT NULL, verified_by TEXT, sha256 TEXT, detail TEXT, assigned_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS deployment_miners_by_deployment ON deployment_miners (deployment_id, stage);
    CREATE TABLE IF NOT EXISTS deployment_refusals (
      deployment_id TEXT NOT NULL, miner_id TEXT NOT NULL, detail TEXT NOT NULL, at INTEGER NOT NULL,
      PRIMARY KEY (deployment_id, miner_id)
    )`,
  ],
};

export const DeploymentStatus = Type.Union([Type.Literal('deploying'), Type.Literal('serving'), Type.Literal('undeployed')]);
export type DeploymentStatus = Static<typeof DeploymentStatus>;
export const ReplicaState = Type.Union([Type.Literal('loading'), Type.Literal('serving'), Type.Literal('failed')]);
export type ReplicaState = Static<typeof ReplicaState>;
export const VerifiedBy = Type.Union([Type.Literal('chain'), Type.Literal('sha256')]);

const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);
const NullableText = Type.Union([Type.String(), Type.Null()]);

const DeploymentRow = Type.Object({
  id: Type.String(),
  sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  name: Type.String(),
  owner: Type.String(),
  model: Type.String(),
  replicas: Type.Integer({ minimum: 1 }),
  requestedStages: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  sessions: Type.Integer({ minimum: 1 }),
  status: DeploymentStatus,
  message: NullableText,
  registryChainId: NullableInt,
  registryAddress: NullableText,
  registryModelId: NullableInt,
  registryDeployed: Type.Union([Type.Literal(0), Type.Literal(1), Type.Null()]),
  idleLimitMs: Int,
  lastRequestAt: Int,
  createdAt: Int,
  servingAt: NullableInt,
  undeployedAt: NullableInt,
  undeployReason: NullableText,
});
type Row = Static<typeof DeploymentRow>;

/** Where the model is registered: its ModelRegistry entry (null on an unpaid network). */
export interface RegistryEntry {
  chainId: number;
  address: string;
  modelId: number;
}

export interface DeploymentRecord extends Omit<Row, 'registryChainId' | 'registryAddress' | 'registryModelId' | 'registryDeployed'> {
  registry: RegistryEntry | null;
  /** the registry's deployed flag as this orchestrator last saw or set it (null: not yet) */
  registryDeployed: boolean | null;
}

/** What deploying records. */
export interface NewDeployment {
  id: string;
  sha256: string;
  name: string;
  owner: string;
  model: string;
  replicas: number;
  requestedStages: number | null;
  sessions: number;
  registry: RegistryEntry | null;
  idleLimitMs: number;
}

const COLUMNS = `id, sha256, name, owner, model, replicas, requested_stages AS requestedStages, sessions, status, message,
  registry_chain_id AS registryChainId, registry_address AS registryAddress, registry_model_id AS registryModelId, registry_deployed AS registryDeployed,
  idle_limit_ms AS idleLimitMs, last_request_at AS lastRequestAt, created_at AS createdAt, serving_at AS servingAt,
  undeployed_at AS undeployedAt, undeploy_reason AS undeployReason`;
const readRow = rowReader(DeploymentRow, 'deployment');
function decode(row: unknown): DeploymentRecord {
  const { registryChainId, registryAddress, registryModelId, registryDeployed, ...r } = readRow(row);
  const registry = registryChainId !== null && registryAddress !== null && registryModelId !== null ? { chainId: registryChainId, address: registryAddress, modelId: registryModelId } : null;
  return { ...r, registry, registryDeployed: registryDeployed === null ? null : registryDeployed === 1 };
}

const StageRow = Type.Object({ deploymentId: Type.String(), stage: Int, fromPart: Int, toPart: Type.Integer({ minimum: 1 }), memoryBytes: Int });
export type DeploymentStageRecord = Static<typeof StageRow>;
const readStage = rowReader(StageRow, 'deployment stage');

const ReplicaRow = Type.Object({
  minerId: Type.String(),
  deploymentId: Type.String(),
  stage: Int,
  state: ReplicaState,
  verifiedBy: Type.Union([VerifiedBy, Type.Null()]),
  sha256: NullableText,
  detail: NullableText,
  assignedAt: Int,
  updatedAt: Int,
});
export type ReplicaRecord = Static<typeof ReplicaRow>;
const readReplica = rowReader(ReplicaRow, 'deployment replica');
const REPLICA_COLUMNS = 'miner_id AS minerId, deployment_id AS deploymentId, stage, state, verified_by AS verifiedBy, sha256, detail, assigned_at AS assignedAt, updated_at AS updatedAt';

const RefusalRow = Type.Object({ minerId: Type.String(), detail: Type.String(), at: Int });
export type RefusalRecord = Static<typeof RefusalRow>;
const readRefusal = rowReader(RefusalRow, 'deployment refusal');
const readMinerId = rowReader(Type.Object({ minerId: Type.String() }), 'miner id');
const decodeCreated = rowReader(Type.Object({ at: Type.Integer({ minimum: 0 }) }), 'deployment time');

/** What a miner reported of its deployment stage. */
export interface ReplicaReport {
  state: ReplicaState;
  verifiedBy?: 'chain' | 'sha256' | null;
  sha256?: string | null;
  detail?: string | null;
}

export class DeploymentStore {
  constructor(private readonly db: StateDb) {}

  /** Records a deployment, 'deploying' with no stages yet; the last request time starts now. */
  insert(d: NewDeployment, now: number): DeploymentRecord {
    this.db.run(
      `INSERT INTO deployments (id, sha256, name, owner, model, replicas, requested_stages, sessions, status,
         registry_chain_id, registry_address, registry_model_id, idle_limit_ms, last_request_at, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'deploying', ?, ?, ?, ?, ?, ?)`,
      d.id, d.sha256, d.name, d.owner, d.model, d.replicas, d.requestedStages, d.sessions,
      d.registry?.chainId ?? null, d.registry?.address ?? null, d.registry?.modelId ?? null, d.idleLimitMs, now, now,
    );
    return this.get(d.id)!;
  }

  get(id: string): DeploymentRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM deployments WHERE id = ?`, id);
  }

  /** The model's deployment that is not undeployed, if any. */
  liveOf(sha256: string): DeploymentRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM deployments WHERE sha256 = ? AND status != 'undeployed'`, sha256);
  }

  /** The model's newest deployment (of any status), if any. */
  latestOf(sha256: string): DeploymentRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM deployments WHERE sha256 = ? ORDER BY created_at DESC, rowid DESC LIMIT 1`, sha256);
  }

  /** Deployments that are not undeployed, oldest first. */
  live(): DeploymentRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM deployments WHERE status != 'undeployed' ORDER BY created_at, rowid`);
  }

  /** Every deployment, newest first. */
  list(): DeploymentRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM deployments ORDER BY created_at DESC, rowid DESC`);
  }

  /** When `owner`'s deployments made after `since` were made, oldest first (what its deploy rate is counted from). */
  createdSince(owner: string, since: number): number[] {
    return all(this.db, decodeCreated, 'SELECT created_at AS at FROM deployments WHERE LOWER(owner) = LOWER(?) AND created_at > ? ORDER BY created_at', owner, since).map((r) => r.at);
  }

  countLiveOf(owner: string): number {
    return scalar(this.db, "SELECT COUNT(*) AS n FROM deployments WHERE LOWER(owner) = LOWER(?) AND status != 'undeployed'", owner);
  }

  /** Deployments whose registry flag may need setting: registered, and live or last seen deployed. */
  registryPending(): DeploymentRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM deployments WHERE registry_model_id IS NOT NULL AND (status != 'undeployed' OR registry_deployed = 1) ORDER BY created_at, rowid`);
  }

  setStatus(id: string, status: Exclude<DeploymentStatus, 'undeployed'>, now: number): void {
    this.db.run("UPDATE deployments SET status = ?, serving_at = CASE WHEN ? = 'serving' THEN COALESCE(serving_at, ?) ELSE serving_at END WHERE id = ? AND status != 'undeployed'", status, status, now, id);
  }

  setMessage(id: string, message: string | null): void {
    this.db.run('UPDATE deployments SET message = ? WHERE id = ?', message === null ? null : message.slice(0, 1000), id);
  }

  setRegistryDeployed(id: string, deployed: boolean): void {
    this.db.run('UPDATE deployments SET registry_deployed = ? WHERE id = ?', deployed ? 1 : 0, id);
  }

  /** A request used the deployment (what keeps it from being collected as idle). */
  touch(id: string, now: number): void {
    this.db.run('UPDATE deployments SET last_request_at = MAX(last_request_at, ?) WHERE id = ?', now, id);
  }

  /** Ends a deployment: its miners are let go. */
  undeploy(id: string, reason: string, now: number): void {
    this.db.tx(() => {
      this.db.run("UPDATE deployments SET status = 'undeployed', undeployed_at = ?, undeploy_reason = ?, message = NULL WHERE id = ? AND status != 'undeployed'", now, reason.slice(0, 500), id);
      this.db.run('DELETE FROM deployment_miners WHERE deployment_id = ?', id);
    });
  }

  insertStages(id: string, stages: readonly { from: number; to: number; memoryBytes: number }[]): void {
    this.db.tx(() => {
      stages.forEach((s, i) => this.db.run('INSERT INTO deployment_stages (deployment_id, stage, from_part, to_part, memory_bytes) VALUES (?, ?, ?, ?, ?)', id, i, s.from, s.to, s.memoryBytes));
    });
  }

  stages(id: string): DeploymentStageRecord[] {
    return all(this.db, readStage, 'SELECT deployment_id AS deploymentId, stage, from_part AS fromPart, to_part AS toPart, memory_bytes AS memoryBytes FROM deployment_stages WHERE deployment_id = ? ORDER BY stage', id);
  }

  /** Gives `minerId` a stage of the deployment (it holds no other), loading. */
  assign(id: string, stage: number, minerId: string, now: number): void {
    this.db.run(
      `INSERT INTO deployment_miners (miner_id, deployment_id, stage, state, assigned_at, updated_at) VALUES (?, ?, ?, 'loading', ?, ?)
       ON CONFLICT(miner_id) DO UPDATE SET deployment_id = excluded.deployment_id, stage = excluded.stage, state = 'loading',
         verified_by = NULL, sha256 = NULL, detail = NULL, assigned_at = excluded.assigned_at, updated_at = excluded.updated_at`,
      minerId, id, stage, now, now,
    );
  }

  unassign(minerId: string): void {
    this.db.run('DELETE FROM deployment_miners WHERE miner_id = ?', minerId);
  }

  /** The deployment stage a miner holds, if any. */
  replicaOf(minerId: string): ReplicaRecord | undefined {
    return one(this.db, readReplica, `SELECT ${REPLICA_COLUMNS} FROM deployment_miners WHERE miner_id = ?`, minerId);
  }

  /** The miners of a deployment, by stage. */
  replicas(id: string): ReplicaRecord[] {
    return all(this.db, readReplica, `SELECT ${REPLICA_COLUMNS} FROM deployment_miners WHERE deployment_id = ? ORDER BY stage, assigned_at, miner_id`, id);
  }

  /** Records what the miner holding a stage reported. */
  report(minerId: string, r: ReplicaReport, now: number): void {
    this.db.run(
      'UPDATE deployment_miners SET state = ?, verified_by = ?, sha256 = ?, detail = ?, updated_at = ? WHERE miner_id = ?',
      r.state, r.verifiedBy ?? null, r.sha256 ?? null, r.detail === undefined || r.detail === null ? null : r.detail.slice(0, 512), now, minerId,
    );
  }

  /** Miners holding a stage of any deployment. */
  busyMiners(): Set<string> {
    return new Set(all(this.db, readMinerId, 'SELECT miner_id AS minerId FROM deployment_miners').map((r) => r.minerId));
  }

  /** The miner failed to load the deployment: it is let go and not given it again. */
  refuse(id: string, minerId: string, detail: string, now: number): void {
    this.db.tx(() => {
      this.db.run('DELETE FROM deployment_miners WHERE miner_id = ? AND deployment_id = ?', minerId, id);
      this.db.run(
        'INSERT INTO deployment_refusals (deployment_id, miner_id, detail, at) VALUES (?, ?, ?, ?) ON CONFLICT(deployment_id, miner_id) DO UPDATE SET detail = excluded.detail, at = excluded.at',
        id, minerId, detail.slice(0, 512), now,
      );
    });
  }

  refusals(id: string): RefusalRecord[] {
    return all(this.db, readRefusal, 'SELECT miner_id AS minerId, detail, at FROM deployment_refusals WHERE deployment_id = ? ORDER BY at, miner_id', id);
  }
}
