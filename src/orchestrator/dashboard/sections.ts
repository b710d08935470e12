// The sections of the network's state the dashboard shows (src/api/dashboard.ts):
// miners with what they do, their work and their earnings; runs; jobs;
// epochs; stored models and deployments. Built from the same views as the
// public API (../views.ts, ../routes/jobs.ts, ../models/deployments.ts), bounded in
// length, and with the costlier sums (the work log, every epoch's rewards)
// recomputed only when they can have changed. Each miner's stake comes from a
// cache read in the background (./stakes.ts), the traffic between a run's
// stages from the work log read incrementally (./traffic.ts): neither reads
// the chain nor the whole log while a section is built.
import { formatEther } from 'viem';
import type { DashboardMiner, DashboardRun, DashboardSection, DashboardSectionName, MinerRole } from '../../api/dashboard.ts';
import { FINAL_RUN_STATUSES, WORK_KINDS, type WorkKind } from '../../api/schemas.ts';
import { isFinalJobStatus } from '../../jobs/status.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { deploymentView, deploymentViewOf } from '../models/deployments.ts';
import type { JobService } from '../jobs/jobs.ts';
import { storedModelView } from '../models/models.ts';
import { jobView } from '../routes/jobs.ts';
import { epochView, minerView, runView } from '../views.ts';
import type { ListingSource } from './listings.ts';
import type { StakeSource } from './stakes.ts';
import { StageTraffic } from './traffic.ts';

/** Ended runs and jobs shown beside the ones under way (the newest). */
export const ENDED_SHOWN = 100;
/** Epochs, models and deployments shown (the newest). */
export const LIST_SHOWN = 100;
/** The work log is summed again at most this often. */
const WORK_EVERY_MS = 2_000;
/** A miner's rate of work is taken over about this long. */
export const RATE_WINDOW_MS = 60_000;
/** ... and only once the orchestrator has watched for at least this long. */
const RATE_MIN_MS = 5_000;
/** The work that counts in a miner's rate. */
const DONE_KINDS: readonly WorkKind[] = ['forward', 'backward', 'merge', 'inference'];

export class DashboardSections {
  private work: { at: number; byMiner: Map<string, Record<WorkKind, number>>; perMinute: Map<string, number> | null } | null = null;
  /** [time, last work log id] when the log was summed: where a rate's window starts */
  private marks: [number, number][] = [];
  private earned: { key: string; byMiner: Map<string, bigint> } | null = null;
  private readonly traffic: StageTraffic;

  constructor(
    private readonly c: Coordinator,
    private readonly jobs: JobService | null,
    private readonly paid: boolean,
    private readonly now: () => number = Date.now,
    /** each miner's stake (./stakes.ts); null: none shown (an unpaid network) */
    private readonly stakes: StakeSource | null = null,
    /** each model's registry listing (./listings.ts); null: none shown (an unpaid network) */
    private readonly listings: ListingSource | null = null,
  ) {
    this.traffic = new StageTraffic(c.state.ledger, now);
  }

  build<K extends DashboardSectionName>(name: K): DashboardSection<K> {
    const built: { [S in DashboardSectionName]: () => DashboardSection<S> } = {
      miners: () => this.miners(),
      runs: () => this.runs(),
      jobs: () => this.jobList(),
      epochs: () => {
        const all = this.c.state.ledger.epochs();
        return { paid: this.paid, epochs: all.slice(-LIST_SHOWN).reverse().map((e) => epochView(this.c.state, e)) };
      },
      models: () =>
        this.c.state.models
          .list()
          .slice(0, LIST_SHOWN)
          .map((m) => ({ ...storedModelView(m), deployment: deploymentViewOf(this.c.state, m.sha256), listing: this.listings?.get(m.sha256) ?? null })),
      deployments: () => this.c.state.deployments.list().slice(0, LIST_SHOWN).map((d) => deploymentView(this.c.state, d)),
    };
    return built[name]();
  }

  miners(): DashboardMiner[] {
    const { state } = this.c;
    const roles = this.roles();
    const work = this.workTotals();
    const earned = this.earnings();
    return state.miners.list().map((m) => {
      const wei = earned.get(m.id) ?? 0n;
      const perMinute = work.perMinute === null ? null : (work.perMinute.get(m.id) ?? 0);
      return { ...minerView(m), roles: roles.get(m.id) ?? [], units: work.byMiner.get(m.id) ?? zeroUnits(), workPerMinute: perMinute, earnedWei: wei.toString(), earned: formatEther(wei), stake: this.stakes?.get(m.id, m.alive) ?? null };
    });
  }

