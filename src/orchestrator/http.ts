// The orchestrator's HTTP API: the public routes (./routes/public.ts), the
// developers' job routes (./routes/jobs.ts), the model store
// (./routes/models.ts) and its deployments (./routes/deployments.ts), the
// OpenAI-compatible serving path (./routes/completions.ts) paid with API keys
// and prepaid credit (./routes/credits.ts), the dataset store (./routes/datasets.ts) and the miners' signed routes
// (./routes/miners.ts), and the dashboard (./routes/dashboard.ts) on the shared server of
// src/http/server.ts. A miner's malformed signed request (400, 413, 415)
// counts as invalid work of its signer; one that proves it cheated is an
// offence (src/orchestrator/rewards/offences.ts).
import { zeroAddress } from 'viem';
import { createHttpServer, type HttpServer } from '../http/server.ts';
import { AuthError } from '../protocol/errors.ts';
import { RequestVerifier } from '../protocol/signing.ts';
import { Completions } from './serving/completions.ts';
import type { Coordinator } from './training/coordinator.ts';
import { DatasetService } from './jobs/datasets.ts';
import type { Epochs } from './rewards/epochs.ts';
import { chainModelRegistry } from './models/deployment-registry.ts';
import { OffenceError } from './rewards/offences.ts';
import type { JobService } from './jobs/jobs.ts';
import { datasetRoutes } from './routes/datasets.ts';
import { completionRoutes } from './routes/completions.ts';
import { dashboardRoutes } from './routes/dashboard.ts';
import { creditRoutes } from './routes/credits.ts';
import { InferenceBilling } from './serving/billing.ts';
import type { BuildProbes } from './serving/build-probe.ts';
import { deploymentRoutes } from './routes/deployments.ts';
import { jobRoutes } from './routes/jobs.ts';
import { MAX_UPLOAD_BYTES, minerRoutes } from './routes/miners.ts';
import { modelRoutes } from './routes/models.ts';
import { storagePaymentsOf, storageRoutes } from './routes/storage.ts';
import type { ModelUploads } from './models/model-uploads.ts';
import { StoreBudget } from './blobs/store-budget.ts';
import { publicRoutes } from './routes/public.ts';
import { readWallets } from './dashboard/wallets.ts';
import { OperatorAuth, clientAddressOf } from './dashboard/auth.ts';
import { BlobAccess, publicationOf } from './blobs/access.ts';

/** Refusals that count as the signer's invalid work: a malformed, oversized or mistyped request. */
const MALFORMED = new Set([400, 413, 415]);

/** Largest JSON body (a heartbeat with thousands of reports stays below it). */
export const MAX_JSON_BYTES = 1 << 20;

/** How the API knows its readers: the operator's login, the names it is reached at, the key of a cluster's forwarded requests. */
export interface ApiOptions {
  /** the operator's login (default: a new token) */
  auth?: OperatorAuth;
  /** host names the dashboard is reached at besides IP addresses and localhost */
  hostNames?: readonly string[];
  /** the key a cluster member proves its forwarded requests with (src/orchestrator/cluster/forwarder.ts; absent: none is believed) */
  forwardKey?: string | null;
  /** the store's bounds and prices (default: the default bounds, no disk check) */
  storage?: StoreBudget;
  /** large model files' uploads in chunks (absent: only POST /models/file, up to its limit) */
  uploads?: ModelUploads;
  /** the cross-build probe a model passes before it deploys (default: none) */
  probes?: BuildProbes;
}

export function buildApi(
  coordinator: Coordinator, epochs: Epochs | null = null, jobs: JobService | null = null, datasets: DatasetService | null = null, completions: Completions = new Completions(coordinator),
  billing: InferenceBilling | null = null,
  /** the data dir whose wallets the dashboard shows (null: none) */
  walletsDataDir: string | null = null,
  options: ApiOptions = {},
): HttpServer {
  if (!billing) {
    billing = new InferenceBilling(coordinator.state, epochs?.credits ?? null, null);
    completions.observe(billing.observer());
  }
  // requests are bound to this network, and (the nonces of earlier ones being forgotten) to this run of the server
  const verifier = new RequestVerifier({ domain: coordinator.identity.domain, notBefore: Date.now(), sessionKeyOf: (a) => coordinator.sessionKeyOf(a) });
  const app = createHttpServer({
    bodyLimit: MAX_JSON_BYTES,
    // the bodies being received at once: one 256 MiB upload per signer and four in all, as before stage states took up to 2 GiB;
    // a larger state (its stage's size, MAX_STATE_BYTES at most) is taken when no other large body is under way
    bodyBudget: { perSigner: MAX_UPLOAD_BYTES, total: 4 * MAX_UPLOAD_BYTES },
    verifier,
    onRefused: (req, err) => {
      // a malformed request is provably its signer's fault; a 403, 404 or 409 can be an honest race with the orchestrator's state
      if (!req.signer || err instanceof AuthError || !MALFORMED.has(err.status) || !coordinator.state.miners.get(req.signer)) return;
      const detail = `${req.method} ${req.url.slice(0, 120)}: ${err.message.slice(0, 200)}`;
      const minerId = req.signer;
      const now = Date.now();
      if (err instanceof OffenceError) {
        // work no honest miner could send (src/orchestrator/rewards/offences.ts)
        coordinator.state.tx(() => coordinator.offences.charge({ ...err.offence, minerId, kind: 'invalid', detail, key: `${err.offence.key} by ${minerId}` }, now));
      } else coordinator.state.ledger.logWork({ minerId, runId: null, kind: 'invalid', detail }, now);
    },
    onFailure: (req, err) => console.error(`orchestrator: ${req.method} ${req.url}:`, err.cause ?? err),
  });
  const registry = epochs?.chain ? chainModelRegistry(epochs.chain) : null;
  // who may read which blob's bytes: one decision for every route that serves them
  const access = new BlobAccess(coordinator.state, registry ? publicationOf(registry) : null);
  const auth = options.auth ?? new OperatorAuth();
  const forwardKey = options.forwardKey ?? null;
  publicRoutes(app, coordinator, epochs?.chain ?? null, access);
  minerRoutes(app, coordinator, epochs, access);
  if (jobs) jobRoutes(app, coordinator, jobs, epochs?.jobPayments ?? null, access, { isOperator: (req) => auth.isOperator(req.headers.cookie), clientOf: (req) => clientAddressOf(req, forwardKey) });
  const storage = options.storage ?? new StoreBudget(coordinator.state, storagePaymentsOf(epochs?.jobPayments ?? null));
  modelRoutes(app, coordinator, epochs?.chain ?? null, access, storage, options.uploads ?? null);
  storageRoutes(app, coordinator, storage);
  const deployments = deploymentRoutes(app, coordinator, registry, options.probes ?? null);
  completionRoutes(app, coordinator, completions, billing);
  creditRoutes(app, coordinator.state, billing, epochs?.credits ?? null, epochs?.chain.client ?? null);
  datasetRoutes(app, coordinator, datasets ?? new DatasetService(coordinator.state, coordinator.blobs), storage);
  dashboardRoutes(app, coordinator, {
    jobs,
    paid: epochs !== null,
    wallets: () => readWallets(walletsDataDir, epochs?.chain.client ?? null),
    deployments,
    operatorAddress: epochs?.chain.signer.account.address ?? zeroAddress,
    chain: epochs?.chain.client ?? null,
    auth,
    hostNames: options.hostNames,
    forwardKey,
    access,
  });
  return app;
}
