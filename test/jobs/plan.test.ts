// planJob: a job's needs, its layouts on live miners, the chosen one and the
// one-miner default, and the words that explain them; the MLP's cost model.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Value } from '@sinclair/typebox/value';
import { mlpActivationValuesPerExample, mlpCost, mlpFlopsPerExample, mlpParamCount } from '../../src/jobs/mlp-cost.ts';
import { DEFAULT_PRICING, JOB_SLOTS, JobPlan, formatJobPlan, planJob, type PoolMiner } from '../../src/jobs/plan.ts';
import { resolveJobSpec, validateJobSpec, type ResolvedJob } from '../../src/jobs/spec.ts';
import { gptConfig } from '../../src/model/config.ts';
import { partCount } from '../../src/model/parts.ts';
import { stageCost, totalFlops } from '../../src/planner/cost.ts';

const MB = 1e6;
const GB = 1e9;
const tinyConfig = gptConfig('gpt-tiny');

function job(fields: Record<string, unknown>): ResolvedJob {
  return resolveJobSpec(validateJobSpec({ name: 'j', model: 'gpt-tiny', data: 'moby-dick', training: { steps: 20_000 }, ...fields }));
}
const spam = (fields: Record<string, unknown> = {}): ResolvedJob =>
  job({ name: 'spam', model: { type: 'mlp', inputs: 4096, hidden: [64], classes: 2 }, data: 'spam-assassin', training: { steps: 2000 }, ...fields });
const miner = (id: string, gflops: number, memoryBytes: number, bandwidthMbps = 100): PoolMiner => ({ id, gflops, memoryBytes, bandwidthMbps });
const many = (n: number, gflops: number, memoryBytes: number, bandwidthMbps = 100): PoolMiner[] =>
  Array.from({ length: n }, (_, i) => miner(`m${String(i).padStart(2, '0')}`, gflops + i, memoryBytes, bandwidthMbps));
const ids = (p: JobPlan): string[] => p.chosen!.assignment.flatMap((s) => s.miners);

test('the MLP cost model, by hand (4096 → 64 → 2)', () => {
  const c = { inputs: 4096, hidden: [64], classes: 2 };
  assert.equal(mlpParamCount(c), 4096 * 64 + 64 + 64 * 2 + 2); // 262,338
  // forward: 2·(4096·64 + 64·2) + biases 66 + ReLU 64 + cross-entropy 5·2 + 1
  // backward: 4·(4096·64 + 64·2) + biases 66 + ReLU 64 + cross-entropy 2·2
  assert.deepEqual(mlpFlopsPerExample(c), { forward: 2 * 262_272 + 66 + 64 + 11, backward: 4 * 262_272 + 66 + 64 + 4 });
  // acts and dacts (4096 + 64 + 2 each), relu 64, probs 2, loss 1, target 1
  assert.equal(mlpActivationValuesPerExample(c), 2 * 4162 + 64 + 2 + 2);
  const cost = mlpCost(c, 12);
  const P = 262_338;
  assert.deepEqual(cost.memoryBytes, { weights: 4 * P, gradients: 4 * P, optimizer: 16 * P, activations: 4 * 12 * 8392, total: 24 * P + 4 * 12 * 8392 });
  assert.throws(() => mlpCost({ inputs: 0, hidden: [], classes: 2 }, 1), RangeError);
});

