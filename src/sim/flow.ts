// Microbatches through the simulated pipeline, by the orchestrator's and the
// miners' rules:
// - a stage-0 replica gets microbatches on its heartbeat, re-issues first, up
//   to the limits of src/orchestrator/training/issue-policy.ts (pipelineRoom,
//   replicaIssueLimit), none while a merge is due or running, and only when
//   every later stage has a replica that holds its stage (coordinator.ts);
// - a miner runs backward jobs first, and a forward only with a free
//   activation slot (src/miner/pipeline.ts nextJob); the last stage runs
//   forward, loss and backward in one job;
// - the next hop is drawn among the next stage's replicas in proportion to
//   peerWeight(GFLOP/s, queue) (coordinator.ts peersOf, miner pickWeighted);
//   the gradient goes back along the same path;
// - a frame takes bytes / min(sender's upload, receiver's download) after
//   both links are free, plus both latencies; sends do not block compute;
// - each hop's report rides its miner's next heartbeat (src/miner/miner.ts):
//   the orchestrator counts the attempt done, and its place free, once the
//   last of them arrived;
// - a microbatch not done by its deadline, or owed by a miner noticed gone,
//   is issued again and the miner it stalled at is charged a dropped unit
//   (src/orchestrator/training/microbatches.ts expireDeadlines, dropAllOf).
import { nextJobIndex } from '../miner/job-order.ts';
import { restMs } from '../miner/throttle.ts';
import { mergeDue, peerWeight, pipelineRoom, replicaIssueLimit } from '../orchestrator/training/issue-policy.ts';
import type { Rng } from './rng.ts';
import type { World } from './world.ts';
import type { Job, SimMicrobatch, SimMiner } from './types.ts';

/** Stages with at least this many replicas draw their next hop by rejection first (drawNextHop). */
export const REJECTION_MIN_REPLICAS = 64;
/** Rejection tries before the draw falls back to the linear one. */
export const REJECTION_TRIES = 32;

/**
 * The next hop on `stage`: a replica the orchestrator routes to (as
 * World.hasRoutable: not noticed gone, done downloading), drawn in proportion
 * to peerWeight. Null when there is none (on a small stage no number is
 * drawn then).
 *
 * On a stage of fewer than REJECTION_MIN_REPLICAS replicas it is the draw
 * Rng.weighted makes over the routable list, sum for sum in the same order,
 * without building the lists. A forward hop is the simulator's most frequent
 * event, and a stage of 10,000 home GPUs has hundreds of replicas, so larger
 * stages first try rejection sampling: a replica drawn uniformly is taken
 * with probability peerWeight / the stage's largest GFLOP/s (peerWeight is at
 * most the replica's GFLOP/s), which picks each routable replica in
 * proportion to its weight in O(1) expected tries while queues are short.
 * After REJECTION_TRIES refusals the linear draw decides; a mixture of two
 * exact draws is exact, so the distribution is the same either way, but the
 * random numbers used are not: large stages' runs differ from the linear
 * draw's run by chance, not by law.
 *
 * With the what-if route 'two-choices' the sender draws twice by that law
 * and takes the replica with the larger peerWeight (the shorter queue for
 * its speed), reading the replicas' queues as they are (the network's
 * senders know them only as the orchestrator last heard them).
 */
export function drawNextHop(w: World, stage: number, rng: Rng = w.rng): SimMiner | null {
  const first = weightedHop(w, stage, rng);
  if (w.options.route !== 'two-choices' || first === null) return first;
  // the what-if: a second draw by the same law, and the one whose queue is shorter for its speed
  const second = weightedHop(w, stage, rng)!;
  return peerWeight(second.gflops, second.queue.length) > peerWeight(first.gflops, first.queue.length) ? second : first;
}

/** One draw of the network's rule (drawNextHop). */
function weightedHop(w: World, stage: number, rng: Rng): SimMiner | null {
  const members = w.members[stage];
  if (!members) return null;
  const bounds = w.memberLists[stage];
  if (bounds && bounds.list.length >= REJECTION_MIN_REPLICAS && bounds.maxGflops > 0) {
    const { list, maxGflops } = bounds;
    for (let t = 0; t < REJECTION_TRIES; t++) {
      const p = w.miners[list[Math.floor(rng.next() * list.length)]];
      if (p.gone || p.readyAt > w.now) continue;
      if (rng.next() * maxGflops < peerWeight(p.gflops, p.queue.length)) return p;
    }
  }
  let total = 0;
  let last: SimMiner | null = null;
  for (const i of members) {
    const p = w.miners[i];
    if (p.gone || p.readyAt > w.now) continue;
    total += peerWeight(p.gflops, p.queue.length);
    last = p;
  }
  if (last === null) return null;
  let r = rng.next() * total;
  for (const i of members) {
    const p = w.miners[i];
    if (p.gone || p.readyAt > w.now) continue;
    r -= peerWeight(p.gflops, p.queue.length);
    if (r < 0) return p;
  }
  return last;
}

