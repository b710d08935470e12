// A single-thread miner process on a shared host (SimOptions.host): its jobs
// end when the host's cores have done their work (./host.ts), then it rests
// if throttled; and its heartbeat loop, as src/miner/miner.ts runs it: the
// timer fires heartbeatMs after the last request went out (or as soon as its
// reply is handled, if that took longer), but not while a job computes on
// the miner's one thread: then after the job, once the receipts that came
// meanwhile are read (afterWork). The request carries the reports of the
// hops done since the last one, and the orchestrator counts a microbatch
// done when the last of its hops is reported; the reply (new microbatches
// for a stage-0 replica) is handled after the job running when it arrives.
// A miner of its own machine keeps the fixed heartbeat grid of ./world.ts
// instead.
import { complete, deliver, issueFor, receiptReaches, reportedFreeSlots, restAfter } from './flow.ts';
import type { SimMiner } from './types.ts';
import type { World } from './world.ts';

/** Starts miner m's heartbeat loop (its first beat at its phase of the grid). */
export function startBeats(w: World, m: SimMiner): void {
  w.schedule(w.nextHeartbeat(m), { type: 'beat', miner: m.index });
}

/** Whether a job computes on m's thread now (its rest after it is a timer: the thread is free). */
function working(w: World, m: SimMiner): boolean {
  return w.host?.has(m.index) ?? false;
}

/** m's heartbeat timer fired: the request and its reports reach the orchestrator, its reply comes back a round trip later. */
export function beat(w: World, m: SimMiner): void {
  if (!m.alive) return;
  if (working(w, m)) {
    m.beatDue = true;
    return;
  }
  m.beatSentAt = w.now;
  m.askedSlots = reportedFreeSlots(w, m);
  const reports = m.unreported;
  m.unreported = [];
  let counted = 0;
  for (const r of reports) {
    const mb = w.microbatches[r.mb];
    if (mb.status !== 'issued' || mb.attempt !== r.attempt) continue;
    counted++;
    if (++mb.reportedHops === w.stageCount) complete(w, mb);
  }
  // the orchestrator's one thread handles the request after what it is doing: its cost, and a microbatch's CPU spread over its stages' reports
  const host = w.options.host!;
  w.host!.addOrchestratorWork((host.orchestratorMsPerHeartbeat ?? 0) + (host.orchestratorMsPerMicrobatch * counted) / w.stageCount, w.now, m.index);
  // the miner's own thread sends it: that CPU runs before its next job
  m.beatCpuMs += host.minerMsPerHeartbeat ?? 0;
  w.scheduleHost();
}

/** m handles its heartbeat's reply: a stage-0 replica takes what it was issued; the next beat is a heartbeat period after the request went out. */
export function reply(w: World, m: SimMiner): void {
  if (!m.alive) return;
  if (working(w, m)) {
    m.replyDue = true;
    return;
  }
  const jobs = m.inbox;
  m.inbox = [];
  deliver(w, m, jobs);
  w.schedule(Math.max(w.now, m.beatSentAt + w.options.heartbeatMs), { type: 'beat', miner: m.index });
}

/**
 * m's job stopped computing: what waited for its thread runs now, as
 * src/miner/pipeline.ts orders it: first the I/O that came during the job
 * (the answers to frames it took in, with their receipts; the receipts for
 * its own frames, whose reports it notes), then a heartbeat that came due
 * meanwhile (Pipeline.whenSettled: so the request carries those reports),
 * and the reply to a heartbeat.
 */
export function afterWork(w: World, m: SimMiner): void {
  for (const r of m.accepts) receiptReaches(w, w.miners[r.from], r);
  m.accepts = [];
  m.unreported.push(...m.receiptsDue);
  m.receiptsDue = [];
  if (m.beatDue) {
    m.beatDue = false;
    beat(w, m);
  }
  if (m.replyDue) {
    m.replyDue = false;
    reply(w, m);
  }
}

/** A shared host's event: the miners whose work ended now rest, then their jobs are computed; the heartbeats answered get their replies; a stale event (the host changed since) does nothing. */
export function hostEvent(w: World, version: number): void {
  if (!w.host || version !== w.host.version) return;
  const { jobs, replies } = w.host.takeDone(w.now);
  for (const i of replies) {
    // the orchestrator answers after the request's reports: a stage-0 replica gets microbatches for the free slots it reported
    const m = w.miners[i];
    m.inbox = issueFor(w, m, m.askedSlots);
    w.schedule(w.now + 2 * m.latencyMs, { type: 'reply', miner: i });
  }
  for (const i of jobs) {
    const m = w.miners[i];
    const job = m.job;
    if (!job) continue;
    const ms = w.now - m.busyFrom;
    m.workUntil = w.now;
    m.busyUntil = w.now + restAfter(m, ms);
    m.busyMs += ms;
    w.timeline.addBusy(m.busyFrom, w.now);
    w.schedule(m.busyUntil, { type: 'computed', miner: m.index, job });
    afterWork(w, m);
  }
  w.scheduleHost();
}
