// The dashboard's routes (docs/dashboard.md): the page at `/` and its files
// under `/assets/` (../dashboard/static-files.ts), its live feed
// `GET /events` (server-sent events, ../dashboard/feed.ts), the loss curves
// recorded so far (`GET /runs/:id/loss`, `GET /jobs/:id/loss`), the data dir's
// wallets and their balances (`GET /wallets`, read-only), the operator's
// login (`GET /login?token=…` → an HttpOnly SameSite=Strict cookie, `GET
// /session`, `POST /logout`) and the operator's actions: submit a job (the
// operator's own, unpaid), upgrade a job, cancel a run or a job, deploy and
// undeploy a model, download a checkpoint. Reading is open to this machine (loopback)
// and to the logged-in operator; actions need the operator's cookie, sent
// from the dashboard's own origin. Every dashboard request must name this
// server in its Host (../dashboard/auth.ts, hostAllowed: a DNS-rebinding page
// names its own). Contracts in src/api/dashboard.ts.
import { Type } from '@sinclair/typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { CancelAnswer, LossHistory, SessionView, UpgradeAnswer, WalletsView } from '../../api/dashboard.ts';
import type { Address } from 'viem';
import type { ChainClient } from '../../chain/client.ts';
import { DeploymentView, DeployRequest } from '../../api/deployments.ts';
import { JobId, JobView } from '../../api/jobs.ts';
import { Sha256 } from '../../api/models.ts';
import { JobSpec } from '../../jobs/spec.ts';
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import { BINARY, type HttpServer } from '../../http/server.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { assembleCheckpoint } from '../training/checkpoint.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { BlobAccess } from '../blobs/access.ts';
import { OperatorAuth, hostAllowed, isLocalClient, LOGIN_TOKEN_MS } from '../dashboard/auth.ts';
import { DashboardFeed } from '../dashboard/feed.ts';
import { ASSET_NAME, StaticFiles } from '../dashboard/static-files.ts';
import type { JobService } from '../jobs/jobs.ts';
import type { OperatorDeployments } from './deployments.ts';
import { jobView } from './jobs.ts';

const RunParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_.:-]+$' }) });
const JobParams = Type.Object({ id: JobId });
const CheckpointParams = Type.Object({ id: JobId, step: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }) });
const ModelParams = Type.Object({ sha256: Sha256 });
const OperatorJobRequest = Type.Object({ spec: JobSpec }, { additionalProperties: false });
const AssetParams = Type.Object({ file: Type.String({ pattern: ASSET_NAME }) });
const LoginQuery = Type.Object({ token: Type.String({ minLength: 1, maxLength: 256 }) }, { additionalProperties: false });
/** What `GET /events` answers to a caller that does not ask for a stream: every section now. */
const Snapshot = Type.Object({}, { additionalProperties: true });

export interface DashboardOptions {
  jobs: JobService | null;
  /** whether this orchestrator pays miners on a chain */
  paid: boolean;
  /** the built page (default: dist/web) */
  webRoot?: string;
  /** the login token (default: a random one) */
  auth?: OperatorAuth;
  /** the wallets the Wallets page shows (../dashboard/wallets.ts); absent: none */
  wallets?: () => Promise<WalletsView>;
  /** the operator's deploy and undeploy (./deployments.ts); absent: none */
  deployments?: OperatorDeployments;
  /** who owns the jobs the operator submits: the orchestrator's chain account (the zero address on an unpaid network) */
  operatorAddress: Address;
  /** the orchestrator's chain, whose Staking contract the Network page's stakes are read from (null or absent: an unpaid network, none) */
  chain?: ChainClient | null;
  /** host names the dashboard is reached at besides IP addresses and localhost (the --host and advertised names) */
  hostNames?: readonly string[];
  /** the key a cluster member's forwarded requests are proven with (../dashboard/auth.ts; null or absent: none is believed) */
  forwardKey?: string | null;
  /** who may read which blob (../blobs/access.ts): the operator's downloads ask it too */
  access?: BlobAccess;
}

const logins = new WeakMap<HttpServer, OperatorAuth>();
const feeds = new WeakMap<HttpServer, DashboardFeed>();

/** The live feed of a server with dashboardRoutes (its loss curves: the benches fill one); null without. */
export function dashboardFeedOf(app: HttpServer): DashboardFeed | null {
  return feeds.get(app) ?? null;
}

/** The path (with its token) that logs the operator into the dashboard of a server with dashboardRoutes; null without. */
export function operatorLoginOf(app: HttpServer): string | null {
  return logins.get(app)?.loginPath ?? null;
}

