// Microbatches through the pipeline, credited on evidence.
//
// A microbatch is issued to a stage-0 replica as an attempt with the
// orchestrator's ticket. Each hop's miner claims its forward and backward
// (src/orchestrator/state/claims.ts); a claim that hands the frame on carries
// the receiver's receipt. The attempt is done, and its 2·S hops credited once
// each to the miners that did them, when the claims chain up: stage 0 is the
// miner it was issued to, each next hop is the receipted receiver of the one
// before, each hop's input frame is the one its sender sent, and the gradient
// comes back the same way. Until then nothing is credited; a claim that is a
// repeat, for another attempt, or from a miner off the path earns nothing; a
// claim no honest miner could make (of an attempt never issued, of a stage-0
// forward issued to another miner, with a receipt that does not verify) is
// an offence of the claimant (src/orchestrator/rewards/offences.ts).
//
// A microbatch is issued again when a miner on its path vanishes or drops it,
// or when its deadline passes; then the miner it stalled at (the first hop,
// in pipeline order, without a receipted claim: the evidence says it held the
// microbatch) is charged one dropped unit. Nobody's word alone costs another.
// A microbatch handed to a miner the plan has moved off that stage is issued
// again at once, and nobody is charged: the orchestrator's move stopped it.
import { itemsPerMicrobatch } from '../../model/model-ref.ts';
import { verifyReceipt, type TicketFields } from '../../protocol/evidence.ts';
import type { MicrobatchTask, WorkReport } from '../../protocol/messages.ts';
import { pipelineRoom, replicaIssueLimit } from './issue-policy.ts';
import type { SpotChecks } from './spot-checks.ts';
import type { HopClaim } from '../state/claims.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MicrobatchRecord } from '../state/microbatches.ts';
import type { RunRecord } from '../state/runs.ts';

/** Completions older than this no longer count toward tokens/s. */
const RATE_WINDOW_MS = 10_000;
/** Microbatches named in one heartbeat reply, at most. */
const PER_REPLY = 4096;

export interface MicrobatchOptions {
  /** a microbatch not finished this long after issue is re-issued */
  deadlineMs: number;
  /** activation slots each miner keeps */
  slots: number;
}

/** What the flow needs to make and check evidence. */
export interface Evidence {
  /** the network's signing domain */
  domain: string;
  /** the orchestrator's ticket for an issued microbatch */
  ticket(fields: TicketFields): string;
  /** the session keys a miner registered at its recent joins, newest first */
  receiptKeysOf(minerId: string): readonly string[];
}

/** Where an attempt stands: complete (its path and loss), or stalled at a miner (null: not even issued). */
type Evaluation = { complete: true; path: string[]; loss: number | null; bytes: number } | { complete: false; culprit: string | null; path: (string | null)[]; progress: number };

export class MicrobatchFlow {
  /** recent completions per run, for tokens/s */
  private readonly completions = new Map<string, { at: number; tokens: number }[]>();

  constructor(
    private readonly state: OrchestratorState,
    private readonly checks: SpotChecks,
    private readonly options: MicrobatchOptions,
    private readonly evidence: Evidence,
    private readonly now: () => number,
  ) {}

  private task(run: RunRecord, mb: Pick<MicrobatchRecord, 'id' | 'attempts' | 'shard' | 'step'>): MicrobatchTask {
    const fields = { runId: run.id, microbatch: mb.id, attempt: mb.attempts, shard: mb.shard, step: mb.step };
    return { id: mb.id, attempt: mb.attempts, shard: mb.shard, step: mb.step, ticket: this.evidence.ticket(fields) };
  }