  runs(): DashboardRun[] {
    const { state } = this.c;
    const all = state.runs.list();
    const ended = all.filter((r) => FINAL_RUN_STATUSES.includes(r.status));
    const active = all.filter((r) => !FINAL_RUN_STATUSES.includes(r.status));
    const shown = new Set([...active, ...ended.slice(-ENDED_SHOWN)]);
    const traffic = this.traffic.of(active);
    // newest first
    return all
      .filter((r) => shown.has(r))
      .reverse()
      .map((r) => ({ ...runView(state, this.c.microbatches, r), traffic: traffic.get(r.id) ?? null }));
  }

  private jobList(): DashboardSection<'jobs'> {
    if (!this.jobs) return [];
    const all = this.c.state.jobs.list();
    let ended = 0;
    return all.filter((j) => !isFinalJobStatus(j.status) || ended++ < ENDED_SHOWN).map((j) => jobView(this.c, j));
  }

  /** What each miner holds: a stage of a run under way, or of a deployment being served. */
  private roles(): Map<string, MinerRole[]> {
    const { state } = this.c;
    const out = new Map<string, MinerRole[]>();
    const add = (id: string, r: MinerRole): void => void (out.get(id) ?? out.set(id, []).get(id)!).push(r);
    for (const run of state.runs.active()) {
      const stages = state.runs.stages(run.id).length;
      const assignments = state.runs.assignments(run.id);
      for (const a of assignments) {
        const same = assignments.filter((b) => b.stage === a.stage);
        add(a.minerId, { kind: 'training', of: run.id, stage: a.stage, stages, replica: same.indexOf(a) + 1, replicas: same.length });
      }
    }
    for (const d of state.deployments.live()) {
      const v = deploymentView(state, d);
      for (const s of v.stages) s.miners.forEach((m, i) => add(m.id, { kind: 'serving', of: v.name, stage: s.stage, stages: v.stages.length, replica: i + 1, replicas: s.miners.length }));
    }
    return out;
  }

  /** The work log summed per miner and kind, and each miner's work per minute over about RATE_WINDOW_MS; summed again at most every WORK_EVERY_MS. */
  private workTotals(): { byMiner: Map<string, Record<WorkKind, number>>; perMinute: Map<string, number> | null } {
    const now = this.now();
    if (this.work && now - this.work.at < WORK_EVERY_MS) return this.work;
    const { ledger } = this.c.state;
    const byMiner = new Map<string, Record<WorkKind, number>>();
    for (const t of ledger.workTotals()) {
      const units = byMiner.get(t.minerId) ?? byMiner.set(t.minerId, zeroUnits()).get(t.minerId)!;
      units[t.kind] += t.units;
    }
    // the rate: the units logged since the newest mark at least a window old (or the oldest mark), over the time since it
    this.marks.push([now, ledger.lastWorkId()]);
    while (this.marks.length > 1 && this.marks[1][0] <= now - RATE_WINDOW_MS) this.marks.shift();
    const [since, afterId] = this.marks[0];
    let perMinute: Map<string, number> | null = null;
    if (now - since >= RATE_MIN_MS) {
      perMinute = new Map();
      for (const r of ledger.unitsSince(afterId, DONE_KINDS)) perMinute.set(r.minerId, (r.units * 60_000) / (now - since));
    }
    this.work = { at: now, byMiner, perMinute };
    return this.work;
  }

  /** Every scored epoch's rewards summed per miner, summed again only when an epoch closed or settled. */
  private earnings(): Map<string, bigint> {
    const epochs = this.c.state.ledger.epochs();
    const key = epochs.map((e) => `${e.id}:${e.status}`).join(',');
    if (this.earned?.key === key) return this.earned.byMiner;
    const byMiner = new Map<string, bigint>();
    for (const e of epochs) for (const r of this.c.state.ledger.rewards(e.id)) byMiner.set(r.miner, (byMiner.get(r.miner) ?? 0n) + BigInt(r.amount));
    this.earned = { key, byMiner };
    return byMiner;
  }
}

function zeroUnits(): Record<WorkKind, number> {
  return Object.fromEntries(WORK_KINDS.map((k) => [k, 0])) as Record<WorkKind, number>;
}
