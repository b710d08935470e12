// The job routes (docs/jobs.md): submit, list, follow (server-sent events),
// cancel, and the job's checkpoints (list; download by its owner, with HTTP
// ranges so an interrupted download resumes). Contracts in src/api/jobs.ts.
// A job is its developer's: its reads show the whole job only to a request
// signed by its owner (and to the dashboard's operator); anyone else gets the
// public part, what a network's status page needs (PublicJobView: counts and
// states; status events without their messages). The list is paginated; the
// event streams are bounded per client address and per signer as well as in
// all; a job's plan is made again only when the miners alive change.
import { Type } from '@sinclair/typebox';
import type { FastifyRequest } from 'fastify';
import {
  CheckJobRequest,
  CheckpointList,
  EscrowRelease,
  JOB_PAGE_DEFAULT,
  JOB_PAGE_MAX,
  JobCheck,
  JobCursor,
  JobEntry,
  JobId,
  JobPage,
  JobTerms,
  JobView,
  KeepQuote,
  KeepRequest,
  SubmitJobRequest,
  UpgradeJobRequest,
  type CheckpointView,
  type JobEvent,
  type JobPaymentView,
  type PublicJobView,
} from '../../api/jobs.ts';
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import type { HttpServer } from '../../http/server.ts';
import { isFinalJobStatus } from '../../jobs/status.ts';
import { JobPlan } from '../../jobs/plan-schema.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { blobReaderOf, type BlobAccess } from '../blobs/access.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { JobPayments } from '../jobs/job-payments.ts';
import { GAS_LIMITS, SlidingWindow } from '../rewards/gas.ts';
import type { JobService } from '../jobs/jobs.ts';
import type { EscrowRecord, JobPaymentRecord } from '../state/escrows.ts';
import { formatNim } from '../../chain/amounts.ts';
import type { JobCheckpointRecord, JobRecord } from '../state/jobs.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ id: JobId });
const CheckpointParams = Type.Object({ id: JobId, step: Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }) });
const Owner = Type.Optional(Type.String({ pattern: '^0x[0-9a-fA-F]{40}$' }));
const ListQuery = Type.Object({ owner: Owner, limit: Type.Optional(Type.Integer({ minimum: 1, maximum: JOB_PAGE_MAX })), cursor: Type.Optional(JobCursor) });
const After = Type.Object({ after: Type.Optional(Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })) });
const EscrowParams = Type.Object({ escrowId: Type.String({ pattern: '^0x[0-9a-fA-F]{64}$' }) });
const Days = Type.Object({ days: KeepRequest.properties.days });
const DAY_MS = 86_400_000;
/** A comment line keeps an idle event stream open through proxies and the server's idle timeout. */
const KEEPALIVE_MS = 15_000;
/** Event streams open at once, all jobs together: past it a new one is refused (503) rather than each holding memory and a listener. */
export const MAX_EVENT_STREAMS = 256;
/** Event streams one client address holds at once (past it: 429), so that no client takes every slot. */
export const MAX_EVENT_STREAMS_PER_CLIENT = 16;
/** Event streams one signer holds at once, from any address (past it: 429). */
export const MAX_EVENT_STREAMS_PER_SIGNER = 8;
/** Plans kept (the newest per job, for the miners alive when it was made). */
const PLANS_KEPT = 256;

/** Who reads a job route, as the dashboard knows it (./dashboard.ts, ../dashboard/auth.ts). */
export interface JobReaders {
  /** whether the request carries the dashboard operator's login */
  isOperator(req: FastifyRequest): boolean;
  /** the client's address (a follower's client when a cluster member forwarded it) */
  clientOf(req: FastifyRequest): string;
}
/** Progress events at most this often per stream. */
const PROGRESS_EVERY_MS = 1000;

