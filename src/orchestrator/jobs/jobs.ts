// Developers' jobs on the network (docs/jobs.md): a job is submitted with its
// spec, trained by a run (../training/run-planner.ts) that starts on the
// smallest idle miner holding the whole model, followed on every tick, and
// ended by its limits (`timed_out` past its timeout, `idle_stopped` after its
// idle limit without a step); its checkpoints are kept for the retention
// period after it ends. Every status change is a job event (../state/jobs.ts).
// An upgrade moves a job onto a group (stages × replicas): its run ends early
// with every stage saved as a checkpoint, and a new run of the remaining steps
// starts from it on the group, where the first run's shards stopped.
import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { itemsPerStep, jobSpecProblems, resolveJobSpec, type JobSpec, type ResolvedJob } from '../../jobs/spec.ts';
import { canMove, isFinalJobStatus, type JobStatus } from '../../jobs/status.ts';
import { formatDuration } from '../../jobs/duration.ts';
import { formatNim } from '../../chain/amounts.ts';
import { stageCost } from '../../planner/cost.ts';
import { mlpCost } from '../../jobs/mlp-cost.ts';
import { partCount } from '../../model/parts.ts';
import { modelLabel, modelParts, modelRefOf, parseModelRef } from '../../model/model-ref.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { JobCheckpoints } from './job-checkpoints.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { checkJobData } from './datasets.ts';
import { runDataProblem } from '../training/run-planner.ts';
import { defaultUpgrade, layoutWords as shape, type JobLayout } from '../../jobs/layout.ts';
import type { JobRecord } from '../state/jobs.ts';
import type { RunRecord } from '../state/runs.ts';
import type { MinerRecord } from '../state/miners.ts';
import { placeOnOneMiner, type WaitingForOne } from '../../jobs/matching.ts';
import { DEFAULT_PRICING } from '../../jobs/plan-constants.ts';
import type { JobPlan, PoolMiner } from '../../jobs/plan-schema.ts';
import { planJob } from '../../jobs/plan.ts';

/** The escrow a job is submitted with, checked on chain (src/orchestrator/jobs/job-payments.ts). */
export interface JobEscrowTerms {
  escrowId: string;
  /** wei: the job's budget */
  amount: bigint;
  /** what its work is paid at */
  nimPerPetaflop: number;
  /** ms until which the orchestrator's lock on chain holds the escrow */
  lockedUntil?: number;
}

/** Jobs one developer may have that have not ended. */
export const MAX_ACTIVE_JOBS_PER_OWNER = 4;
/** Jobs waiting for miners, network-wide. */
export const MAX_WAITING_JOBS = 64;
/** Checkpoints of an ended job are kept this long by default (`--checkpoint-retention`). */
export const DEFAULT_CHECKPOINT_RETENTION_MS = 3 * 86_400_000;
/** How often expired checkpoints are looked for. */
const COLLECT_EVERY_MS = 10_000;

export interface JobServiceOptions {
  checkpointRetentionMs: number;
  /** activation slots per miner (sizes a stage's memory, as the run planner does) */
  slots: number;
  /** the network's price of work, NIM per PFLOP: a job offering less waits (default DEFAULT_PRICING) */
  nimPerPetaflop?: number;
}

/** The model reference a job's runs train (src/model/model-ref.ts): a named GPT, an inline GPT, or an MLP classifier. */
function jobModelRef(job: ResolvedJob): string {
  try {
    return modelRefOf(job.model);
  } catch (err) {
    throw new NimbleError('invalid', (err as Error).message);
  }
}

/** What a job's run is asked to train: `steps` of its model on `layout` (default: one miner). */
function runRequest(job: ResolvedJob, steps: number = job.steps, layout: JobLayout = { stages: 1, replicas: 1 }): Parameters<Coordinator['createRun']>[0] {
  return {
    model: jobModelRef(job),
    data: job.data,
    steps,
    stages: layout.stages,
    batchSize: job.batchSize,
    mergeEvery: job.mergeEvery,
    seed: job.seed,
    lr: job.learningRate,
    minMiners: layout.stages * layout.replicas,
  };
}


