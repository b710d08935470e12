// The orchestrator's durable state: one database (a SQLite file by default,
// or PostgreSQL) and a store per domain. Everything the orchestrator
// remembers across a restart goes through here.
import { ApiKeyStore, API_KEY_MIGRATIONS } from './api-keys.ts';
import { BuildProbeStore, BUILD_PROBE_MIGRATIONS } from './build-probes.ts';
import { ClaimStore, CLAIM_MIGRATIONS } from './claims.ts';
import { CreditStore, CREDIT_MIGRATIONS } from './credits.ts';
import { DatasetStore, DATASET_MIGRATIONS } from './datasets.ts';
import { DeploymentStore, DEPLOYMENT_MIGRATIONS } from './deployments.ts';
import { StateDb } from './db.ts';
import { PgDriver, type PgDriverOptions } from './pg-driver.ts';
import { EscrowStore, ESCROW_MIGRATIONS } from './escrows.ts';
import { IdentityStore, IDENTITY_MIGRATIONS } from './identity.ts';
import { BlobGarbage, GARBAGE_MIGRATIONS } from './garbage.ts';
import { InferenceRequestStore, INFERENCE_REQUEST_MIGRATIONS } from './inference-requests.ts';
import { JobStore, JOB_MIGRATIONS } from './jobs.ts';
import { Ledger, LEDGER_MIGRATIONS } from './ledger.ts';
import { LossPointStore, LOSS_POINT_MIGRATIONS } from './loss-points.ts';
import { MergeRoundStore, MERGE_ROUND_MIGRATIONS } from './merge-rounds.ts';
import { MicrobatchStore, MICROBATCH_MIGRATIONS } from './microbatches.ts';
import { MinerStore, MINER_MIGRATIONS } from './miners.ts';
import { ModelStore, MODEL_MIGRATIONS } from './models.ts';
import { RunStore, RUN_MIGRATIONS } from './runs.ts';
import { SpotCheckStore, SPOT_CHECK_MIGRATIONS } from './spot-checks.ts';

export const MIGRATIONS = [MINER_MIGRATIONS, RUN_MIGRATIONS, MICROBATCH_MIGRATIONS, CLAIM_MIGRATIONS, MERGE_ROUND_MIGRATIONS, LEDGER_MIGRATIONS, SPOT_CHECK_MIGRATIONS, GARBAGE_MIGRATIONS, JOB_MIGRATIONS, MODEL_MIGRATIONS, ESCROW_MIGRATIONS, DATASET_MIGRATIONS, DEPLOYMENT_MIGRATIONS, API_KEY_MIGRATIONS, CREDIT_MIGRATIONS, INFERENCE_REQUEST_MIGRATIONS, LOSS_POINT_MIGRATIONS, IDENTITY_MIGRATIONS, BUILD_PROBE_MIGRATIONS];

export class OrchestratorState {
  readonly miners: MinerStore;
  readonly runs: RunStore;
  readonly microbatches: MicrobatchStore;
  readonly claims: ClaimStore;
  readonly mergeRounds: MergeRoundStore;
  readonly ledger: Ledger;
  readonly spotChecks: SpotCheckStore;
  readonly garbage: BlobGarbage;
  readonly jobs: JobStore;
  readonly models: ModelStore;
  readonly datasets: DatasetStore;
  readonly escrows: EscrowStore;
  readonly deployments: DeploymentStore;
  readonly apiKeys: ApiKeyStore;
  readonly credits: CreditStore;
  readonly inferenceRequests: InferenceRequestStore;
  /** the dashboard's loss curves and status timelines */
  readonly lossPoints: LossPointStore;
  /** the network's key when the state is shared (PostgreSQL) */
  readonly identity: IdentityStore;
  readonly buildProbes: BuildProbeStore;

  private constructor(readonly db: StateDb) {
    this.miners = new MinerStore(db);
    this.runs = new RunStore(db);
    this.microbatches = new MicrobatchStore(db);
    this.claims = new ClaimStore(db);
    this.mergeRounds = new MergeRoundStore(db);
    this.ledger = new Ledger(db);
    this.spotChecks = new SpotCheckStore(db);
    this.garbage = new BlobGarbage(db);
    this.jobs = new JobStore(db);
    this.models = new ModelStore(db);
    this.datasets = new DatasetStore(db);
    this.escrows = new EscrowStore(db);
    this.deployments = new DeploymentStore(db);
    this.apiKeys = new ApiKeyStore(db);
    this.credits = new CreditStore(db);
    this.inferenceRequests = new InferenceRequestStore(db);
    this.lossPoints = new LossPointStore(db);
    this.identity = new IdentityStore(db);
    this.buildProbes = new BuildProbeStore(db);
  }

  /**
   * Opens (creating or migrating) the state:
   * - a file path: a SQLite file, the embedded default (':memory:' for a throwaway one);
   * - `postgres://user:password@host:port/database` (or `postgresql://`): that
   *   PostgreSQL database, with the same schema and migrations (its tables are
   *   created on first open). The connection is synchronous, like SQLite's
   *   (./pg-sync.ts); `options.timeoutMs` bounds each call (default 30 s);
   *   `options.fence` makes every write prove this process leads (./pg-driver.ts).
   * Throws 'unavailable' when PostgreSQL cannot be reached.
   */
  static open(target: string, options: PgDriverOptions = {}): OrchestratorState {
    return new OrchestratorState(new StateDb(isPostgresUrl(target) ? new PgDriver(target, options) : target, MIGRATIONS));
  }

  /** Runs fn in one transaction. */
  tx<T>(fn: () => T): T {
    return this.db.tx(fn);
  }

  close(): void {
    this.db.close();
  }
}

/** Whether `target` names a PostgreSQL database rather than a SQLite file. */
export function isPostgresUrl(target: string): boolean {
  return /^postgres(ql)?:\/\//i.test(target);
}
