// One orchestrator process of several sharing a PostgreSQL database (and a
// blob bucket): it answers on its port from the start, as a follower that
// forwards every request to the leader (./forwarder.ts), and becomes the
// leader when it takes the lease (./lease.ts): it then stops forwarding and
// starts the whole orchestrator (../server.ts) on the same port, with every
// state write fenced by the lease. Taking over is a restart of the
// orchestrator in another process: the state is all in the database, and a
// start already finishes what a crash left half done (issued microbatches,
// merge rounds, settling epochs).
//
// While it leads it renews the lease every ttl/4. It stops leading when a
// renewal finds the lease taken, when it could not renew for a whole ttl, or
// when a state write is refused by the fence; it then tells onLost, which
// must stop the process at once (nothing it would still do can be written).
import { isIP } from 'node:net';
import { startOrchestrator, type OrchestratorOptions, type RunningOrchestrator } from '../server.ts';
import { startForwarder, type Forwarder } from './forwarder.ts';
import { Lease } from './lease.ts';

export interface MemberOptions {
  /** the orchestrator it runs once it leads; `db` is the shared postgres:// URL */
  orchestrator: OrchestratorOptions & { db: string };
  /** the lease's time to live (default 5 s): how long a dead leader goes unnoticed */
  leaseTtlMs?: number;
  /** the URL the other orchestrators reach this one at when it leads (default: http://host:port, right when they share its machine or host is its address) */
  advertiseUrl?: string;
  /** told when this process, which joined as a follower, took over and its orchestrator started (one that leads from the start is told by joinCluster's return) */
  onLeading?(orchestrator: RunningOrchestrator, term: number): void;
  /** told (once) when it lost the lease while leading: stop the process now */
  onLost(why: string): void;
  log(line: string): void;
}

export interface ClusterMember {
  /** where it answers, leading or following */
  readonly url: string;
  /** this process's id in the lease */
  readonly holder: string;
  /** its orchestrator once it leads, else null */
  orchestrator(): RunningOrchestrator | null;
  close(): Promise<void>;
}

/** Joins the cluster of orchestrators on `options.orchestrator.db`: answers at once, leads when it can. */
export async function joinCluster(options: MemberOptions): Promise<ClusterMember> {
  const host = options.orchestrator.host ?? '127.0.0.1';
  let leaderUrl: string | null = null;
  let forwardKey: string | null = null;
  const forwarder = await startForwarder({ host, port: options.orchestrator.port ?? 0, leader: () => leaderUrl, forwardKey: () => forwardKey, log: options.log });
  const url = options.advertiseUrl ?? `http://${host.includes(':') ? `[${host}]` : host}:${forwarder.port}`;
  let lease: Lease;
  try {
    lease = Lease.open({ db: options.orchestrator.db, url, ttlMs: options.leaseTtlMs });
  } catch (err) {
    await forwarder.close();
    throw err;
  }
  const member = new Member(options, lease, forwarder, (u, key) => {
    leaderUrl = u;
    forwardKey = key;
  });
  await member.poll();
  member.start();
  try {
    // leading from the start: answer once the orchestrator runs (a start that fails is this command's error)
    await member.takingOver();
    member.joined = true;
  } catch (err) {
    await member.close();
    throw err;
  }
  return member;
}

class Member implements ClusterMember {
  readonly url: string;
  readonly holder: string;
  private running: RunningOrchestrator | null = null;
  /** holds the lease (from the moment it took it, while its orchestrator starts too) */
  private holding = false;
  private lost = false;
  /** past joinCluster: a failure is no longer the caller's to report */
  joined = false;
  private closed = false;
  private lastRenewedAt = 0;
  private timer: NodeJS.Timeout | null = null;
  private polling: Promise<void> | null = null;
  private starting: Promise<void> | null = null;

  constructor(
    private readonly options: MemberOptions,
    private readonly lease: Lease,
    private forwarder: Forwarder | null,
    /** the leader's URL and the key its term's forwarded requests are proven with */
    private readonly setLeaderUrl: (url: string | null, forwardKey: string | null) => void,
  ) {
    this.url = forwarder?.url ?? '';
    this.holder = lease.holder;
  }