export class JobService {
  /** emits the id of a job whose events or progress changed */
  readonly changes = new EventEmitter();
  private collectedAt = 0;
  private readonly checkpoints: JobCheckpoints;
  /** the last reason noted for a job waiting for its miner (noted again only when it changes) */
  private readonly waitReasons = new Map<string, string>();

  constructor(
    private readonly c: Coordinator,
    private readonly options: JobServiceOptions,
    private readonly now: () => number = Date.now,
  ) {
    this.changes.setMaxListeners(0);
    this.checkpoints = new JobCheckpoints(c, (id) => this.changed(id), now);
  }

  private get state(): Coordinator['state'] {
    return this.c.state;
  }

  /**
   * Validates a spec of `owner`'s and records the job (with the escrow that
   * pays for it, checked on chain by the caller); its run starts when a miner is free.
   */
  submit(spec: JobSpec, owner: string, escrow?: JobEscrowTerms): JobRecord {
    const job = this.check(spec, owner);
    const id = `job-${randomBytes(8).toString('hex')}`;
    const now = this.now();
    this.state.tx(() => {
      this.state.jobs.insert(
        { id, owner, spec, steps: job.steps, timeoutMs: job.timeoutMs, idleTimeoutMs: job.idleTimeoutMs, checkpointEvery: job.checkpointEvery, retentionMs: this.options.checkpointRetentionMs },
        now,
      );
      if (escrow) {
        this.state.escrows.insert({ jobId: id, escrowId: escrow.escrowId, owner, amount: escrow.amount, price: escrow.nimPerPetaflop, lockedUntil: escrow.lockedUntil }, now);
        this.state.jobs.note(id, `paid from escrow ${escrow.escrowId}: ${formatNim(escrow.amount)} NIM at ${escrow.nimPerPetaflop} NIM per PFLOP`, now);
      }
    });
    this.ensureRun(this.state.jobs.get(id)!);
    this.placeWaitingJobs(now);
    this.changed(id);
    return this.state.jobs.get(id)!;
  }

  /** What `submit` refuses, without recording anything: the spec resolved, or an error. */
  check(spec: JobSpec, owner: string): ResolvedJob {
    const problems = jobSpecProblems(spec);
    if (problems.length) throw new NimbleError('invalid', `the job spec is not valid: ${problems.map((p) => `${p.path}: ${p.message}`).join('; ')}`);
    const job = resolveJobSpec(spec);
    checkJobData(this.state, job, owner);
    // what the miners cannot train though the spec is valid: a GPT whose vocabulary is not the bytes', an MLP on more hashed features than its data set builds
    const dataProblem = runDataProblem(parseModelRef(jobModelRef(job)), job.data);
    if (dataProblem) throw new NimbleError('invalid', `the network cannot train this job: ${dataProblem}`);
    if (this.state.jobs.countActiveOf(owner) >= MAX_ACTIVE_JOBS_PER_OWNER) {
      throw new NimbleError('too_many_runs', `${owner} has ${MAX_ACTIVE_JOBS_PER_OWNER} jobs that have not ended; cancel one first`, 429);
    }
    if (this.state.jobs.countWaiting() >= MAX_WAITING_JOBS) throw new NimbleError('overloaded', `${MAX_WAITING_JOBS} jobs are waiting for miners; try again later`);
    return job;
  }

  /** The owner ends a job: its run stops, its checkpoints are kept for the retention period. */
  cancel(id: string, by: string): JobRecord {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    if (job.owner !== by) throw new NimbleError('forbidden', `job ${id} is not ${by}'s`);
    if (isFinalJobStatus(job.status)) throw new NimbleError('conflict', `job ${id} has ended (${job.status})`);
    this.end(job, 'cancelled', 'cancelled by its owner');
    return this.state.jobs.get(id)!;
  }