  /** Gives a stage-0 replica up to `freeSlots` new microbatches: re-issues first, then new shards. */
  issue(run: RunRecord, minerId: string, freeSlots: number): MicrobatchTask[] {
    if (run.status !== 'started' && run.status !== 'executing') return [];
    const assignments = this.state.runs.assignments(run.id);
    const replicas = this.state.runs.stages(run.id).map((s) => assignments.filter((a) => a.stage === s.stage).length);
    if (replicas.length === 0 || replicas.some((n) => n === 0)) return [];
    // the pipeline carries no more than its narrowest stage holds (two slots' worth per replica): deeper queues only miss deadlines
    const room = pipelineRoom(this.options.slots, replicas);
    const now = this.now();
    // its microbatches of this run (those of a run that ended meanwhile are not in its pipeline any more)
    const inFlight = this.state.microbatches.issuedTo(minerId).filter((mb) => mb.runId === run.id).length;
    // up to two slots' worth per miner (the ones it runs and the ones queued behind them), and its share of the room
    let want = Math.min(freeSlots, replicaIssueLimit(this.options.slots, replicas) - inFlight);
    const issued: number[] = [];
    this.state.tx(() => {
      const runInFlight = this.state.microbatches.count(run.id, 'issued');
      want = Math.min(want, run.steps - run.microbatchesDone - runInFlight, room - runInFlight);
      const issueOne = (id: number): void => {
        this.state.microbatches.issue(id, minerId, now, now + this.options.deadlineMs);
        issued.push(id);
      };
      for (const mb of this.state.microbatches.byStatus(run.id, 'pending', Math.max(0, want))) issueOne(mb.id);
      let created = run.microbatchesCreated;
      while (issued.length < want && created < run.steps) {
        issueOne(this.state.microbatches.insert(run.id, (run.options.shardBase ?? 0) + created, created));
        created++;
      }
      if (created !== run.microbatchesCreated) this.state.runs.setCreated(run.id, created);
      if (run.status === 'started' && issued.length) this.state.runs.setStatus(run.id, 'executing');
    });
    return issued.map((id) => this.task(run, this.state.microbatches.get(id)!));
  }

  /**
   * Microbatches issued to a stage-0 replica that it neither holds nor has
   * started: a heartbeat reply that carried them was lost. Sent again, same
   * attempt and ticket, so a resent heartbeat loses nothing.
   */
  unstartedOf(run: RunRecord, minerId: string, held: readonly { microbatch: number; attempt: number }[]): MicrobatchTask[] {
    const holds = new Set(held.map((h) => `${h.microbatch}/${h.attempt}`));
    const out: MicrobatchTask[] = [];
    for (const mb of this.state.microbatches.issuedTo(minerId)) {
      if (mb.runId !== run.id || holds.has(`${mb.id}/${mb.attempts}`)) continue;
      // any claim of its stage-0 hops (a backward may be reported before the forward's receipt came) says it started it
      if (this.state.claims.ofAttempt(mb.id, mb.attempts).some((c) => c.stage === 0 && c.minerId === minerId)) continue;
      out.push(this.task(run, mb));
      if (out.length >= PER_REPLY) break;
    }
    return out;
  }

  /** Of the microbatches a miner holds, those it should let go: re-issued since (another attempt), done or unknown. */
  abandonedOf(held: readonly { microbatch: number; attempt: number }[]): number[] {
    const out: number[] = [];
    for (const h of held) {
      const mb = this.state.microbatches.get(h.microbatch);
      if (!mb || mb.status !== 'issued' || mb.attempts !== h.attempt) out.push(h.microbatch);
      if (out.length >= PER_REPLY) break;
    }
    return out;
  }