export function checkpointView(c: JobCheckpointRecord): CheckpointView {
  return { jobId: c.jobId, step: c.step, tokens: c.tokens, loss: c.loss, heldoutLoss: c.heldoutLoss, heldoutAccuracy: c.heldoutAccuracy, sha256: c.blob, bytes: c.bytes, createdAt: c.createdAt, expiresAt: c.expiresAt };
}

export function jobView(c: Coordinator, job: JobRecord): JobView {
  const run = job.runId ? c.state.runs.get(job.runId) : undefined;
  const rate = run && !FINAL_RUN_STATUSES.includes(run.status) ? c.microbatches.tokensPerSecond(run.id) : 0;
  const tokensPerStep = job.step > 0 ? job.tokens / job.step : 0;
  const etaMs = rate > 0 && tokensPerStep > 0 ? Math.round((((job.steps - job.step) * tokensPerStep) / rate) * 1000) : null;
  return {
    id: job.id,
    name: job.name,
    owner: job.owner,
    status: job.status,
    spec: job.spec,
    runId: job.runId,
    steps: job.steps,
    step: job.step,
    tokens: job.tokens,
    loss: job.loss,
    tokensPerSecond: rate,
    etaMs,
    message: job.message,
    createdAt: job.createdAt,
    startedAt: job.startedAt,
    endedAt: job.endedAt,
    lastProgressAt: job.lastProgressAt,
    timeoutAt: job.timeoutAt,
    idleTimeoutMs: job.idleTimeoutMs,
    upgrade: job.upgrade,
    checkpoints: c.state.jobs.checkpoints(job.id).map(checkpointView),
    payment: paymentView(c.state.escrows.get(job.id), c.state.escrows.payments({ jobId: job.id })),
  };
}

/** What anyone sees of a job. */
export function publicJobView(c: Coordinator, job: JobRecord): PublicJobView {
  const run = job.runId ? c.state.runs.get(job.runId) : undefined;
  const rate = run && !FINAL_RUN_STATUSES.includes(run.status) ? c.microbatches.tokensPerSecond(run.id) : 0;
  return {
    id: job.id,
    status: job.status,
    steps: job.steps,
    step: job.step,
    tokens: job.tokens,
    tokensPerSecond: rate,
    createdAt: job.createdAt,
    startedAt: job.startedAt,
    endedAt: job.endedAt,
    checkpoints: c.state.jobs.checkpoints(job.id).length,
  };
}

/** What anyone sees of a job's history: its status changes, without their messages. */
function publicEvents(events: JobEvent[]): JobEvent[] {
  return events.filter((e) => e.kind === 'status').map((e) => ({ ...e, message: '' }));
}

function paymentView(e: EscrowRecord | undefined, payments: readonly JobPaymentRecord[]): JobPaymentView | null {
  if (!e) return null;
  return {
    escrowId: e.escrowId,
    budget: e.amount,
    committed: e.committed,
    refunded: e.refunded,
    status: e.status,
    nimPerPetaflop: e.price,
    spent: e.spent === 1,
    ...paymentHealth(e, payments),
  };
}

/** How the escrow's chain calls go: its lock, and the payment or call failing now (with its backoff), if any. */
function paymentHealth(e: EscrowRecord, payments: readonly JobPaymentRecord[]): Pick<JobPaymentView, 'lockedUntil' | 'unpaid' | 'failing'> {
  const unpaid = payments.filter((p) => p.status === 'unpaid').reduce((a, p) => a + BigInt(p.total), 0n);
  const failing = payments.find((p) => p.status === 'pending' && p.error !== null);
  return {
    lockedUntil: e.status === 'closed' ? null : e.lockedUntil,
    unpaid: unpaid.toString(),
    failing: failing
      ? { what: `epoch ${failing.epoch}`, error: failing.error!, attempts: failing.attempts, retryAt: failing.retryAt }
      : e.status !== 'closed' && e.error !== null
        ? { what: 'escrow', error: e.error, attempts: e.attempts, retryAt: e.retryAt }
        : null,
  };
}