export function dashboardRoutes(app: HttpServer, c: Coordinator, options: DashboardOptions): DashboardFeed {
  const auth = options.auth ?? new OperatorAuth();
  logins.set(app, auth);
  const files = new StaticFiles(options.webRoot);
  const feed = new DashboardFeed(c, options.jobs, options.paid, { chain: options.chain ?? null });
  // streams are ended before the server waits for its connections to close
  app.addHook('preClose', async () => feed.close());

  const isOperator = (req: FastifyRequest): boolean => auth.isOperator(req.headers.cookie);
  const forwardKey = options.forwardKey ?? null;
  /** The Host must name this server (a DNS-rebinding page's names its own site). */
  const ownHost = (req: FastifyRequest): void => {
    if (!hostAllowed(req.headers.host, options.hostNames)) {
      throw new NimbleError('bad_host', `the dashboard answers requests for this server's own addresses, not for ${JSON.stringify(String(req.headers.host ?? '').slice(0, 100))}: open it by its IP address or localhost`, 403);
    }
  };
  /** Reading: this machine, or the operator. */
  const reader = async (req: FastifyRequest): Promise<void> => {
    ownHost(req);
    if (!isLocalClient(req, forwardKey) && !isOperator(req)) throw new NimbleError('forbidden', 'the dashboard is open to this machine only: log in with the URL the orchestrator printed', 403);
  };
  /** Acting: the operator's cookie, on a request from the dashboard's own page (its Origin, or without one, a browser's Sec-Fetch-Site: same-origin). */
  const operator = async (req: FastifyRequest): Promise<void> => {
    ownHost(req);
    if (!isOperator(req)) throw new NimbleError('unauthorized', 'log in as the operator first (the login URL the orchestrator printed)', 401);
    const origin = `${req.protocol}://${req.host}`;
    const sameOrigin = req.headers.origin === undefined ? req.headers['sec-fetch-site'] === 'same-origin' : req.headers.origin === origin;
    if (req.method !== 'GET' && !sameOrigin) throw new NimbleError('forbidden', `an action must come from the dashboard page itself (${origin}), not from ${String(req.headers.origin ?? 'a request without an Origin').slice(0, 100)}`, 403);
  };
  const send = (reply: FastifyReply, file: { body: Buffer; headers: Record<string, string> }): FastifyReply => reply.headers(file.headers).send(file.body);

  app.get('/', { onRequest: reader }, async (_req, reply) => {
    const page = await files.page();
    if (!page) throw new NimbleError('not_built', 'the dashboard is not built: run npm run build (or npm run build:web)', 404);
    return send(reply, page);
  });
  app.get('/assets/:file', { onRequest: reader, schema: { params: AssetParams } }, async (req, reply) => {
    const file = await files.asset(req.params.file);
    if (!file) throw new NimbleError('not_found', `no dashboard file ${req.params.file}`);
    return send(reply, file);
  });

  // the token is exchanged for a cookie, once, and the browser sent on to a URL without it
  app.get('/login', { onRequest: async (req) => ownHost(req), schema: { querystring: LoginQuery } }, async (req, reply) => {
    const r = auth.login(req.query.token);
    if ('refused' in r) {
      if (r.refused === 'spent') {
        throw new NimbleError('token_spent', `this login URL was used already or has expired (each is good once, within ${LOGIN_TOKEN_MS / 60_000} minutes): use the new one the orchestrator printed`, 403);
      }
      throw new NimbleError('forbidden', 'wrong login token: use the login URL the orchestrator printed', 403);
    }
    return reply.status(303).headers({ 'set-cookie': OperatorAuth.cookie(r.session), location: '/', 'cache-control': 'no-store', 'referrer-policy': 'no-referrer' }).send();
  });
  app.get('/session', { schema: { response: { 200: SessionView } } }, async (req) => ({ operator: isOperator(req), paid: options.paid, operatorAddress: options.operatorAddress }));
  app.post('/logout', { schema: { response: { 200: SessionView } } }, async (req, reply) => {
    auth.logout(req.headers.cookie);
    void reply.header('set-cookie', OperatorAuth.clearCookie());
    return { operator: false, paid: options.paid, operatorAddress: options.operatorAddress };
  });

  // a stream when asked for one, else every section now as JSON
  app.get('/events', { onRequest: reader, schema: { response: { 200: Snapshot } } }, async (req, reply) => {
    if (!String(req.headers.accept ?? '').includes('text/event-stream')) return feed.snapshot();
    feed.open(reply.raw, { operator: isOperator(req) });
    return reply.hijack();
  });
  app.get('/runs/:id/loss', { onRequest: reader, schema: { params: RunParams, response: { 200: LossHistory } } }, async (req) => {
    if (!c.state.runs.get(req.params.id)) throw new NimbleError('not_found', `unknown run ${req.params.id}`);
    return feed.losses.get(`run:${req.params.id}`);
  });
  app.get('/wallets', { onRequest: reader, schema: { response: { 200: WalletsView } } }, async () => (options.wallets ? options.wallets() : { dir: null, chainId: null, wallets: [] }));
  app.get('/jobs/:id/loss', { onRequest: reader, schema: { params: JobParams, response: { 200: LossHistory } } }, async (req) => {
    if (!c.state.jobs.get(req.params.id)) throw new NimbleError('not_found', `unknown job ${req.params.id}`);
    return feed.losses.get(`job:${req.params.id}`);
  });

  // the operator cancels any run; a job's run is cancelled by cancelling its job (else the job would start another)
  app.post('/operator/runs/:id/cancel', { onRequest: operator, schema: { params: RunParams, response: { 200: CancelAnswer } } }, async (req) => {
    const run = c.state.runs.get(req.params.id);
    if (!run) throw new NimbleError('not_found', `unknown run ${req.params.id}`);
    const jobId = c.state.jobs.jobOfRun(run.id);
    if (jobId && options.jobs) return cancelJob(options.jobs, jobId);
    if (FINAL_RUN_STATUSES.includes(run.status)) throw new NimbleError('conflict', `run ${run.id} has ended (${run.status})`);
    c.stopRun(run.id, 'cancelled by the operator (dashboard)');
    const after = c.state.runs.get(run.id)!;
    return { kind: 'run' as const, id: after.id, status: after.status, message: after.message };
  });
  app.post('/operator/jobs/:id/cancel', { onRequest: operator, schema: { params: JobParams, response: { 200: CancelAnswer } } }, async (req) => {
    if (!options.jobs) throw new NimbleError('not_found', 'this orchestrator takes no jobs');
    return cancelJob(options.jobs, req.params.id);
  });

  // the operator upgrades any job onto the default group, as its owner may with nbcli job upgrade
  app.post('/operator/jobs/:id/upgrade', { onRequest: operator, schema: { params: JobParams, response: { 200: UpgradeAnswer } } }, async (req) => {
    if (!options.jobs) throw new NimbleError('not_found', 'this orchestrator takes no jobs');
    const { job, to } = options.jobs.upgradeAsOperator(req.params.id);
    return { id: job.id, status: job.status, stages: to.stages, replicas: to.replicas, message: job.message };
  });

  // the operator submits a job of its own: unpaid (miners earn emission), so a spec with a budget is refused on a paid network
  app.post('/operator/jobs', { onRequest: operator, schema: { body: OperatorJobRequest, response: { 201: JobView } } }, async (req, reply) => {
    const jobs = options.jobs;
    if (!jobs) throw new NimbleError('not_found', 'this orchestrator takes no jobs');
    const { spec } = req.body;
    if (options.paid && jobs.check(spec, options.operatorAddress).budgetWei !== null) {
      throw new NimbleError('invalid', "a job submitted from the dashboard is the operator's and pays nothing (miners earn the emission): remove its budget, or submit it with nbcli job submit to pay from a wallet's escrow");
    }
    const job = jobs.submit(spec, options.operatorAddress);
    c.state.jobs.note(job.id, 'submitted by the operator (dashboard)', Date.now());
    void reply.status(201);
    return jobView(c, c.state.jobs.get(job.id)!);
  });

  // the operator deploys any stored model (published, on a paid network) for its owner, and undeploys any
  app.post('/operator/models/:sha256/deploy', { onRequest: operator, schema: { params: ModelParams, body: DeployRequest, response: { 200: DeploymentView } } }, async (req) => {
    if (!options.deployments) throw new NimbleError('not_found', 'this orchestrator deploys no models');
    return options.deployments.deploy(req.params.sha256, req.body ?? {});
  });
  app.post('/operator/models/:sha256/undeploy', { onRequest: operator, schema: { params: ModelParams, response: { 200: DeploymentView } } }, async (req) => {
    if (!options.deployments) throw new NimbleError('not_found', 'this orchestrator deploys no models');
    return options.deployments.undeploy(req.params.sha256);
  });

  // downloads: the operator may read every checkpoint its orchestrator holds
  app.get('/operator/runs/:id/checkpoint', { onRequest: operator, schema: { params: RunParams } }, async (req, reply) => {
    options.access?.authorizeRun({ kind: 'operator' }, req.params.id);
    const bytes = await assembleCheckpoint(c.state, c.blobs, req.params.id);
    void reply.headers({ 'content-type': BINARY, 'content-disposition': `attachment; filename="${req.params.id}.safetensors"`, 'cache-control': 'no-store' });
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });
  app.get('/operator/jobs/:id/checkpoints/:step', { onRequest: operator, schema: { params: CheckpointParams } }, async (req, reply) => {
    const cp = c.state.jobs.checkpoints(req.params.id).find((x) => x.step === req.params.step);
    if (!cp) throw new NimbleError('not_found', `job ${req.params.id} has no checkpoint at step ${req.params.step}`);
    await options.access?.authorize({ kind: 'operator' }, cp.blob);
    void reply.headers({ 'content-type': BINARY, 'content-disposition': `attachment; filename="${cp.jobId}-step${cp.step}.safetensors"`, 'x-content-sha256': cp.blob, 'cache-control': 'no-store' });
    return Buffer.from(await c.blobs.get(cp.blob));
  });
  feeds.set(app, feed);
  return feed;
}

function cancelJob(jobs: JobService, id: string): CancelAnswer {
  const job = jobs.cancelAsOperator(id, 'cancelled by the operator (dashboard)');
  return { kind: 'job', id: job.id, status: job.status, message: job.message };
}