  /**
   * Takes one claim of `minerId`, who holds `stage` of `run`. A claim of a
   * microbatch's current attempt is recorded once; stale claims and repeats
   * change nothing. A miner on the path that reports dropping the microbatch
   * is charged for it and the microbatch is issued again. Returns why the
   * claim is false when no honest miner could have made it (the caller
   * charges the offence), else null.
   */
  applyReport(minerId: string, run: RunRecord, r: WorkReport): string | null {
    const now = this.now();
    const mb = this.state.microbatches.get(r.microbatch);
    if (!mb || mb.runId !== run.id) return null; // unknown (or collected): earns nothing
    if (r.attempt > mb.attempts) return `microbatch ${mb.id} attempt ${r.attempt} was never issued`;
    if (mb.status !== 'issued' || mb.attempts !== r.attempt) return null; // stale: earns nothing
    if (r.phase === 'dropped') {
      if (mb.path[r.stage] !== minerId) return null;
      this.state.tx(() => {
        this.state.ledger.logWork({ minerId, runId: run.id, kind: 'dropped', stage: r.stage, detail: r.reason ?? null }, now);
        this.state.microbatches.requeue(mb.id);
      });
      return null;
    }
    if (r.stage === 0 && r.phase === 'forward' && mb.minerId !== minerId) return `microbatch ${mb.id} attempt ${r.attempt} was issued to another miner`;
    const S = run.stageCount;
    const handsOn = r.phase === 'forward' ? r.stage < S - 1 : r.stage > 0;
    let nextId: string | null = null;
    if (handsOn && r.next && r.receipt && r.outputSha) {
      const receipt = { runId: run.id, microbatch: mb.id, attempt: mb.attempts, stage: r.phase === 'forward' ? r.stage + 1 : r.stage - 1, phase: r.phase, frameSha: r.outputSha };
      // the receiver may have restarted (a new session key) since it signed: any of its recent keys
      if (!this.evidence.receiptKeysOf(r.next).some((key) => verifyReceipt(key, this.evidence.domain, receipt, r.receipt!))) {
        return `microbatch ${mb.id}: a receipt from ${r.next} that does not verify`;
      }
      nextId = r.next;
    }
    const claim: HopClaim = {
      microbatch: mb.id,
      attempt: mb.attempts,
      stage: r.stage,
      phase: r.phase,
      minerId,
      nextId,
      inputSha: r.inputSha ?? null,
      outputSha: r.outputSha ?? null,
      loss: r.phase === 'forward' && r.stage === S - 1 ? (r.loss ?? null) : null,
      round: this.state.runs.stage(run.id, r.stage)?.round ?? 0,
      at: now,
      bytes: nextId ? r.bytesSent : 0,
    };
    this.state.tx(() => {
      if (!this.state.claims.put(claim)) return; // a repeat
      if (r.phase === 'forward') this.checks.onForward(run, claim);
      if (nextId && r.phase === 'forward' && !this.holds(run, nextId, r.stage + 1)) {
        // The receiver does not hold the next stage: the plan moved it off since the sender last heard its
        // routing (an honest miner takes that stage's frames until its own next heartbeat, then lets them go).
        // The microbatch cannot go on there: issued again now, charging nobody, as `release` does with the
        // work a moved miner held.
        this.state.microbatches.requeue(mb.id);
        return;
      }
      this.settle(run, this.state.microbatches.get(mb.id)!);
    });
    return null;
  }

  /** Whether `minerId` holds `stage` of `run` in the plan now. */
  private holds(run: RunRecord, minerId: string, stage: number): boolean {
    const a = this.state.runs.assignmentOf(minerId);
    return a !== undefined && a.runId === run.id && a.stage === stage;
  }

  /** Completes an attempt whose claims chain up (crediting every hop once), or notes how far it got. */
  private settle(run: RunRecord, mb: MicrobatchRecord): void {
    const e = this.evaluate(run, mb);
    if (!e.complete) {
      this.state.microbatches.recordHop(mb.id, e.progress, e.path, null);
      return;
    }
    const now = this.now();
    const S = run.stageCount;
    this.state.microbatches.complete(mb.id, 2 ** (2 * S) - 1, e.path, e.loss);
    e.path.forEach((minerId, stage) => {
      this.state.ledger.logWork({ minerId, runId: run.id, kind: 'forward', stage }, now);
      this.state.ledger.logWork({ minerId, runId: run.id, kind: 'backward', stage }, now);
    });
    if (e.loss !== null) {
      this.state.runs.recordLoss(run.id, e.loss);
      this.state.runs.recordStageLoss(run.id, S - 1, e.loss);
    }
    // tokens for a GPT, examples for an MLP classifier: what the run's tokens counters count
    const tokens = itemsPerMicrobatch(run.model, run.batchSize);
    this.state.runs.addCounters(run.id, { microbatches: 1, tokens, bytes: e.bytes });
    this.state.runs.addInnerStep(run.id);
    let list = this.completions.get(run.id);
    if (!list) this.completions.set(run.id, (list = []));
    list.push({ at: now, tokens });
    while (list.length > 0 && list[0].at < now - RATE_WINDOW_MS) list.shift();
  }

