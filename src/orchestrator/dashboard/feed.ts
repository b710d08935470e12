// The dashboard's live feed (docs/dashboard.md, "Live updates"): once a
// second it samples the loss curves (./loss-history.ts) and, while anyone
// listens, builds each section of the state (./sections.ts), checks it
// against its contract and sends it to every open event stream when it
// changed since the last time (so an idle network sends nothing but
// keepalives); new streams get every section at once. Streams are capped in
// number, and one that does not read what it is sent is closed.
import type { ServerResponse } from 'node:http';
import type { TSchema } from '@sinclair/typebox';
import { TypeCompiler, type TypeCheck } from '@sinclair/typebox/compiler';
import { DashboardSections as Schemas, LossEvent, SECTION_NAMES, type DashboardSectionName, type HelloEvent } from '../../api/dashboard.ts';
import { FINAL_RUN_STATUSES } from '../../api/schemas.ts';
import type { ChainClient } from '../../chain/client.ts';
import { isFinalJobStatus } from '../../jobs/status.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { Coordinator } from '../training/coordinator.ts';
import type { JobService } from '../jobs/jobs.ts';
import { DEFAULT_LOSS_LIMITS, LossHistories } from './loss-history.ts';
import { DashboardSections } from './sections.ts';
import { ListingCache } from './listings.ts';
import { StakeCache } from './stakes.ts';

/** Event streams open at once: past it a new one is refused (503). */
export const MAX_DASHBOARD_STREAMS = 64;
/** How often the state is sampled and changes are sent. */
export const FEED_EVERY_MS = 1_000;
/** A comment line keeps an idle stream open through proxies and the server's idle timeout. */
const KEEPALIVE_MS = 15_000;
/** A stream whose unread bytes pass this is a reader that does not keep up: it is closed. */
const MAX_UNREAD_BYTES = 8 << 20;

const checks = new Map<DashboardSectionName, TypeCheck<TSchema>>(SECTION_NAMES.map((n) => [n, TypeCompiler.Compile(Schemas[n])]));
const lossCheck = TypeCompiler.Compile(LossEvent);

export interface DashboardFeedOptions {
  log?: (line: string) => void;
  now?: () => number;
  /** the orchestrator's chain, whose Staking contract the miners' stakes are read from (./stakes.ts); null or absent: no stakes shown */
  chain?: ChainClient | null;
}

export class DashboardFeed {
  /** the loss curves, kept in the orchestrator's state too (they survive a restart) */
  readonly losses: LossHistories;
  private readonly sections: DashboardSections;
  private readonly streams = new Set<ServerResponse>();
  /** each section's last event as sent (name and data) */
  private readonly last = new Map<DashboardSectionName, string>();
  private trackedRuns = new Set<string>();
  private trackedJobs = new Set<string>();
  private readonly timer: NodeJS.Timeout;
  private readonly keepalive: NodeJS.Timeout;
  private readonly stakes: StakeCache | null;
  private readonly listings: ListingCache | null;
  private readonly log: (line: string) => void;
  private readonly now: () => number;

  constructor(
    private readonly c: Coordinator,
    private readonly jobs: JobService | null,
    private readonly paid: boolean,
    options: DashboardFeedOptions = {},
  ) {
    this.losses = new LossHistories(DEFAULT_LOSS_LIMITS, c.state.lossPoints);
    this.log = options.log ?? ((line) => console.error(`orchestrator: ${line}`));
    this.now = options.now ?? Date.now;
    this.stakes = options.chain ? StakeCache.ofChain(options.chain, { now: this.now, log: this.log }) : null;
    this.listings = options.chain ? ListingCache.ofChain(options.chain, { now: this.now, log: this.log }) : null;
    this.sections = new DashboardSections(c, jobs, paid, this.now, this.stakes, this.listings);
    this.timer = setInterval(() => this.step(), FEED_EVERY_MS);
    this.timer.unref();
    this.keepalive = setInterval(() => this.write(': keepalive\n\n'), KEEPALIVE_MS);
    this.keepalive.unref();
  }

  get openStreams(): number {
    return this.streams.size;
  }