  /** The orchestrator's operator ends a job (the dashboard, docs/dashboard.md): as a cancel by its owner, with `reason`. */
  cancelAsOperator(id: string, reason: string): JobRecord {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    if (isFinalJobStatus(job.status)) throw new NimbleError('conflict', `job ${id} has ended (${job.status})`);
    this.end(job, 'cancelled', reason);
    return this.state.jobs.get(id)!;
  }

  /**
   * The owner moves a job onto `layout` (stages × replicas; by default
   * `defaultUpgrade`): its run finishes early and the job goes on from the
   * checkpoint it ends with, on the group. Refused when the alive miners
   * cannot make the group.
   */
  upgrade(id: string, by: string, layout?: JobLayout, why?: string): JobRecord {
    return this.upgradeBy(id, by, layout, why ? `auto-upgrade (${why}): ` : '').job;
  }

  /** The job planned on the miners alive now at the network's price, as `nbcli job plan` plans a spec (src/jobs/plan.ts). */
  plan(id: string): JobPlan {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    return planJob(resolveJobSpec(job.spec), this.state.miners.list(true).map(poolMiner), { nimPerPetaflop: this.options.nimPerPetaflop ?? DEFAULT_PRICING.nimPerPetaflop }, { slots: this.options.slots });
  }

  /** The operator moves any job onto the default group for the miners alive (the dashboard's Upgrade button), as its owner's `nbcli job upgrade` does: the job, and the group. */
  upgradeAsOperator(id: string): { job: JobRecord; to: JobLayout } {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    return this.upgradeBy(id, job.owner, undefined, 'by the operator (dashboard): ');
  }

  /** upgrade's work; `note` begins the message the job records. */
  private upgradeBy(id: string, by: string, layout: JobLayout | undefined, note: string): { job: JobRecord; to: JobLayout } {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    if (job.owner !== by) throw new NimbleError('forbidden', `job ${id} is not ${by}'s`);
    if (isFinalJobStatus(job.status)) throw new NimbleError('conflict', `job ${id} has ended (${job.status})`);
    if (job.upgrade) throw new NimbleError('conflict', `job ${id} is already being upgraded to ${shape(job.upgrade)}`);
    const resolved = resolveJobSpec(job.spec);
    // an MLP is one stage: it is upgraded to replicas of it (the default group: 1 stage × up to 4 replicas)
    const model = parseModelRef(jobModelRef(resolved));
    const parts = modelParts(model);
    const alive = this.state.miners.list(true).length;
    const to = layout ?? defaultUpgrade(parts, alive);
    if (to.stages > parts) {
      throw new NimbleError(
        'invalid',
        model.kind === 'mlp'
          ? `an MLP classifier trains as one stage: upgrade it to replicas only (--stages 1 --replicas R, or no flags), not ${to.stages} stages`
          : `${modelLabel(model)} has ${parts} parts; it cannot be cut into ${to.stages} stages`,
      );
    }
    if (to.stages * to.replicas > alive) throw new NimbleError('conflict', `${shape(to)} needs ${to.stages * to.replicas} miners and ${alive} are alive`);
    const run = job.runId ? this.state.runs.get(job.runId) : undefined;
    const now = this.now();
    if (!run || run.microbatchesCreated === 0) {
      // nothing trained in this run yet: the group takes it over at once, from the last checkpoint (if any)
      if (run) this.c.stopRun(run.id, `its job was upgraded to ${shape(to)}`);
      this.state.jobs.requestUpgrade(id, to, `${note}upgrade to ${shape(to)}: nothing trained in the current run yet, the group starts now`, now);
      this.moveOn(this.state.jobs.get(id)!, run ?? null);
    } else {
      this.c.finishRunEarly(run.id);
      const at = job.stepBase + run.microbatchesCreated;
      this.state.jobs.requestUpgrade(id, to, `${note}upgrade to ${shape(to)}: the current run stops at step ${at}, merges, and the job goes on from that checkpoint`, now);
    }
    this.changed(id);
    return { job: this.state.jobs.get(id)!, to };
  }