test('memory figures agree with src/planner/cost.ts for the GPT', () => {
  const j = job({ training: { steps: 1000, batchSize: 8 } });
  const plan = planJob(j, many(8, 50, 40 * MB));
  const whole = stageCost(tinyConfig, { from: 0, to: partCount(tinyConfig) }, 8, JOB_SLOTS);
  assert.deepEqual(plan.wholeModel, whole.memoryBytes);
  assert.equal(plan.minMinerMemoryBytes, whole.memoryBytes.total);
  assert.equal(plan.params, 867_072);
  assert.deepEqual(plan.flopsPerItem, { forward: 1_742_249, backward: 3_467_296 });
  assert.equal(plan.trainingFlops, 1000 * 8 * 64 * 5_209_545);
  for (const cut of plan.cuts) {
    assert.equal(cut.needs.length, cut.stages);
    for (const n of cut.needs) assert.deepEqual(n.memory, stageCost(tinyConfig, n.range!, 8, JOB_SLOTS).memoryBytes);
    assert.equal(cut.largestStageBytes, Math.max(...cut.needs.map((n) => n.memory.total)));
  }
  for (const s of plan.chosen!.assignment) assert.equal(s.memoryBytes, stageCost(tinyConfig, s.range!, 8, JOB_SLOTS).memoryBytes.total);
  assert.equal(plan.minPieceMemoryBytes, Math.max(...Array.from({ length: 6 }, (_, p) => stageCost(tinyConfig, { from: p, to: p + 1 }, 8, JOB_SLOTS).memoryBytes.total)));
});

test('gpt-tiny on one big miner: one miner, no upgrade needed', () => {
  const plan = planJob(job({}), [miner('big', 100, 16 * GB)]);
  assert.ok(Value.Check(JobPlan, plan));
  assert.equal(plan.fits, true);
  assert.equal(plan.reason, null);
  assert.equal(plan.meetsDeadline, true);
  assert.deepEqual(ids(plan), ['big']);
  assert.deepEqual(plan.default!.assignment[0].miners, ['big']);
  assert.equal(plan.chosen!.stages, 1);
  // compute-bound: 100 GFLOP/s over 5,209,545 FLOPs per token
  assert.ok(Math.abs(plan.chosen!.itemsPerS - 100e9 / 5_209_545) < 1e-6);
  assert.ok(Math.abs(plan.chosen!.wallTimeMs! - (plan.totalItems / plan.chosen!.itemsPerS) * 1000) < 1e-6);
  // cost in NIM = training FLOPs × price
  assert.ok(Math.abs(plan.chosen!.costNim - (plan.trainingFlops / 1e15) * DEFAULT_PRICING.nimPerPetaflop) < 1e-12);
  assert.match(plan.explanation.join('\n'), /867,072 parameters/);
  assert.match(plan.explanation.join('\n'), /No upgrade needed/);
});

test('gpt-tiny on many small miners: no single miner holds it, so a pipeline', () => {
  const miners = many(12, 30, 80 * MB);
  const plan = planJob(job({ limits: { deadline: '2h' } }), miners);
  assert.equal(plan.fits, true);
  assert.equal(plan.default, null);
  assert.equal(plan.pool.holdWhole, 0);
  const c = plan.chosen!;
  assert.ok(c.stages >= 2, `chose ${c.stages} stages`);
  assert.equal(ids(plan).length, c.stages * c.replicas);
  assert.equal(new Set(ids(plan)).size, ids(plan).length);
  for (const s of c.assignment) {
    assert.equal(s.miners.length, c.replicas);
    assert.ok(s.memoryBytes <= 80 * MB);
  }
  const text = plan.explanation.join('\n');
  assert.match(text, /No single miner holds it: it needs 118 MB, the largest of 12 live miners has 80 MB/);
  assert.match(text, /no single miner holds the model/);
  // the candidates: 1 stage does not fit, every fitting one respects memory
  const one = plan.candidates.find((l) => l.stages === 1 && l.replicas === 1)!;
  assert.equal(one.fitsMemory, false);
  assert.match(one.reason!, /needs 118 MB; the largest miner has 80 MB/);
  assert.ok(Value.Check(JobPlan, JSON.parse(JSON.stringify(plan))));
});