/** Schedules an issue check at the next heartbeat of every stage-0 replica that has none scheduled. */
export function wakeStageZero(w: World): void {
  if (w.host) return; // on a shared host every miner's heartbeat loop runs anyway (./host-miner.ts)
  for (const i of w.members[0] ?? []) {
    const m = w.miners[i];
    if (m.issueScheduled || !m.alive) continue;
    m.issueScheduled = true;
    w.schedule(w.nextHeartbeat(m), { type: 'issue', miner: i });
  }
}

/** A stage-0 replica's heartbeat on the grid: the microbatches issued to it, taken at once. */
export function issueTo(w: World, m: SimMiner): void {
  m.issueScheduled = false;
  deliver(w, m, issueFor(w, m, reportedFreeSlots(w, m)));
}

/** The free slots a replica reports on its heartbeat (src/miner/miner.ts): a slot's worth more than is free, less the starts it has queued. */
export function reportedFreeSlots(w: World, m: SimMiner): number {
  const slots = w.options.slots;
  return Math.max(0, slots - m.held.size + slots - m.queue.filter((j) => j.kind === 'start').length);
}

/** Jobs the miner was given: queued, and the next started if it is idle. */
export function deliver(w: World, m: SimMiner, jobs: Job[]): void {
  m.queue.push(...jobs);
  tryStart(w, m);
}

/** The orchestrator's answer to a stage-0 replica's heartbeat that reported `freeSlots`: new (or re-issued) microbatches, as many as the policy allows. */
export function issueFor(w: World, m: SimMiner, freeSlots: number): Job[] {
  const jobs: Job[] = [];
  if (!m.alive || m.gone || m.stage !== 0 || m.readyAt > w.now || w.draining || w.merging || w.stalled) return jobs;
  const S = w.stageCount;
  for (let s = 1; s < S; s++) if (!w.hasRoutable(s)) return jobs;
  const replicas = w.members.map((set) => set.size);
  const slots = w.options.slots;
  const inFlight = w.issuedTo.get(m.index) ?? 0;
  const want = Math.min(freeSlots, replicaIssueLimit(slots, replicas) - inFlight, pipelineRoom(slots, replicas) - w.issued.size);
  for (let k = 0; k < want; k++) {
    let mb: SimMicrobatch;
    const again = w.pending.shift();
    if (again !== undefined) mb = w.microbatches[again];
    else {
      mb = { id: w.microbatches.length, attempt: 0, status: 'pending', path: [], holder: -1, backwardFrom: S, hopDoneAt: [], reportedHops: 0 };
      w.microbatches.push(mb);
    }
    mb.attempt++;
    mb.status = 'issued';
    mb.path = [m.index];
    mb.holder = m.index;
    mb.backwardFrom = S;
    mb.hopDoneAt = [];
    mb.reportedHops = 0;
    w.issued.add(mb.id);
    w.issuedTo.set(m.index, (w.issuedTo.get(m.index) ?? 0) + 1);
    jobs.push({ kind: 'start', mb: mb.id, attempt: mb.attempt });
    w.schedule(w.now + w.options.deadlineMs, { type: 'deadline', mb: mb.id, attempt: mb.attempt });
  }
  return jobs;
}

function current(w: World, job: Job): boolean {
  const mb = w.microbatches[job.mb];
  return mb.status === 'issued' && mb.attempt === job.attempt;
}