  /** One pass: sample the curves, then send what changed. */
  step(): void {
    try {
      this.sample();
      this.saveLosses();
      if (this.streams.size === 0) {
        this.losses.drain();
        this.last.clear();
        return;
      }
      for (const name of SECTION_NAMES) {
        const event = this.event(name);
        if (event !== null && event !== this.last.get(name)) {
          this.last.set(name, event);
          this.write(event);
        }
      }
      const series = this.losses.drain();
      const loss = { series };
      if (series.length && lossCheck.Check(loss)) this.write(`event: loss\ndata: ${JSON.stringify(loss)}\n\n`);
    } catch (err) {
      this.log(`dashboard feed failed: ${(err as Error).stack ?? String(err)}`);
    }
  }

  /** Every section now, as one object (what GET /events answers without `Accept: text/event-stream`). */
  snapshot(): { [K in DashboardSectionName]: unknown } {
    return Object.fromEntries(SECTION_NAMES.map((n) => [n, this.sections.build(n)])) as { [K in DashboardSectionName]: unknown };
  }

  /** Takes a response over as an event stream: hello, every section, then changes until either side closes. */
  open(res: ServerResponse, hello: Omit<HelloEvent, 'at' | 'paid'>): void {
    if (this.streams.size >= MAX_DASHBOARD_STREAMS) throw new NimbleError('overloaded', `${MAX_DASHBOARD_STREAMS} dashboard streams are open; try again later`, 503);
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store', connection: 'keep-alive', 'x-content-type-options': 'nosniff' });
    this.streams.add(res);
    res.on('close', () => this.streams.delete(res));
    const first: HelloEvent = { at: this.now(), paid: this.paid, ...hello };
    res.write(`retry: 2000\nevent: hello\ndata: ${JSON.stringify(first)}\n\n`);
    for (const name of SECTION_NAMES) {
      let event = this.last.get(name) ?? null;
      if (event === null) {
        event = this.event(name);
        if (event !== null) this.last.set(name, event);
      }
      if (event !== null) res.write(event);
    }
  }

  /** Ends every stream and stops the clock. */
  close(): void {
    clearInterval(this.timer);
    clearInterval(this.keepalive);
    this.stakes?.close();
    this.listings?.close();
    this.saveLosses();
    for (const res of this.streams) res.end();
    this.streams.clear();
  }

  /** This pass's new points and statuses, to the orchestrator's state in one transaction (a failure is logged; the feed goes on, the next pass retries). */
  private saveLosses(): void {
    try {
      this.losses.flush();
    } catch (err) {
      this.log(`loss curves not saved: ${(err as Error).message}`);
    }
  }

  /** A section as an event, or null (logged) when it does not match its contract. */
  private event(name: DashboardSectionName): string | null {
    const data = this.sections.build(name);
    const check = checks.get(name)!;
    if (!check.Check(data)) {
      const first = check.Errors(data).First();
      this.log(`dashboard section ${name} does not match its schema: ${first?.path || '/'} ${first?.message ?? ''}`);
      return null;
    }
    return `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
  }

  private write(chunk: string): void {
    for (const res of this.streams) {
      if (res.writableLength > MAX_UNREAD_BYTES) {
        res.destroy();
        this.streams.delete(res);
      } else res.write(chunk);
    }
  }

  /** A point per run and job whose step moved since the last pass, and the status each is in. */
  private sample(): void {
    const { state } = this.c;
    const now = this.now();
    const runs = new Set<string>();
    for (const r of state.runs.active()) runs.add(r.id);
    for (const id of new Set([...runs, ...this.trackedRuns])) {
      const r = state.runs.get(id);
      if (!r) continue;
      const key = `run:${r.id}`;
      this.losses.status(key, r.status, now);
      if (r.lastLoss !== null) this.losses.record(key, r.microbatchesDone, r.lastLoss, FINAL_RUN_STATUSES.includes(r.status) ? 0 : this.c.microbatches.tokensPerSecond(r.id), now);
    }
    this.trackedRuns = runs;
    if (!this.jobs) return;
    const jobs = new Set<string>();
    for (const j of state.jobs.active()) jobs.add(j.id);
    for (const id of new Set([...jobs, ...this.trackedJobs])) {
      const j = state.jobs.get(id);
      if (!j) continue;
      const key = `job:${j.id}`;
      this.losses.status(key, j.status, now);
      const rate = j.runId && !isFinalJobStatus(j.status) ? this.c.microbatches.tokensPerSecond(j.runId) : 0;
      if (j.loss !== null) this.losses.record(key, j.step, j.loss, rate, now);
    }
    this.trackedJobs = jobs;
  }
}