test('the MLP goes to the smallest miner that fits, not the fastest', () => {
  const miners = [miner('huge', 500, 64 * GB, 1000), miner('tiny', 50, 1 * MB), miner('small', 5, 8 * MB), miner('mid', 80, 2 * GB)];
  const plan = planJob(spam(), miners);
  assert.equal(plan.unit, 'example');
  assert.equal(plan.params, 262_338);
  assert.equal(plan.slots, null);
  assert.deepEqual(plan.cuts.map((c) => c.stages), [1]);
  assert.deepEqual(ids(plan), ['small']);
  assert.deepEqual(plan.default!.assignment[0].miners, ['small']);
  assert.equal(plan.candidates.every((c) => c.stages === 1), true);
  assert.match(plan.explanation.join('\n'), /3 of 4 live miners hold it alone; it starts on the smallest, small: 8 MB, 5 GFLOP\/s/);
});

test('a deadline one miner cannot meet forces a group; the group uses the smallest miners that meet it', () => {
  // 1 GB miners at 20-31 GFLOP/s, 4 GB miners at 25-28: the 4h deadline needs 55.6 GFLOP/s in all
  const miners = [...many(12, 20, 1 * GB), ...[25, 26, 27, 28].map((g, i) => miner(`big-${i}`, g, 4 * GB))];
  const plan = planJob(job({ training: { steps: 200_000 }, limits: { deadline: '4h' } }), miners);
  const d = plan.default!;
  assert.deepEqual(d.assignment[0].miners, ['m00']);
  assert.equal(d.meetsDeadline, false);
  const c = plan.chosen!;
  assert.equal(c.meetsDeadline, true);
  assert.ok(c.miners >= 2);
  assert.ok(c.wallTimeMs! <= 4 * 3_600_000);
  // the smallest miners that are enough: two 1 GB miners, and the slowest such pair (m08 + m09 = 57 GFLOP/s)
  assert.deepEqual([c.stages, c.replicas], [1, 2]);
  assert.deepEqual(ids(plan).sort(), ['m08', 'm09']);
  // the fewest miners that meet it: one fewer would not
  const fewer = plan.candidates.filter((l) => l.fitsMemory && l.miners < c.miners);
  assert.ok(fewer.every((l) => !l.meetsDeadline));
  assert.match(plan.explanation.join('\n'), /Upgrade: 1 stage × 2 replicas meet the 4h deadline/);
  assert.match(plan.explanation.join('\n'), /one miner would take/);
});

test('an impossible deadline: the fastest layout that fits, flagged', () => {
  const plan = planJob(job({ training: { steps: 200_000 }, limits: { deadline: '1m' } }), many(4, 20, 1 * GB));
  assert.equal(plan.fits, true);
  assert.equal(plan.meetsDeadline, false);
  const fastest = Math.max(...plan.candidates.filter((l) => l.fitsMemory).map((l) => l.itemsPerS));
  assert.ok(plan.chosen!.itemsPerS >= fastest * (1 - 1e-9));
  assert.match(plan.explanation.join('\n'), /Nothing meets the 1m deadline/);
});

test('slow uplinks make a pipeline network-bound', () => {
  // C = 128 values per token each way at 2 bytes: a 1 Mbit/s uplink moves ~488 tokens/s
  const plan = planJob(job({}), many(4, 100, 80 * MB, 1));
  const c = plan.chosen!;
  assert.equal(c.limitedBy, 'network');
  assert.ok(c.itemsPerS < 1000 * c.replicas, `${c.itemsPerS}`);
  // no bandwidth at all: nothing trains
  const none = planJob(job({}), many(4, 100, 80 * MB, 0));
  assert.equal(none.fits, false);
  assert.match(none.reason!, /no upload bandwidth/);
  // and one miner holding everything needs none
  assert.equal(planJob(job({}), [miner('alone', 100, 1 * GB, 0)]).chosen!.limitedBy, 'compute');
});

