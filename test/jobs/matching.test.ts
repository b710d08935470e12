// matchJobs: several jobs share the pool. Small jobs take the smallest miners
// that fit, large ones a group; jobs wait when nothing fits and start when
// capacity frees; priority follows the price offered, aged so that no job
// starves; running jobs keep their miners.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AGING_MS, effectivePriority, matchJobs, placeOnOneMiner, type MatchDecision, type MatchResult, type QueuedJob } from '../../src/jobs/matching.ts';
import { DEFAULT_PRICING, type PoolMiner } from '../../src/jobs/plan.ts';
import { resolveJobSpec, validateJobSpec, type ResolvedJob } from '../../src/jobs/spec.ts';

const MB = 1e6;
const GB = 1e9;
const NOW = 10 * 86_400_000;
const H = 3_600_000;

const gpt = (model: string, steps: number, deadline?: string): ResolvedJob =>
  resolveJobSpec(validateJobSpec({ name: model, model, data: 'moby-dick', training: { steps }, ...(deadline ? { limits: { deadline } } : {}) }));
const spam = (): ResolvedJob =>
  resolveJobSpec(validateJobSpec({ name: 'spam', model: { type: 'mlp', inputs: 4096, hidden: [64], classes: 2 }, data: 'spam-assassin', training: { steps: 2000 } }));
const miner = (id: string, gflops: number, memoryBytes: number, bandwidthMbps = 100): PoolMiner => ({ id, gflops, memoryBytes, bandwidthMbps });
const queued = (id: string, job: ResolvedJob, offer: number, queuedAt: number, miners?: string[]): QueuedJob => ({ id, job, offerNimPerPetaflop: offer, queuedAt, miners });
function decision(r: MatchResult, id: string): MatchDecision {
  const d = r.decisions.find((x) => x.id === id);
  assert.ok(d, `no decision for ${id}`);
  return d;
}
function started(r: MatchResult, id: string): string[] {
  const d = decision(r, id);
  assert.equal(d.action, 'start', `${id}: ${d.action === 'wait' ? d.reason : d.action}`);
  return d.action === 'start' ? d.miners : [];
}
function waits(r: MatchResult, id: string): string {
  const d = decision(r, id);
  assert.equal(d.action, 'wait', `${id} ${d.action}`);
  return d.action === 'wait' ? d.reason : '';
}

test('a small job takes the smallest miner that fits, a large one with a deadline a group', () => {
  const miners = [miner('gpu', 400, 64 * GB, 1000), miner('pi', 5, 10 * MB), miner('laptop', 50, 512 * MB), ...[0, 1, 2, 3].map((i) => miner(`ws-${i}`, 100, 2 * GB, 1000))];
  // gpt-small, 200,000 steps: 6.4 h on the gpu alone; the 4 h deadline needs a group
  const jobs = [queued('big', gpt('gpt-small', 200_000, '4h'), 1, NOW - 2000), queued('spam', spam(), 1, NOW - 1000)];
  const r = matchJobs(jobs, miners, NOW);
  assert.deepEqual(started(r, 'spam'), ['pi']);
  const big = decision(r, 'big');
  assert.equal(big.action, 'start');
  if (big.action === 'start') {
    assert.ok(big.miners.length >= 2, big.miners.join(','));
    assert.equal(big.layout.meetsDeadline, true);
    assert.equal(big.layout.stages * big.layout.replicas, big.miners.length);
    assert.equal(big.plan.default?.meetsDeadline, false);
  }
  // every miner is used once at most, and the rest are idle
  const used = [...started(r, 'big'), ...started(r, 'spam')];
  assert.equal(new Set(used).size, used.length);
  assert.deepEqual([...r.idle, ...used].sort(), miners.map((m) => m.id).sort());
});