  /** Follows every active job; collects expired checkpoints now and then. Called on the orchestrator's clock. */
  tick(): void {
    const now = this.now();
    for (const job of this.state.jobs.active()) {
      try {
        this.tickJob(job, now);
      } catch (err) {
        console.error(`job ${job.id}: tick failed: ${(err as Error).message}`);
      }
    }
    this.placeWaitingJobs(now);
    if (now - this.collectedAt >= COLLECT_EVERY_MS) {
      this.collectedAt = now;
      this.collect(now);
    }
  }

  /** Deletes expired checkpoints; their blobs go to the collector (deleted unless something else still names them). */
  collect(now: number): number {
    const blobs = this.state.jobs.deleteExpiredCheckpoints(now, 1000);
    if (blobs.length) this.state.garbage.condemn(blobs, now);
    return blobs.length;
  }

  /** Keeps an ended job's checkpoints at least until `until`. */
  keepCheckpoints(id: string, by: string, until: number): JobRecord {
    const job = this.state.jobs.get(id);
    if (!job) throw new NimbleError('not_found', `unknown job ${id}`);
    if (job.owner !== by) throw new NimbleError('forbidden', `job ${id} is not ${by}'s`);
    this.state.jobs.extendRetention(id, until);
    return job;
  }

  /** Ends every open event stream (the server is closing). */
  closeStreams(): void {
    this.changes.emit('close');
  }

  /** Resolves once the checkpoints being written are stored. */
  async settled(): Promise<void> {
    await this.checkpoints.settled();
  }

  private tickJob(job: JobRecord, now: number): void {
    const run = this.ensureRun(job);
    if (!run) return;
    const step = job.stepBase + run.microbatchesDone;
    this.state.jobs.setProgress(job.id, { step, tokens: job.tokenBase + run.tokensDone, loss: run.lastLoss }, now);
    if (step !== job.step) this.changed(job.id);
    const fresh = this.state.jobs.get(job.id)!;
    if (run.status !== 'completed') this.checkpoints.keep(fresh, run, false);
    switch (run.status) {
      case 'completed':
        // the final merged state becomes the last checkpoint before the job completes, or goes on upgraded
        if (this.checkpoints.keep(fresh, run, true) !== 'kept') return;
        if (fresh.upgrade && step < fresh.steps) this.moveOn(fresh, run);
        else this.end(fresh, 'completed', `trained ${step} steps`);
        return;
      case 'failed':
        this.end(fresh, 'failed', run.message ?? 'its run failed');
        return;
      case 'cancelled':
        this.end(fresh, 'cancelled', run.message ?? 'its run was cancelled');
        return;
    }
    const escrow = this.state.escrows.get(job.id);
    if (escrow?.spent) {
      this.end(fresh, 'failed', `its budget of ${formatNim(BigInt(escrow.amount))} NIM is spent, at step ${fresh.step} of ${fresh.steps}; its last checkpoint is kept`);
      return;
    }
    if (escrow?.status === 'closed') {
      this.end(fresh, 'failed', `its escrow ${escrow.escrowId} was closed on chain, nothing pays for more work: stopped at step ${fresh.step} of ${fresh.steps}; its last checkpoint is kept`);
      return;
    }
    if (now >= fresh.timeoutAt) {
      this.end(fresh, 'timed_out', `past its wall-clock limit (${formatDuration(fresh.timeoutAt - fresh.createdAt)}) at step ${fresh.step} of ${fresh.steps}; its last checkpoint is kept`);
      return;
    }
    if (now - fresh.lastProgressAt >= fresh.idleTimeoutMs) {
      const why = run.message ?? (run.status === 'waiting' ? 'no miner' : 'stalled');
      this.end(fresh, 'idle_stopped', `no progress for ${formatDuration(fresh.idleTimeoutMs)} (${why}); its miners are freed`);
      return;
    }
    if (this.autoUpgrade(fresh, run, now)) return;
    const status: JobStatus = run.status === 'waiting' ? 'waiting' : run.status === 'started' ? 'started' : 'executing';
    if (status !== fresh.status && canMove(fresh.status, status)) {
      this.state.jobs.move(job.id, status, statusReason(status, run), now);
      this.changed(job.id);
    } else if (run.message && run.message !== fresh.message && status === fresh.status) {
      this.state.jobs.note(job.id, run.message, now);
      this.changed(job.id);
    }
  }

