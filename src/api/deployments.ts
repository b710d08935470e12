// Deployments' contracts (docs/inference.md, "Deploy"): what `nbcli model
// deploy|undeploy` sends, and what `GET /models` and `GET /models/:sha256`
// show of a model's deployment: its status, stages and the miners of each
// stage with what they reported. Routes in
// src/orchestrator/routes/deployments.ts, client in ./deployment-client.ts.
import { Type, type Static, type TSchema } from '@sinclair/typebox';

const Count = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Ms = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Address = Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' });
const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

/** Largest idle limit a deployment may ask for: 30 days. */
export const MAX_IDLE_LIMIT_MS = 30 * 86_400_000;
/** Smallest: one minute. */
export const MIN_IDLE_LIMIT_MS = 60_000;

/** `POST /models/:sha256/deploy`, signed by the model's owner. */
export const DeployRequest = Type.Object(
  {
    /** miners per stage (default 1) */
    replicas: Type.Optional(Type.Integer({ minimum: 1, maximum: 64 })),
    /** the stage count (default: the fewest that fit the miners) */
    stages: Type.Optional(Type.Integer({ minimum: 1, maximum: 1024 })),
    /** undeployed after this long without a request (default 24 h) */
    idleLimitMs: Type.Optional(Type.Integer({ minimum: MIN_IDLE_LIMIT_MS, maximum: MAX_IDLE_LIMIT_MS })),
  },
  { additionalProperties: false },
);
export type DeployRequest = Static<typeof DeployRequest>;

export const DeploymentStatus = Type.Union([Type.Literal('deploying'), Type.Literal('serving'), Type.Literal('undeployed')]);

/** A miner holding a stage, and what it last reported. */
export const DeploymentReplicaView = Type.Object({
  id: Address,
  name: Nullable(Type.String()),
  alive: Type.Boolean(),
  /** loading: downloading and checking the weights; serving: they are loaded and verified */
  state: Type.Union([Type.Literal('loading'), Type.Literal('serving'), Type.Literal('failed')]),
  /** what the miner checked the file against: the ModelRegistry on chain, or (unpaid network) the orchestrator's sha256 */
  verifiedBy: Nullable(Type.Union([Type.Literal('chain'), Type.Literal('sha256')])),
  /** the sha256 of the file the miner loaded */
  sha256: Nullable(Type.String({ pattern: '^[0-9a-f]{64}$' })),
  detail: Nullable(Type.String()),
});
export type DeploymentReplicaView = Static<typeof DeploymentReplicaView>;

export const DeploymentStageView = Type.Object({
  stage: Count,
  /** the model's parts [from, to) */
  parts: Type.Tuple([Count, Count]),
  /** what a replica needs: weights, KV caches of every session, buffers */
  memoryBytes: Count,
  miners: Type.Array(DeploymentReplicaView),
});
export type DeploymentStageView = Static<typeof DeploymentStageView>;

export const DeploymentView = Type.Object({
  id: Type.String(),
  sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  name: Type.String(),
  owner: Address,
  model: Type.String(),
  status: DeploymentStatus,
  replicas: Count,
  /** the stage count asked for (null: the fewest that fit) */
  requestedStages: Nullable(Count),
  /** sessions each stage keeps room for */
  sessions: Count,
  stages: Type.Array(DeploymentStageView),
  /** why it waits, or what is missing */
  message: Nullable(Type.String()),
  /** miners that failed to load it (they are not given it again) */
  refused: Type.Array(Type.Object({ id: Address, detail: Type.String(), at: Ms })),
  /** its ModelRegistry entry and the deployed flag as last seen (null: an unpaid network) */
  registry: Nullable(Type.Object({ chainId: Count, address: Address, modelId: Count, deployed: Nullable(Type.Boolean()) })),
  idleLimitMs: Ms,
  lastRequestAt: Ms,
  createdAt: Ms,
  servingAt: Nullable(Ms),
  undeployedAt: Nullable(Ms),
  /** by its owner, or idle for its limit */
  undeployReason: Nullable(Type.String()),
});
export type DeploymentView = Static<typeof DeploymentView>;
export const DeploymentList = Type.Array(DeploymentView);