test('a job waits when nothing fits and starts when capacity frees', () => {
  const miners = [miner('b0', 50, 2 * GB), miner('b1', 50, 2 * GB), miner('pi', 5, 10 * MB)];
  const running = queued('a', gpt('gpt-small', 1000), 1, NOW - 5 * H, ['b0', 'b1']);
  const waiting = queued('b', gpt('gpt-tiny', 1000), 1, NOW - H);
  let r = matchJobs([running, waiting], miners, NOW);
  assert.deepEqual(decision(r, 'a'), { id: 'a', action: 'keep', miners: ['b0', 'b1'], missing: [] });
  assert.match(waits(r, 'b'), /does not fit the 1 free miner; .* waits for miners held by a/);
  assert.deepEqual(r.idle, ['pi']);
  // a ends
  r = matchJobs([waiting], miners, NOW + H);
  assert.equal(started(r, 'b').length, 1);
  // and a job that fits nothing even in the whole pool says why, with numbers
  r = matchJobs([queued('c', gpt('gpt-small', 1000), 1, NOW)], [miner('pi', 5, 10 * MB)], NOW);
  assert.match(waits(r, 'c'), /fits nothing in the pool: part \d \(.*\) alone needs [\d.]+ MB; the largest of 1 miner has 10 MB/);
});