/** Starts the miner's next job if it is idle, in the real miner's order (one forward, one backward: src/miner/job-order.ts); stale jobs are let go. */
export function tryStart(w: World, m: SimMiner): void {
  if (!m.alive || m.busyUntil >= 0 || m.stage < 0) return;
  for (let k = m.queue.length - 1; k >= 0; k--) if (!current(w, m.queue[k])) m.queue.splice(k, 1);
  const last = m.stage === w.stageCount - 1;
  const idx = nextJobIndex(m.queue, last || m.held.size < w.options.slots, m.lastWasBackward);
  if (idx < 0) return;
  const job = m.queue.splice(idx, 1)[0];
  m.lastWasBackward = job.kind === 'backward';
  const ms = w.jobCoreMs(m, job.kind === 'backward' ? 'backward' : last ? 'both' : 'forward');
  if (job.kind !== 'backward' && !last) m.held.add(job.mb);
  m.busyFrom = w.now;
  m.job = job;
  if (w.host) {
    // its end depends on what else runs on the host's cores meanwhile (./host-miner.ts hostEvent)
    m.busyUntil = m.workUntil = Infinity;
    w.host.start(m.index, ms, w.now);
    w.scheduleHost();
    return;
  }
  m.workUntil = w.now + ms;
  m.busyUntil = m.workUntil + restAfter(m, ms);
  m.busyMs += ms;
  w.timeline.addBusy(w.now, w.now + ms);
  w.schedule(m.busyUntil, { type: 'computed', miner: m.index, job });
}

/** A throttled miner's rest after `workMs` of work. */
export function restAfter(m: SimMiner, workMs: number): number {
  return restMs(m.throttle, workMs);
}

/** A job finished on miner m. */
export function computed(w: World, m: SimMiner, job: Job): void {
  m.busyUntil = -1;
  m.job = null;
  if (!m.alive) return;
  if (!current(w, job)) {
    w.counters.wastedComputeMs += w.now - m.busyFrom;
    tryStart(w, m);
    return;
  }
  const mb = w.microbatches[job.mb];
  const s = m.stage;
  const S = w.stageCount;
  if (job.kind !== 'backward' && s < S - 1) {
    const next = drawNextHop(w, s + 1);
    if (next === null) {
      w.counters.noPeer++;
      requeue(w, mb, m.index, 'noPeer');
    } else {
      mb.path[s + 1] = next.index;
      send(w, m, next, { kind: 'forward', mb: mb.id, attempt: mb.attempt });
    }
  } else {
    m.held.delete(mb.id);
    mb.backwardFrom = s;
    mb.hopDoneAt[s] = w.now;
    if (s > 0) send(w, m, w.miners[mb.path[s - 1]], { kind: 'backward', mb: mb.id, attempt: mb.attempt });
    // the orchestrator counts the attempt done once every hop's report reached it, each on its miner's next heartbeat;
    // on a shared host the miners' heartbeat loops carry them (./host-miner.ts), a hop that sent a frame once the receiver accepted it (arrive)
    if (w.host) {
      if (s === 0) m.unreported.push({ mb: mb.id, attempt: mb.attempt });
    } else if (s === 0) {
      const at = Math.max(...mb.path.map((i, stage) => w.heartbeatAfter(w.miners[i], mb.hopDoneAt[stage] ?? w.now)));
      // just before that heartbeat: its reply may already issue the microbatch that takes the freed place
      w.schedule(Math.max(w.now, at - 1e-6), { type: 'reported', mb: mb.id, attempt: mb.attempt });
    }
  }
  tryStart(w, m);
}

/** A frame from `from` to `to`: queued behind both links, then bytes over the slower one, plus both latencies. */
function send(w: World, from: SimMiner, to: SimMiner, job: Job): void {
  const bytes = w.activationBytes;
  const mbps = Math.min(from.upMbps, to.downMbps);
  const start = Math.max(w.now, from.upFree, to.downFree);
  const end = start + (bytes * 8) / (mbps * 1e6) * 1000;
  from.upFree = end;
  to.downFree = end;
  w.counters.activationBytes += bytes;
  w.schedule(end + from.latencyMs + to.latencyMs, { type: 'arrive', miner: to.index, job, from: from.index });
}

/** A frame from miner `from` reached miner m: it holds the microbatch's next hop from now. */
export function arrive(w: World, m: SimMiner, job: Job, from: number): void {
  if (!current(w, job)) return;
  const mb = w.microbatches[job.mb];
  if (!m.alive) return; // lost; re-issued when the orchestrator notices the miner gone
  const expected = mb.path.indexOf(m.index);
  if (m.gone || m.stage !== expected) {
    // the receiver left the stage: the sender's send fails and the microbatch goes back, charging nobody
    requeue(w, mb, -1, 'churn');
    return;
  }
  mb.holder = m.index;
  m.queue.push(job);
  tryStart(w, m);
  if (w.host && job.kind === 'backward') {
    // the sender reports its last hop with the receipt in m's answer, which m's thread gives once its job is done (an idle m runs the frame's job first)
    const receipt = { from, mb: mb.id, attempt: mb.attempt };
    if (w.host.has(m.index)) m.accepts.push(receipt);
    else receiptReaches(w, w.miners[from], receipt);
  }
}

