// Starts an orchestrator: its state (a SQLite file in its data dir, or
// PostgreSQL: ./state/index.ts), the blob store (a
// folder in the data dir by default, or an S3 bucket: ./blobs/blob-store-url.ts), the
// coordinator, the HTTP API on a loopback port (by default), and the clock.
import { mkdirSync } from 'node:fs';
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { mobyDickBytes } from '../data/corpus.ts';
import { openBlobStore, type BlobStoreSpec } from './blobs/blob-store-url.ts';
import { Completions } from './serving/completions.ts';
import { Coordinator, type CoordinatorOptions } from './training/coordinator.ts';
import { DatasetService } from './jobs/datasets.ts';
import { chainModelRegistry, RegistrySync } from './models/deployment-registry.ts';
import { Epochs, type ChainOptions } from './rewards/epochs.ts';
import { buildApi } from './http.ts';
import { dashboardFeedOf, operatorLoginOf } from './routes/dashboard.ts';
import type { DashboardFeed } from './dashboard/feed.ts';
import { OperatorAuth } from './dashboard/auth.ts';
import { InferenceBilling, registryPrices } from './serving/billing.ts';
import { modelOfSha256 } from '../chain/registry.ts';
import { BuildProbes } from './serving/build-probe.ts';
import { InferenceChecks, type InferenceCheckOptions } from './serving/checks.ts';
import { DEFAULT_CHECKPOINT_RETENTION_MS, JobService } from './jobs/jobs.ts';
import { slashWindowMs } from './training/spot-checks.ts';
import { loadOrCreateOrchestratorIdentity, sharedOrchestratorIdentity, type OrchestratorIdentity } from './identity.ts';
import type { PgDriverOptions } from './state/pg-driver.ts';
import { OrchestratorState } from './state/index.ts';
import { SyntheticPrompts, type SyntheticOptions } from './serving/synthetic-prompts.ts';
import { ModelUploads } from './models/model-uploads.ts';
import { StoreBudget, type StoreBudgetOptions } from './blobs/store-budget.ts';
import { storagePaymentsOf } from './routes/storage.ts';
import { storedTokenizerBundle, type TokenizerBundleLookup } from './serving/tokenizers.ts';

/** How often unpublished models past their retention are collected. */
const MODEL_COLLECT_EVERY_MS = 10_000;

export interface OrchestratorOptions {
  dataDir: string;
  /** the state database (--db): a postgres:// URL or a SQLite file; absent: the file <dataDir>/orchestrator.sqlite */
  db?: string;
  /** how a PostgreSQL state is opened: its fence when several orchestrators share it (./cluster/member.ts), session settings */
  stateOptions?: PgDriverOptions;
  /** where the blobs are (--blobs: a folder or an S3 bucket, src/orchestrator/blobs/blob-store-url.ts); absent: the folder <dataDir>/blobs */
  blobs?: BlobStoreSpec;
  /** the data dir whose wallets (`<it>/wallets`) the dashboard's Wallets page shows; absent: none */
  walletsDataDir?: string;
  host?: string;
  /** 0 picks a free port */
  port?: number;
  coordinator?: Partial<CoordinatorOptions>;
  tickMs?: number;
  /** pay miners on this chain (epochs, settlement, minimum stake); without it the network runs unpaid */
  chain?: ChainOptions;
  /** an ended job's checkpoints are kept this long (default 3 days) */
  checkpointRetentionMs?: number;
  /** the model and dataset store's bounds and retention (--store-limit, --disk-reserve, --free-store, --model-retention: ./blobs/store-budget.ts) */
  storage?: Partial<Omit<StoreBudgetOptions, 'dir'>>;
  /** spot checks of inference: the share of windows recomputed, memory bounds (src/orchestrator/serving/checks.ts) */
  inferenceChecks?: Partial<InferenceCheckOptions>;
  /** synthetic traffic to the serving deployments (src/orchestrator/serving/synthetic-prompts.ts); absent: none */
  syntheticPrompts?: Partial<SyntheticOptions> & { rate: number };
  /** where a served model's tokenizer bundle is (src/orchestrator/serving/tokenizers.ts); absent: the model store's record names it */
  tokenizerBundle?: TokenizerBundleLookup;
  /** host names the dashboard is reached at besides its IP addresses and localhost (the advertised URL's, when it names one) */
  hostNames?: readonly string[];
  /** the key its cluster's members prove forwarded requests with (./cluster/lease.ts; absent: a client address forwarded is never believed) */
  forwardKey?: string;
  /** told each dashboard login URL made after the first (a login URL is good once, for a short while: ./dashboard/auth.ts) */
  onLoginUrl?: (url: string, why: string) => void;
}