test('priority follows the price offered', () => {
  const miners = [miner('solo', 50, 2 * GB)];
  const jobs = [queued('cheap', gpt('gpt-tiny', 1000), 1, NOW - 1000), queued('rich', gpt('gpt-tiny', 1000), 2, NOW - 1000)];
  const r = matchJobs(jobs, miners, NOW);
  assert.deepEqual(started(r, 'rich'), ['solo']);
  assert.match(waits(r, 'cheap'), /waits for miners held by rich/);
  // the start carries the plan at the price offered
  const d = decision(r, 'rich');
  if (d.action === 'start') assert.ok(Math.abs(d.layout.costNim - (d.plan.trainingFlops / 1e15) * 2) < 1e-12);
  // an offer below the network's price waits
  const low = matchJobs([queued('low', gpt('gpt-tiny', 1000), 0.5, NOW)], miners, NOW);
  assert.match(waits(low, 'low'), /offers 0.5 NIM per PFLOP, below the network's 1/);
});

test('no starvation: a cheap job that has waited long enough goes before a newer richer one', () => {
  const miners = [miner('solo', 50, 2 * GB)];
  const cheap = queued('cheap', gpt('gpt-tiny', 1000), 1, NOW - 2 * H);
  const rich = queued('rich', gpt('gpt-tiny', 1000), 3, NOW);
  // 1 + 2 h / 30 min = 5 > 3
  assert.equal(effectivePriority(1, 2 * H), 5);
  const r = matchJobs([rich, cheap], miners, NOW);
  assert.deepEqual(started(r, 'cheap'), ['solo']);
  waits(r, 'rich');
  // after waiting only an hour it would not: 1 + 1 h / 30 min = 3 < 3.01
  const earlier = matchJobs([queued('rich', rich.job, 3.01, NOW - H), queued('cheap', cheap.job, 1, NOW - 2 * H)], miners, NOW - H);
  assert.deepEqual(started(earlier, 'rich'), ['solo']);
  // the bound: priorities of waiting jobs keep their gap, so once ahead a job stays ahead of any later job
  for (const wait of [0, H, 10 * H]) {
    assert.ok(Math.abs(effectivePriority(3, wait) - effectivePriority(1, wait + 2 * AGING_MS) - 0) < 1e-12);
  }
  // a job offering p passes any newcomer offering q after AGING_MS · (q − p) / price
  const q = 4;
  const W = (AGING_MS * (q - 1)) / DEFAULT_PRICING.nimPerPetaflop;
  assert.ok(effectivePriority(1, W + 1) > q);
});

test('running jobs keep their miners: no preemption, even for a much richer job', () => {
  const miners = [miner('solo', 50, 2 * GB)];
  const r = matchJobs([queued('old', gpt('gpt-tiny', 1000), 1, NOW - H, ['solo', 'gone']), queued('rich', gpt('gpt-tiny', 1000), 100, NOW)], miners, NOW);
  assert.deepEqual(decision(r, 'old'), { id: 'old', action: 'keep', miners: ['solo'], missing: ['gone'] });
  assert.match(waits(r, 'rich'), /held by old/);
});

test('the head of the queue reserves the free miners of its plan; jobs behind it cannot take them', () => {
  // gpt-tiny needs 118 MB alone, 64.7 MB per stage in two: 80 MB miners need a pipeline
  const miners = [miner('f0', 50, 80 * MB), miner('h0', 50, 80 * MB), miner('h1', 50, 80 * MB), miner('p0', 50, 1 * MB)];
  const running = queued('run', spam(), 1, NOW - 5 * H, ['h0', 'h1']);
  const head = queued('head', gpt('gpt-tiny', 1000), 2, NOW - H);
  const behind = queued('behind', spam(), 1, NOW - H);
  let r = matchJobs([running, head, behind], miners, NOW);
  assert.match(waits(r, 'head'), /does not fit the 2 free miners; its plan on the whole pool \(2 × 1 on 2 miners\) waits for miners held by run; 1 free miner reserved for it/);
  const d = decision(r, 'head');
  assert.deepEqual(d.action === 'wait' ? d.reserved : null, ['f0']);
  assert.deepEqual(r.reserved, ['f0']);
  // the MLP would fit f0 but not p0 (1 MB): it waits its turn
  assert.match(waits(r, 'behind'), /does not fit the 1 free miner \(1 more are reserved for head, ahead of it\)/);
  assert.deepEqual(r.idle, ['p0']);
  // run ends: the head starts on its pipeline
  r = matchJobs([head, behind], miners, NOW + H);
  const miners2 = started(r, 'head');
  assert.ok(miners2.includes('f0') && miners2.length >= 2);
});

test('inconsistent input is the caller\'s bug', () => {
  const m = [miner('a', 50, 2 * GB)];
  assert.throws(() => matchJobs([queued('x', spam(), 1, NOW), queued('x', spam(), 1, NOW)], m, NOW), /listed twice/);
  assert.throws(() => matchJobs([queued('x', spam(), 1, NOW, ['a']), queued('y', spam(), 1, NOW, ['a'])], m, NOW), /held by both x and y/);
  assert.deepEqual(matchJobs([], m, NOW), { decisions: [], reserved: [], idle: ['a'] });
});

// ---- the default assignment of several waiting jobs (placeOnOneMiner) ----------------

const one = (id: string, gb: number, gflops = 10): PoolMiner => ({ id, gflops, memoryBytes: gb * 1e9, bandwidthMbps: 100 });

test('waiting jobs are placed in order of offer, each on the smallest idle miner that holds it; a job offering below the price waits', () => {
  const idle = [one('big', 16), one('small', 1), one('mid', 4)];
  const jobs = [
    { id: 'cheap', offer: null, queuedAt: 0, needBytes: 0.5e9 },
    { id: 'rich', offer: 3, queuedAt: 10, needBytes: 0.5e9 },
    { id: 'large', offer: 2, queuedAt: 5, needBytes: 8e9 },
    { id: 'stingy', offer: 0.5, queuedAt: 0, needBytes: 1 },
  ];
  const r = placeOnOneMiner(jobs, idle, idle, 20);
  assert.deepEqual(r.placed, [
    { id: 'rich', miner: 'small' },
    { id: 'large', miner: 'big' },
    { id: 'cheap', miner: 'mid' },
  ]);
  assert.deepEqual(r.waiting, [{ id: 'stingy', reason: "offers 0.5 NIM per PFLOP, below the network's 1" }]);
});

test('a job that waits long enough goes ahead of richer newcomers (aging): none starves', () => {
  const idle = [one('only', 4)];
  const old = { id: 'old', offer: null, queuedAt: 0, needBytes: 1e9 };
  const rich = { id: 'rich', offer: 2, queuedAt: 0, needBytes: 1e9 };
  // just queued together: the richer offer goes first
  assert.equal(placeOnOneMiner([old, { ...rich, queuedAt: 0 }], idle, idle, 0).placed[0].id, 'rich');
  // the old job has waited 40 min (priority 1 + 40/30 > 2): a newcomer offering 2 no longer passes it
  assert.equal(placeOnOneMiner([old, { ...rich, queuedAt: 40 * 60_000 }], idle, idle, 40 * 60_000).placed[0].id, 'old');
  assert.equal(effectivePriority(1, AGING_MS), 2);
});

test('a job no idle miner holds waits, saying whether any live miner could', () => {
  const alive = [one('a', 1), one('b', 2)];
  const r = placeOnOneMiner([{ id: 'x', offer: null, queuedAt: 0, needBytes: 1.5e9 }, { id: 'y', offer: null, queuedAt: 1, needBytes: 5e9 }], [alive[0]], alive, 2);
  assert.deepEqual(r.placed, []);
  assert.match(r.waiting[0].reason, /1 live miner can, all busy/);
  assert.match(r.waiting[1].reason, /no live miner does/);
});