/** What keeping an ended job's checkpoints until `days` after it ended adds (GB-days beyond their current expiry) and costs. */
function keepQuote(c: Coordinator, payments: JobPayments | null, job: JobRecord, days: number, now: number): KeepQuote {
  if (job.endedAt === null) throw new NimbleError('conflict', `job ${job.id} has not ended: its checkpoints are kept while it runs and for the retention after; extend them once it has ended`);
  const until = job.endedAt + days * DAY_MS;
  const kept = c.state.jobs.checkpoints(job.id);
  const bytes = kept.reduce((a, cp) => a + cp.bytes, 0);
  const byteDays = kept.reduce((a, cp) => a + cp.bytes * Math.max(0, until - Math.max(cp.expiresAt ?? now, now)), 0) / DAY_MS;
  const price = payments ? payments.storagePrice(byteDays, 1) : 0n;
  return { days, until, bytes, gbDays: byteDays / 1e9, price: price.toString(), payee: payments?.terms().payee ?? null };
}

export function jobRoutes(app: HttpServer, c: Coordinator, jobs: JobService, payments: JobPayments | null, access: BlobAccess, readers: JobReaders): void {
  const releases = new SlidingWindow(GAS_LIMITS.escrowReleasesPerOwner);
  let streams = 0;
  const streamsOf = { client: new Map<string, number>(), signer: new Map<string, number>() };
  const find = (id: string): JobRecord => {
    const job = c.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    return job;
  };
  /** Whether the request may see the whole job: signed by its owner, or the operator's. */
  const whole = (req: FastifyRequest, job: JobRecord): boolean => (req.signer !== undefined && req.signer.toLowerCase() === job.owner.toLowerCase()) || readers.isOperator(req);
  const entry = (req: FastifyRequest, job: JobRecord): JobEntry => (whole(req, job) ? jobView(c, job) : publicJobView(c, job));
  const owned = (req: FastifyRequest, id: string, what: string): JobRecord => {
    const job = find(id);
    if (!whole(req, job)) throw new NimbleError('forbidden', `the ${what} of ${job.id} are its owner's: sign the request with its key`, 403);
    return job;
  };
  /** Takes an event stream's slot for the request's client and signer (released by the function returned), or refuses it. */
  const takeStream = (req: FastifyRequest): (() => void) => {
    if (streams >= MAX_EVENT_STREAMS) throw new NimbleError('overloaded', `${MAX_EVENT_STREAMS} event streams are open; try again later`, 503);
    const keys: [Map<string, number>, string, number, string][] = [[streamsOf.client, readers.clientOf(req), MAX_EVENT_STREAMS_PER_CLIENT, 'from your address']];
    if (req.signer) keys.push([streamsOf.signer, req.signer.toLowerCase(), MAX_EVENT_STREAMS_PER_SIGNER, `signed by ${req.signer}`]);
    for (const [map, key, max, who] of keys) if ((map.get(key) ?? 0) >= max) throw new NimbleError('rate_limited', `${max} event streams ${who} are open; close one first`, 429);
    streams++;
    for (const [map, key] of keys) map.set(key, (map.get(key) ?? 0) + 1);
    return () => {
      streams--;
      for (const [map, key] of keys) {
        const n = (map.get(key) ?? 1) - 1;
        if (n > 0) map.set(key, n);
        else map.delete(key);
      }
    };
  };
  /** job id → its last plan, and the miners alive it was made for */
  const plans = new Map<string, { miners: string; plan: JobPlan }>();
  const plan = (id: string): JobPlan => {
    const miners = c.state.miners.list(true).map((m) => `${m.id}@${m.joinedAt}`).sort().join(',');
    const kept = plans.get(id);
    if (kept && kept.miners === miners) return kept.plan;
    const made = jobs.plan(id);
    plans.delete(id);
    if (plans.size >= PLANS_KEPT) plans.delete(plans.keys().next().value!);
    plans.set(id, { miners, plan: made });
    return made;
  };
  const reads = { config: { mayBeSigned: true } } as const;

  app.get('/jobs/terms', { schema: { response: { 200: JobTerms } } }, async () => ({ payment: payments?.terms() ?? null }));
  app.post('/jobs/check', { config: developer, schema: { body: CheckJobRequest, response: { 200: JobCheck } } }, async (req) => {
    const job = jobs.check(req.body.spec, signerOf(req));
    return { steps: job.steps, escrow: payments && job.budgetWei !== null ? job.budgetWei.toString() : null };
  });
  app.post('/jobs', { config: developer, schema: { body: SubmitJobRequest, response: { 201: JobView } } }, async (req, reply) => {
    const owner = signerOf(req);
    const { spec, escrow } = req.body;
    const { budgetWei: budget, offer, timeoutMs } = jobs.check(spec, owner);
    let job: JobRecord;
    if (!payments || budget === null) {
      if (escrow) throw new NimbleError('invalid', payments ? 'the spec has no budget, so no escrow pays for it: drop the escrow or give a budget' : 'this network is not paid: submit without an escrow');
      job = jobs.submit(spec, owner);
    } else {
      if (!escrow) {
        const t = payments.terms();
        throw new NimbleError('payment_required', `this network is paid: escrow the job's budget of ${formatNim(budget)} NIM on JobEscrow ${t.jobEscrow} (chain ${t.chainId}) and submit with its id (nbcli job submit does both)`, 402);
      }
      job = await payments.locked(escrow, async () => {
        // checked on chain and locked there: from now its owner cannot close it while the job runs or its work is unpaid
        const checked = await payments.acceptEscrow(escrow, owner, budget, timeoutMs);
        // its work is paid at what it offers, never below the network's price
        return jobs.submit(spec, owner, { ...checked, nimPerPetaflop: Math.max(payments.nimPerPetaflop, offer ?? 0) });
      });
    }
    void reply.status(201);
    return jobView(c, job);
  });
  app.post('/escrows/:escrowId/release', { config: developer, schema: { params: EscrowParams, response: { 200: EscrowRelease } } }, async (req) => {
    if (!payments) throw new NimbleError('not_found', 'this network is not paid: it holds no escrows');
    const id = req.params.escrowId;
    const by = signerOf(req);
    // each release is a JobEscrow transaction the orchestrator pays for: a few an hour per owner (rewards/gas.ts)
    const what = `${by} released ${releases.count(by.toLowerCase())} escrows in the last hour, each a transaction the orchestrator pays`;
    const r = await releases.spend(by.toLowerCase(), what, () => payments.locked(id, () => payments.release(id, by)), (x) => x.tx !== null);
    return { escrowId: r.escrowId, refunded: r.refunded.toString(), alreadyClosed: r.alreadyClosed, tx: r.tx };
  });
  // newest first, a page at a time; the whole of the signer's own jobs, the public part of the others' (whose they are is not said)
  app.get('/jobs', { ...reads, schema: { querystring: ListQuery, response: { 200: JobPage } } }, async (req) => {
    // who owns which job is the owner's: a list of one owner's jobs is its own (or the operator's) to ask for
    const owner = req.query.owner;
    if (owner && !(req.signer?.toLowerCase() === owner.toLowerCase() || readers.isOperator(req))) {
      throw new NimbleError('forbidden', `the list of ${owner}'s jobs is its own: sign the request with its key`, 403);
    }
    const limit = req.query.limit ?? JOB_PAGE_DEFAULT;
    const cursor = req.query.cursor;
    const after = cursor ? { createdAt: Number(cursor.slice(0, cursor.indexOf('.'))), id: cursor.slice(cursor.indexOf('.') + 1) } : undefined;
    const page = c.state.jobs.page({ owner: req.query.owner, after, limit: limit + 1 });
    const shown = page.slice(0, limit);
    const last = shown.at(-1);
    return { jobs: shown.map((j) => entry(req, j)), next: page.length > limit && last ? `${last.createdAt}.${last.id}` : null };
  });
  app.get('/jobs/:id', { ...reads, schema: { params: Params, response: { 200: JobEntry } } }, async (req) => entry(req, find(req.params.id)));
  // what the job needs and which of the miners alive now would train it (as nbcli job plan plans a spec): made again only when they change
  app.get('/jobs/:id/plan', { schema: { params: Params, response: { 200: JobPlan } } }, async (req) => plan(find(req.params.id).id));
  app.post('/jobs/:id/cancel', { config: developer, schema: { params: Params, response: { 200: JobView } } }, async (req) => jobView(c, jobs.cancel(req.params.id, signerOf(req))));
  app.post('/jobs/:id/upgrade', { config: developer, schema: { params: Params, body: UpgradeJobRequest, response: { 200: JobView } } }, async (req) => {
    const { stages, replicas } = req.body;
    if ((stages === undefined) !== (replicas === undefined)) throw new NimbleError('invalid', 'give both stages and replicas, or neither (the orchestrator chooses)');
    const layout = stages !== undefined && replicas !== undefined ? { stages, replicas } : undefined;
    return jobView(c, jobs.upgrade(req.params.id, signerOf(req), layout));
  });
  app.get('/jobs/:id/checkpoints', { ...reads, schema: { params: Params, response: { 200: CheckpointList } } }, async (req) => c.state.jobs.checkpoints(owned(req, req.params.id, 'checkpoints').id).map(checkpointView));
  app.get('/jobs/:id/checkpoints/keep', { ...reads, schema: { params: Params, querystring: Days, response: { 200: KeepQuote } } }, async (req) => keepQuote(c, payments, owned(req, req.params.id, 'checkpoints'), req.query.days, Date.now()));
  // on a paid network, keeping longer is paid first: a NIM transfer to the orchestrator of at least the quote
  app.post('/jobs/:id/checkpoints/keep', { config: developer, schema: { params: Params, body: KeepRequest, response: { 200: CheckpointList } } }, async (req) => {
    const job = find(req.params.id);
    const by = signerOf(req);
    if (job.owner !== by) throw new NimbleError('forbidden', `job ${job.id} is not ${by}'s`);
    const quote = keepQuote(c, payments, job, req.body.days, Date.now());
    const price = BigInt(quote.price);
    if (payments && price > 0n) {
      if (!req.body.payment) throw new NimbleError('payment_required', `keeping ${(quote.bytes / 1e6).toFixed(1)} MB of checkpoints until ${new Date(quote.until).toISOString()} costs ${formatNim(price)} NIM: transfer it to ${quote.payee} and send the transaction's hash (nbcli checkpoint keep does both)`, 402);
      await payments.checkStoragePayment(req.body.payment, by, price, { jobId: job.id, days: req.body.days });
    }
    jobs.keepCheckpoints(job.id, by, quote.until);
    return c.state.jobs.checkpoints(job.id).map(checkpointView);
  });

  // a checkpoint is its owner's (../blobs/access.ts); a Range request resumes a download
  app.get('/jobs/:id/checkpoints/:step', { config: developer, schema: { params: CheckpointParams } }, async (req, reply) => {
    const job = find(req.params.id);
    if (job.owner !== signerOf(req)) throw new NimbleError('forbidden', `the checkpoints of ${job.id} are its owner's`);
    const cp = c.state.jobs.checkpoints(job.id).find((x) => x.step === req.params.step);
    if (!cp) throw new NimbleError('not_found', `job ${job.id} has no checkpoint at step ${req.params.step}`);
    await access.authorize(blobReaderOf(req.verified), cp.blob);
    const range = parseRange(req.headers.range, cp.bytes);
    void reply.header('content-type', 'application/octet-stream').header('accept-ranges', 'bytes').header('etag', `"${cp.blob}"`).header('x-content-sha256', cp.blob);
    if (!range) return Buffer.from(await c.blobs.get(cp.blob));
    const bytes = await c.blobs.getRange(cp.blob, range.start, range.end);
    void reply.status(206).header('content-range', `bytes ${range.start}-${range.end - 1}/${cp.bytes}`);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  });

  // the history, then every new event as it happens: text/event-stream when asked for, else the history as JSON (the whole to
  // its owner, the status changes to anyone)
  app.get('/jobs/:id/events', { ...reads, schema: { params: Params, querystring: After } }, async (req, reply) => {
    const job = find(req.params.id);
    const mine = whole(req, job);
    const eventsOf = (afterSeq: number): JobEvent[] => (mine ? c.state.jobs.events(job.id, afterSeq) : publicEvents(c.state.jobs.events(job.id, afterSeq)));
    let after = req.query.after ?? 0;
    if (!String(req.headers.accept ?? '').includes('text/event-stream')) {
      const list: JobEvent[] = eventsOf(after);
      return reply.type('application/json').send(JSON.stringify(list));
    }
    const release = takeStream(req);
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store', connection: 'keep-alive' });
    let progressAt = 0;
    let timer: NodeJS.Timeout | null = null;
    const send = (): void => {
      const all = c.state.jobs.events(job.id, after);
      for (const e of mine ? all : publicEvents(all)) res.write(`id: ${e.seq}\nevent: ${e.kind}\ndata: ${JSON.stringify(e)}\n\n`);
      if (all.length) after = all.at(-1)!.seq;
      const now = Date.now();
      const fresh = c.state.jobs.get(job.id);
      if (fresh && now - progressAt >= PROGRESS_EVERY_MS) {
        progressAt = now;
        const v = jobView(c, fresh);
        const progress = mine ? { loss: v.loss, etaMs: v.etaMs } : { loss: null, etaMs: null };
        res.write(`event: progress\ndata: ${JSON.stringify({ status: v.status, step: v.step, steps: v.steps, tokens: v.tokens, tokensPerSecond: v.tokensPerSecond, ...progress })}\n\n`);
      }
      if (fresh && isFinalJobStatus(fresh.status)) {
        res.write('event: end\ndata: {}\n\n');
        close();
      }
    };
    const onChange = (id: string): void => {
      if (id !== job.id) return;
      // progress comes often: coalesce it into one write per PROGRESS_EVERY_MS
      if (!timer) timer = setTimeout(() => ((timer = null), send()), Math.max(0, PROGRESS_EVERY_MS - (Date.now() - progressAt)));
    };
    const keepalive = setInterval(() => res.write(': keepalive\n\n'), KEEPALIVE_MS);
    let closed = false;
    const close = (): void => {
      if (closed) return;
      closed = true;
      release();
      jobs.changes.off('change', onChange);
      jobs.changes.off('close', close);
      clearInterval(keepalive);
      if (timer) clearTimeout(timer);
      res.end();
    };
    jobs.changes.on('change', onChange);
    jobs.changes.on('close', close);
    res.on('close', close);
    send();
  });
}

/** `bytes=START-` or `bytes=START-END` within `size` (one range), else null (the whole body). */
export function parseRange(header: string | undefined, size: number): { start: number; end: number } | null {
  if (!header) return null;
  const m = /^bytes=(\d+)-(\d*)$/.exec(header.trim());
  if (!m) throw new NimbleError('invalid', `unsupported range '${header.slice(0, 60)}' (use bytes=START- or bytes=START-END)`);
  const start = Number(m[1]);
  const end = m[2] === '' ? size : Math.min(size, Number(m[2]) + 1);
  if (!(start < end)) throw new NimbleError('range_not_satisfiable', `range ${header.slice(0, 60)} is outside the ${size} bytes`, 416);
  return { start, end };
}