  /** The job's run, created if a crash came between recording the job and creating it. */
  private ensureRun(job: JobRecord): RunRecord | null {
    if (job.runId) return this.state.runs.get(job.runId) ?? null;
    // its miner is chosen with the other waiting jobs, in order of priority (placeWaitingJobs)
    const run = this.c.createRun(runRequest(resolveJobSpec(job.spec)), job.owner, []);
    this.state.jobs.setRun(job.id, run.id);
    return this.state.runs.get(run.id) ?? null;
  }

  /**
   * The upgrade asked for is made: a run of the remaining steps on the group,
   * starting from the job's last checkpoint (the one `finished` ended with).
   */
  private moveOn(job: JobRecord, finished: RunRecord | null): void {
    const layout = job.upgrade!;
    const resolved = resolveJobSpec(job.spec);
    if (finished) this.checkpoints.forget(finished.id);
    const stepBase = job.stepBase + (finished?.microbatchesDone ?? 0);
    const tokenBase = job.tokenBase + (finished?.tokensDone ?? 0);
    const last = this.state.jobs.checkpoints(job.id).at(-1);
    const request = runRequest(resolved, job.steps - stepBase, layout);
    const run = this.c.createRun(request, job.owner, undefined, { init: last?.blob ?? null, shardBase: stepBase });
    const from = last ? `the checkpoint at step ${last.step}` : 'the start';
    this.state.jobs.moveOn(job.id, run.id, stepBase, tokenBase, `upgraded to ${shape(layout)}: ${job.steps - stepBase} steps left, from ${from}`, this.now());
    this.changed(job.id);
  }

  /**
   * A job that asked for it (`autoUpgrade`) is upgraded to the default group,
   * once, from its one-miner start: when no alive miner holds the whole
   * model, or when at its measured speed it would end past its deadline.
   */
  private autoUpgrade(job: JobRecord, run: RunRecord, now: number): boolean {
    if (!job.spec.autoUpgrade || job.upgrade || !run.options.pool || job.stepBase > 0) return false;
    const resolved = resolveJobSpec(job.spec);
    // a GPT onto stages × replicas; an MLP (one part) onto replicas
    const parts = resolved.model.kind === 'gpt' ? partCount(resolved.model.config) : 1;
    const layout = defaultUpgrade(parts, this.state.miners.list(true).length);
    if (layout.stages * layout.replicas <= 1) return false;
    let why: string | null = null;
    if (resolved.model.kind === 'gpt' && run.status === 'waiting' && !this.state.miners.list(true).some((m) => m.memoryBytes >= wholeModelBytes(resolved, this.options.slots))) {
      why = 'no miner holds the whole model';
    } else if (run.status === 'executing' && run.mergesDone >= 1) {
      const rate = this.c.microbatches.tokensPerSecond(run.id);
      const unit = resolved.model.kind === 'gpt' ? 'tokens' : 'examples';
      const etaMs = rate > 0 ? (((job.steps - job.step) * itemsPerStep(resolved.model, resolved.batchSize)) / rate) * 1000 : 0;
      const deadline = job.createdAt + resolved.deadlineMs;
      if (rate > 0 && now + etaMs > deadline) why = `at ${Math.round(rate)} ${unit}/s on one miner it would end ${formatDuration(now + etaMs - deadline)} past its deadline`;
    }
    if (!why) return false;
    this.upgrade(job.id, job.owner, layout, why);
    return true;
  }