test('nothing fits: the reason, with numbers', () => {
  const plan = planJob(job({ model: 'gpt-small' }), [miner('a', 50, 10 * MB), miner('b', 50, 10 * MB), miner('c', 50, 5 * MB)]);
  assert.equal(plan.fits, false);
  assert.equal(plan.chosen, null);
  assert.equal(plan.default, null);
  assert.equal(plan.meetsDeadline, false);
  assert.match(plan.reason!, /alone needs [\d.]+ MB; the largest of 3 miners has 10 MB$/);
  assert.ok(plan.candidates.length > 0 && plan.candidates.every((l) => !l.fitsMemory && l.reason));
  assert.match(plan.explanation.join('\n'), /Cannot run on these miners: part \d \((embedding|block \d|head)\) alone needs [\d.]+ MB; the largest of 3 miners has 10 MB/);
  const one = planJob(job({}), [miner('a', 50, 80 * MB)]);
  assert.equal(one.reason, 'one miner needs 118 MB (the largest of 1 miner has 80 MB); cut into 2 stages of at most 64.7 MB it needs 2 miners, 1 available');
  const mlp = planJob(spam(), [miner('a', 50, 1 * MB)]);
  assert.equal(mlp.fits, false);
  assert.match(mlp.explanation.join('\n'), /it needs 6\.7\d? MB on one miner; the largest of 1 miner has 1 MB/);
  assert.ok(Value.Check(JobPlan, plan) && Value.Check(JobPlan, mlp));
});

test('no miners: the model needs only', () => {
  const plan = planJob(job({ model: 'gpt-small' }), []);
  assert.equal(plan.fits, false);
  assert.deepEqual(plan.candidates, []);
  assert.equal(plan.reason, 'no live miners');
  assert.equal(plan.cuts.length, partCount(gptConfig('gpt-small')));
  assert.match(plan.explanation.join('\n'), /No live miners to plan against: one miner needs 721 MB to hold it alone, or 134 MB per miner cut into 8 stages/);
  assert.ok(Value.Check(JobPlan, plan));
});

test('pricing and budget', () => {
  const j = job({ budget: '0.01' });
  const plan = planJob(j, [miner('big', 100, 16 * GB)], { nimPerPetaflop: 2 });
  const expected = (plan.trainingFlops / 1e15) * 2;
  assert.ok(Math.abs(plan.chosen!.costNim - expected) < 1e-12);
  assert.equal(plan.budgetNim, 0.01);
  assert.equal(plan.withinBudget, false);
  assert.match(plan.explanation.join('\n'), /Over budget/);
  // merges add work only with replicas, and little
  const group = plan.candidates.find((l) => l.replicas === 2);
  assert.equal(group, undefined); // one miner: no 2-replica layout
  assert.ok(plan.mergeFlops / plan.trainingFlops < 1e-4);
  assert.throws(() => planJob(j, [], { nimPerPetaflop: 0 }), RangeError);
});

test('miners that cannot work are ignored; figures per stage add up', () => {
  const miners = [miner('zero', 0, 16 * GB), miner('dup', 50, 16 * GB), miner('dup', 60, 16 * GB), miner('ok', 40, 16 * GB)];
  const plan = planJob(job({}), miners);
  assert.equal(plan.pool.miners, 4);
  assert.equal(plan.pool.usable, 2);
  assert.ok(!ids(plan).includes('zero'));
  for (const c of plan.candidates.filter((l) => l.fitsMemory)) assert.ok(c.wallTimeMs! > 0 && c.itemsPerS > 0);
  assert.equal(totalFlops(plan.flopsPerItem), 5_209_545);
});

test('formatJobPlan: the explanation, the layouts and the chosen miners', () => {
  const plan = planJob(job({ limits: { deadline: '2h' } }), many(12, 30, 80 * MB));
  const text = formatJobPlan(plan);
  assert.match(text, /^job j: gpt-tiny/);
  assert.match(text, /S×R +miners +tok\/s/);
  assert.match(text, /← chosen/);
  assert.match(text, /chosen: \d × \d on \d+ miners/);
  for (const line of plan.explanation) assert.ok(text.includes(line));
});