  orchestrator(): RunningOrchestrator | null {
    return this.running;
  }

  /** Resolves once a takeover under way has started the orchestrator (at once when none is). */
  takingOver(): Promise<void> {
    return this.starting ?? Promise.resolve();
  }

  start(): void {
    this.timer = setInterval(() => void this.poll(), Math.max(50, Math.floor(this.lease.ttlMs / 4)));
  }

  /** One step: renew while leading; while following, learn the leader and try to take over. */
  poll(): Promise<void> {
    this.polling ??= this.step().finally(() => (this.polling = null));
    return this.polling;
  }

  private async step(): Promise<void> {
    if (this.closed || this.lost) return;
    if (this.holding) return this.renew();
    try {
      const now = this.lease.current();
      // never itself: a restarted orchestrator on the same port (or advertised URL) finds its dead predecessor's URL there
      const other = now && now.holder !== this.holder && now.url !== this.url && now.url !== this.lease.url ? now : null;
      this.setLeaderUrl(other?.url ?? null, other?.forwardKey || null);
      const term = this.lease.tryAcquire();
      // not awaited: the lease is renewed by the next steps while the orchestrator starts (a start may settle a crash's epochs on chain)
      if (term !== null) {
        this.starting = this.takeOver(term);
        // its port was handed to the orchestrator that did not start: this process can serve nothing more
        this.starting.catch((err: unknown) => {
          if (this.joined) this.lose(`taking over failed: ${(err as Error).message}`);
        });
      }
    } catch (err) {
      this.options.log(`cluster: ${(err as Error).message}`);
    }
  }

  private renew(): void {
    try {
      if (this.lease.renew()) {
        this.lastRenewedAt = Date.now();
        return;
      }
      this.lose('another orchestrator took the lease');
    } catch (err) {
      if (Date.now() - this.lastRenewedAt > this.lease.ttlMs) this.lose(`the lease could not be renewed for ${this.lease.ttlMs} ms: ${(err as Error).message}`);
      else this.options.log(`cluster: renewing the lease failed, trying again: ${(err as Error).message}`);
    }
  }

  private async takeOver(term: number): Promise<void> {
    this.holding = true;
    this.lastRenewedAt = Date.now();
    this.options.log(`cluster: took the lease (term ${term}); starting the orchestrator`);
    const port = this.forwarder?.port ?? 0;
    await this.forwarder?.close();
    this.forwarder = null;
    const o = this.options.orchestrator;
    try {
      const advertised = this.options.advertiseUrl ? new URL(this.options.advertiseUrl).hostname : null;
      this.running = await startOrchestrator({
        ...o,
        port,
        // the followers prove the clients they forward for with this term's key; the advertised name is the dashboard's too
        forwardKey: this.lease.forwardKey,
        hostNames: [...(o.hostNames ?? []), ...(advertised && !isIP(advertised.replace(/^\[|\]$/g, '')) ? [advertised] : [])],
        stateOptions: {
          ...o.stateOptions,
          fence: this.lease.fence(() => this.lose('a state write found another orchestrator holding the lease')),
          // a leader frozen inside a transaction holds the lease row: PostgreSQL ends its session after this, so the next leader can take over
          settings: { idle_in_transaction_session_timeout: 2 * this.lease.ttlMs, ...o.stateOptions?.settings },
        },
      });
    } catch (err) {
      this.holding = false;
      try {
        this.lease.release();
      } catch {
        // it expires by itself
      }
      throw err;
    }
    if (this.lost || !this.joined) return;
    this.options.onLeading?.(this.running, term);
  }

  private lose(why: string): void {
    if (this.lost) return;
    this.lost = true;
    this.holding = false;
    this.options.log(`cluster: stopped leading: ${why}`);
    this.options.onLost(why);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    await this.polling?.catch(() => {});
    await this.starting?.catch(() => {});
    await this.forwarder?.close();
    if (this.running) {
      await this.running.close();
      // let go at once: a follower need not wait for the lease to expire
      if (this.holding) {
        try {
          this.lease.release();
        } catch (err) {
          this.options.log(`cluster: could not let go of the lease (it expires in ${this.lease.ttlMs} ms): ${(err as Error).message}`);
        }
      }
    }
    this.lease.close();
  }
}