  /**
   * The default assignment of every job waiting for its one miner (none yet,
   * or its miner is gone): in order of priority (the offer, aged so that none
   * starves: src/jobs/matching.ts), each on the idle miner with the least
   * memory that holds the whole model.
   */
  private placeWaitingJobs(now: number): void {
    const idle = this.c.idleMiners();
    const idleIds = new Set(idle.map((m) => m.id));
    const queue: { job: JobRecord; run: RunRecord; need: WaitingForOne }[] = [];
    for (const job of this.state.jobs.active()) {
      const run = job.runId ? this.state.runs.get(job.runId) : undefined;
      if (!run || run.status !== 'waiting' || !run.options.pool || job.upgrade) continue;
      if (run.options.pool.some((m) => idleIds.has(m))) continue;
      const resolved = resolveJobSpec(job.spec);
      queue.push({ job, run, need: { id: job.id, offer: resolved.offer, queuedAt: job.createdAt, needBytes: wholeModelBytes(resolved, this.options.slots) } });
    }
    if (queue.length === 0) return;
    const { placed, waiting } = placeOnOneMiner(queue.map((q) => q.need), idle.map(poolMiner), this.state.miners.list(true).map(poolMiner), now, { nimPerPetaflop: this.options.nimPerPetaflop ?? DEFAULT_PRICING.nimPerPetaflop });
    const byId = new Map(queue.map((q) => [q.job.id, q]));
    for (const p of placed) {
      const q = byId.get(p.id)!;
      this.waitReasons.delete(p.id);
      this.state.jobs.note(p.id, `placed on miner ${this.minerName(p.miner)}, the smallest idle miner that holds the whole model`, now);
      this.c.setRunPool(q.run.id, [p.miner]);
      this.changed(p.id);
    }
    for (const w of waiting) {
      if (this.waitReasons.get(w.id) === w.reason) continue;
      this.waitReasons.set(w.id, w.reason);
      this.state.jobs.note(w.id, w.reason, now);
      this.changed(w.id);
    }
  }

  private minerName(id: string): string {
    return this.state.miners.get(id)?.name ?? id;
  }

  private end(job: JobRecord, status: JobStatus, reason: string): void {
    const now = this.now();
    // what was merged last is kept (a timed-out job keeps its last checkpoint)
    const run = job.runId ? this.state.runs.get(job.runId) : undefined;
    if (run && status !== 'completed') this.checkpoints.keep(job, run, true);
    this.state.tx(() => {
      this.state.jobs.move(job.id, status, reason, now);
      // its escrow pays for the work logged until now, then refunds the rest
      this.state.escrows.end(job.id, this.state.ledger.lastWorkId());
    });
    if (run) this.c.stopRun(run.id, `its job ended: ${reason}`);
    if (run) this.checkpoints.forget(run.id);
    this.changed(job.id);
  }

  private changed(id: string): void {
    this.changes.emit('change', id);
  }
}

/** The memory a miner needs to train the whole of a job's model alone (as the run planner sizes its one stage: src/jobs/mlp-cost.ts for an MLP). */
function wholeModelBytes(job: ResolvedJob, slots: number): number {
  if (job.model.kind === 'mlp') return mlpCost(job.model, job.batchSize).memoryBytes.total;
  return stageCost(job.model.config, { from: 0, to: partCount(job.model.config) }, job.batchSize, slots).memoryBytes.total;
}

function statusReason(status: JobStatus, run: RunRecord): string {
  if (status === 'waiting') return run.message ?? 'waiting for miners';
  if (status === 'started') return `placed on ${run.plan?.stages.flatMap((s) => s.miners).length ?? 0} miner(s) in ${run.stageCount} stage(s)`;
  return 'microbatches are flowing';
}

/** A miner as the job planner sees it. */
const poolMiner = (m: MinerRecord): PoolMiner => ({ id: m.id, name: m.name, gflops: m.gflops, memoryBytes: m.memoryBytes, bandwidthMbps: m.bandwidthMbps });