export interface RunningOrchestrator {
  url: string;
  /** the dashboard's operator login URL, with its token (good once, for a short while: docs/dashboard.md); read again, a fresh one once it is spent */
  readonly loginUrl: string;
  coordinator: Coordinator;
  jobs: JobService;
  epochs: Epochs | null;
  /** the serving path of /v1/completions (observers: the inference work log, spot checks) */
  completions: Completions;
  /** API keys, reservations and charges of /v1/completions, and its work log (docs/inference.md, "Payment") */
  billing: InferenceBilling;
  /** spot checks of the inference steps miners serve */
  inferenceChecks: InferenceChecks;
  /** the synthetic traffic (null: --synthetic-prompts not given) */
  syntheticPrompts: SyntheticPrompts | null;
  /** the dashboard's live feed (its loss curves) */
  dashboard: DashboardFeed | null;
  /** Closes the epoch if due and settles what is settling, now (a no-op when unpaid). */
  settleNow(): Promise<void>;
  close(): Promise<void>;
}

export async function startOrchestrator(options: OrchestratorOptions): Promise<RunningOrchestrator> {
  mkdirSync(options.dataDir, { recursive: true });
  // first, so a bucket that is not there stops the start before anything is open
  const blobStore = await openBlobStore(options.blobs, options.dataDir);
  const blobs = blobStore.store;
  let state: OrchestratorState;
  let identity: OrchestratorIdentity;
  try {
    state = OrchestratorState.open(options.db ?? join(options.dataDir, 'orchestrator.sqlite'), options.stateOptions);
  } catch (err) {
    blobStore.close();
    throw err;
  }
  try {
    // a shared (PostgreSQL) state names the network itself: every orchestrator on it signs as one
    identity = state.db.engine === 'postgres' ? sharedOrchestratorIdentity(state.identity, options.dataDir) : loadOrCreateOrchestratorIdentity(options.dataDir);
  } catch (err) {
    state.close();
    blobStore.close();
    throw err;
  }
  const slashing = { ...options.coordinator?.slashing, enabled: Boolean(options.chain) };
  // with no chain no epoch ever covers the work log: its old entries are folded into sums without waiting for one
  const gc = { foldUnpaidWork: !options.chain, ...options.coordinator?.gc };
  const coordinator = new Coordinator(state, blobs, { ...options.coordinator, slashing, gc, identity });
  const epochs = options.chain
    ? new Epochs(state, { evict: (id, reason) => coordinator.evict(id, reason), ...options.chain }, Date.now, slashWindowMs(coordinator.checks.options))
    : null;
  if (epochs) {
    try {
      await epochs.start(); // finishes epochs a crash left 'settling' before anything else
    } catch (err) {
      state.close();
      blobStore.close();
      throw err;
    }
  }
  const jobs = new JobService(coordinator, { checkpointRetentionMs: options.checkpointRetentionMs ?? DEFAULT_CHECKPOINT_RETENTION_MS, slots: coordinator.slots, nimPerPetaflop: options.chain?.nimPerPetaflop });
  // an unused dataset is kept as long as an ended job's checkpoints
  const datasets = new DatasetService(state, coordinator.blobs, { retentionMs: options.checkpointRetentionMs ?? DEFAULT_CHECKPOINT_RETENTION_MS });
  const completions = new Completions(coordinator, { tokenizerBundle: options.tokenizerBundle ?? storedTokenizerBundle(state.models, coordinator.blobs) });
  // each deployed model run under both kernel builds: its checks' thresholds, and a refusal of one no check can hold, kept in the state (serving/build-probe.ts)
  const probes = new BuildProbes({ blobs: coordinator.blobs, store: state.buildProbes, engine: () => coordinator.verifier(), log: coordinator.log });
  const inferenceChecks = new InferenceChecks(
    { state, blobs: coordinator.blobs, engine: () => coordinator.verifier(), offences: coordinator.offences, log: coordinator.log, probes },
    options.inferenceChecks,
  );
  completions.observe(inferenceChecks.recorder);
  const chain = options.chain;
  const prices = chain ? registryPrices((sha256) => modelOfSha256(chain.client, sha256)) : null;
  const billing = new InferenceBilling(state, epochs?.credits ?? null, prices, (line) => console.error(`orchestrator: ${line}`));
  completions.observe(billing.observer());
  // synthetic requests are nobody's: unbilled, their rows logged as the miners' inference work
  const synthetic = options.syntheticPrompts
    ? new SyntheticPrompts(
        {
          serving: () => state.deployments.live(),
          generate: (d, r, aborted) => billing.unpaid(d, (onId) => completions.generate(d, r, () => {}, aborted, onId)),
          text: () => mobyDickBytes(),
          log: coordinator.log,
        },
        options.syntheticPrompts,
      )
    : null;
  // a login URL made after the first is told with the server's URL (known once it listens)
  let told = (_path: string, _why: string): void => {};
  const auth = new OperatorAuth(undefined, Date.now, { onLoginPath: (path, why) => told(path, why) });
  const host = options.host ?? '127.0.0.1';
  // the names a browser may reach it by besides IP addresses and localhost: the host it listens on, this machine's, the advertised
  const hostNames = [...(isIP(host) ? [] : [host]), hostname(), ...(options.hostNames ?? [])];
  // the store's bounds; the disk checked is the blob folder's (an S3 bucket's is not ours)
  const storage = new StoreBudget(state, storagePaymentsOf(epochs?.jobPayments ?? null), { ...options.storage, dir: (options.blobs ?? { kind: 'fs' }).kind === 'fs' ? blobStore.where : null });
  const published = chain ? async (sha256: string) => (await modelOfSha256(chain.client, `0x${sha256}`)) !== null : async () => false;
  let collecting: Promise<unknown> | null = null;
  const collectModels = (): void => {
    collecting ??= storage.collect(published).catch((err: unknown) => console.error(`orchestrator: collecting models failed: ${(err as Error).message}`)).finally(() => (collecting = null));
  };
  let modelsCollectedAt = 0;
  const uploads = new ModelUploads(join(options.dataDir, 'uploads'));
  const app = buildApi(coordinator, epochs, jobs, datasets, completions, billing, options.walletsDataDir ?? null, { auth, hostNames, forwardKey: options.forwardKey ?? null, storage, uploads, probes });
  // the ModelRegistry's deployed flag follows the deployments (paid networks)
  const registry = options.chain ? new RegistrySync(state, chainModelRegistry(options.chain), (line) => console.error(`orchestrator: ${line}`)) : null;
  await app.listen({ host, port: options.port ?? 0 });
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const timer = setInterval(() => {
    try {
      coordinator.tick();
      jobs.tick();
      datasets.tick();
      if (Date.now() - modelsCollectedAt > MODEL_COLLECT_EVERY_MS) {
        modelsCollectedAt = Date.now();
        collectModels();
      }
      inferenceChecks.tick();
      billing.writeProgress();
      void registry?.step();
    } catch (err) {
      console.error('orchestrator: tick failed:', err);
    }
  }, options.tickMs ?? 200);
  synthetic?.start();
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  told = (path, why) => (options.onLoginUrl ?? ((u: string, w: string) => console.error(`orchestrator: ${w}; the dashboard's next operator login URL: ${u}`)))(`${url}${path}`, why);
  return {
    url,
    get loginUrl() {
      return `${url}${operatorLoginOf(app) ?? '/'}`;
    },
    dashboard: dashboardFeedOf(app),
    coordinator,
    jobs,
    epochs,
    completions,
    billing,
    inferenceChecks,
    syntheticPrompts: synthetic,
    async settleNow() {
      // a pass already under way may have started before the last work arrived
      await epochs?.step();
      await epochs?.step();
    },
    async close() {
      clearInterval(timer);
      await synthetic?.close();
      jobs.closeStreams();
      await app.close();
      uploads.close();
      completions.close();
      await inferenceChecks.close();
      await probes.close();
      await jobs.settled();
      await collecting;
      await registry?.settled();
      await coordinator.close();
      if (epochs) {
        await epochs.stop();
        // pay for the work done up to now before leaving
        epochs.close(null, 0);
        await epochs.reconcile();
      }
      state.close();
      blobStore.close();
      await options.chain?.close?.();
    },
  };
}