  /** Walks an attempt's claims along the pipeline: forward from the miner it was issued to, then backward. */
  private evaluate(run: RunRecord, mb: MicrobatchRecord): Evaluation {
    const S = run.stageCount;
    const claims = this.state.claims.ofAttempt(mb.id, mb.attempts);
    const find = (stage: number, phase: 'forward' | 'backward', miner: string): HopClaim | undefined =>
      claims.find((c) => c.stage === stage && c.phase === phase && c.minerId === miner);
    const path: string[] = mb.minerId ? [mb.minerId] : [];
    let progress = 0;
    const stalled = (culprit: string | null): Evaluation => ({ complete: false, culprit, path: [...path], progress });
    if (!mb.minerId) return stalled(null);
    const forward: HopClaim[] = [];
    for (let s = 0; s < S; s++) {
      const c = find(s, 'forward', path[s]);
      if (!c || (s > 0 && c.inputSha !== forward[s - 1].outputSha)) return stalled(path[s]);
      forward.push(c);
      progress |= 1 << s;
      if (s < S - 1) {
        if (!c.nextId) return stalled(path[s]);
        path.push(c.nextId);
      }
    }
    const backward: HopClaim[] = [];
    for (let s = S - 1; s >= 0; s--) {
      const c = find(s, 'backward', path[s]);
      if (!c) return stalled(path[s]);
      if (s > 0 && c.nextId !== path[s - 1]) return stalled(path[s]);
      if (s < S - 1 && c.inputSha !== backward[0].outputSha) return stalled(path[s]);
      backward.unshift(c);
      progress |= 1 << (S + s);
    }
    return { complete: true, path, loss: forward[S - 1].loss, bytes: [...forward, ...backward].reduce((a, c) => a + c.bytes, 0) };
  }

  /**
   * A miner is gone: every microbatch it still owed a hop of goes back in the
   * queue, each a dropped unit for it. Microbatches whose hops it had all done
   * carry on without it.
   */
  dropAllOf(minerId: string, why: string): void {
    const now = this.now();
    for (const run of this.state.runs.active()) {
      for (const mb of this.owedBy(run, minerId)) {
        this.state.ledger.logWork({ minerId, runId: run.id, kind: 'dropped', detail: `${why} holding microbatch ${mb.id}` }, now);
        this.state.microbatches.requeue(mb.id);
      }
    }
  }

  /**
   * The orchestrator moved a miner off its stage of `runId`: every microbatch
   * it still owed a hop of there goes back in the queue, charging nobody (the
   * miners holding it are told to abandon it).
   */
  release(runId: string, minerId: string): void {
    const run = this.state.runs.get(runId);
    if (!run) return;
    for (const mb of this.owedBy(run, minerId)) this.state.microbatches.requeue(mb.id);
  }

  private owedBy(run: RunRecord, minerId: string): MicrobatchRecord[] {
    return this.state.microbatches.byStatus(run.id, 'issued').filter((mb) => this.owes(run, mb, minerId));
  }

  /** Whether `minerId` is on the microbatch's path with a hop of it not yet claimed. */
  private owes(run: RunRecord, mb: MicrobatchRecord, minerId: string): boolean {
    const stage = mb.path.indexOf(minerId);
    if (stage < 0) return false;
    const mine = this.state.claims.ofAttempt(mb.id, mb.attempts).filter((c) => c.minerId === minerId && c.stage === stage);
    const forward = mine.some((c) => c.phase === 'forward' && (stage === run.stageCount - 1 || c.nextId));
    const backward = mine.some((c) => c.phase === 'backward' && (stage === 0 || c.nextId));
    return !(forward && backward);
  }

  /** Issued microbatches past their deadline go back in the queue; the miner the evidence says held it is charged. */
  expireDeadlines(run: RunRecord): void {
    const now = this.now();
    for (const mb of this.state.microbatches.byStatus(run.id, 'issued')) {
      if (mb.deadline === null || mb.deadline >= now) continue;
      const e = this.evaluate(run, mb);
      const culprit = e.complete ? null : e.culprit;
      this.state.tx(() => {
        if (culprit) this.state.ledger.logWork({ minerId: culprit, runId: run.id, kind: 'dropped', detail: `microbatch ${mb.id} missed its deadline` }, now);
        this.state.microbatches.requeue(mb.id);
      });
    }
  }

  /** The run has ended: its completions are let go (src/orchestrator/blobs/gc.ts). */
  forget(runId: string): void {
    this.completions.delete(runId);
  }

  /** Runs whose recent completions are kept in memory. */
  get runsTracked(): number {
    return this.completions.size;
  }

  /** Training tokens per second over the last RATE_WINDOW_MS. */
  tokensPerSecond(runId: string): number {
    const now = this.now();
    const list = (this.completions.get(runId) ?? []).filter((c) => c.at >= now - RATE_WINDOW_MS);
    if (list.length < 2) return 0;
    const tokens = list.slice(1).reduce((a, c) => a + c.tokens, 0);
    return (tokens * 1000) / Math.max(1, list[list.length - 1].at - list[0].at);
  }
}