/** On a shared host, a receipt reaches the miner that sent the frame: it notes the hop's report once its thread is free (./host-miner.ts afterWork), before a heartbeat that came due meanwhile. */
export function receiptReaches(w: World, sender: SimMiner, r: { mb: number; attempt: number }): void {
  if (w.host?.has(sender.index)) sender.receiptsDue.push({ mb: r.mb, attempt: r.attempt });
  else sender.unreported.push({ mb: r.mb, attempt: r.attempt });
}

/** The last report of a microbatch's attempt reached the orchestrator: done, unless it was let go meanwhile or a miner on its path left before the heartbeat that would have carried its report (the orchestrator re-issues it when it notices, ./control.ts noticed). */
export function reported(w: World, id: number, attempt: number): void {
  const mb = w.microbatches[id];
  if (mb.status !== 'issued' || mb.attempt !== attempt) return;
  if (mb.path.some((_, stage) => reportLost(w, mb, stage))) return;
  complete(w, mb);
}

/** Whether the report of a done hop was lost: its miner left before the heartbeat that would have carried it (the orchestrator re-issues the microbatch when it notices, ./control.ts noticed). */
export function reportLost(w: World, mb: SimMicrobatch, stage: number): boolean {
  const m = w.miners[mb.path[stage]];
  if (w.host) {
    const mine = (r: { mb: number; attempt: number }): boolean => r.mb === mb.id && r.attempt === mb.attempt;
    // noted but not yet sent, or its receipt come but not yet read
    return m.leftAt !== null && (m.unreported.some(mine) || m.receiptsDue.some(mine));
  }
  const doneAt = mb.hopDoneAt[stage];
  return doneAt !== undefined && m.leftAt !== null && w.heartbeatAfter(m, doneAt) >= m.leftAt;
}

/** A microbatch's hops are all reported: credited hop by hop, counted, maybe a merge becomes due. */
export function complete(w: World, mb: SimMicrobatch): void {
  mb.status = 'done';
  w.issued.delete(mb.id);
  w.issuedTo.set(mb.path[0], (w.issuedTo.get(mb.path[0]) ?? 1) - 1);
  w.counters.done++;
  w.timeline.addTokens(w.now, w.tokensPerMicrobatch);
  mb.path.forEach((i, stage) => {
    w.ledger.log(w.now, w.miners[i].id, 'forward', stage);
    w.ledger.log(w.now, w.miners[i].id, 'backward', stage);
  });
  w.innerSteps++;
  if (!w.draining && mergeDue(w.innerSteps, w.options.mergeEvery, Math.max(...w.members.map((s) => s.size)))) w.draining = true;
  wakeStageZero(w);
}

/** The attempt is abandoned and the microbatch waits to be issued again; `culprit` (≥ 0) is charged a dropped unit. */
export function requeue(w: World, mb: SimMicrobatch, culprit: number, cause: 'deadline' | 'churn' | 'noPeer' | 'moved'): void {
  if (mb.status !== 'issued') return;
  for (const i of mb.path) {
    const m = w.miners[i];
    if (m.held.delete(mb.id)) tryStart(w, m);
  }
  w.issued.delete(mb.id);
  w.issuedTo.set(mb.path[0], (w.issuedTo.get(mb.path[0]) ?? 1) - 1);
  mb.status = 'pending';
  w.pending.push(mb.id);
  w.counters.reissued++;
  if (cause === 'deadline') w.counters.byDeadline++;
  if (cause === 'churn') w.counters.byChurn++;
  if (culprit >= 0) {
    const c = w.miners[culprit];
    w.counters.droppedUnits++;
    w.ledger.log(w.now, c.id, 'dropped', mb.path.indexOf(culprit));
  }
  wakeStageZero(w);
}

/** Whether miner `i` still owes a hop of this microbatch (on its path, its backward not done). */
export function owes(mb: SimMicrobatch, i: number): boolean {
  const s = mb.path.indexOf(i);
  return s >= 0 && s < mb.backwardFrom;
}

/** Whether miner m owes a hop of this microbatch or left with its report unsent: either way the orchestrator never hears of that hop. */
export function unaccounted(w: World, mb: SimMicrobatch, m: SimMiner): boolean {
  const s = mb.path.indexOf(m.index);
  return s >= 0 && (s < mb.backwardFrom || reportLost(w, mb, s));
}
