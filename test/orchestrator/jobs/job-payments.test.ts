// What an epoch owes a paying job's miners (JobPayments.allocate, no chain):
// the FLOPs of the forward and backward units credited on the job's runs at
// its price, split by score (a penalised miner takes less, the rest stays
// the developer's), capped by what is left in the escrow (then the job is
// marked spent), nothing for work logged after the job ended or for runs of
// no job; storage is priced per GB-day.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ChainClient, SigningClient } from '../../../src/chain/client.ts';
import { workload } from '../../../src/jobs/plan-workload.ts';
import { resolveJobSpec, type JobSpec } from '../../../src/jobs/spec.ts';
import { JobPayments } from '../../../src/orchestrator/jobs/job-payments.ts';
import { stageSharesOf } from '../../../src/orchestrator/rewards/scoring.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { stateTarget } from '../helpers.ts';
import type { RunOptions } from '../../../src/orchestrator/state/runs.ts';

const A = '0x' + 'a'.repeat(40);
const B = '0x' + 'b'.repeat(40);
const DEV = '0x' + 'd'.repeat(40);
const JOB = 'job-0000000000000001';
const spec: JobSpec = { name: 'paid', model: 'gpt-micro', data: 'moby-dick', training: { steps: 100, batchSize: 4 }, budget: '1' };
const options: RunOptions = { lr: 1e-3, codec: 'f16', aggregator: 'mean', minMiners: 1, outerLr: 1, outerMomentum: 0, requestedStages: null };
// the chain is never touched by allocate
const payments = (state: OrchestratorState): JobPayments => new JobPayments(state, { client: {} as ChainClient, signer: {} as SigningClient, log: () => {} });

async function setup(budgetWei: bigint, price = 1e6): Promise<{ state: OrchestratorState; flopsPerMicrobatch: { forward: number[]; backward: number[] } }> {
  const state = OrchestratorState.open(await stateTarget());
  state.jobs.insert({ id: JOB, owner: DEV, spec, steps: 100, timeoutMs: 1e6, idleTimeoutMs: 1e6, checkpointEvery: 50, retentionMs: 1e6 }, 1);
  state.runs.insert({ id: 'run-1', owner: DEV, model: 'gpt-micro', data: 'moby-dick', steps: 100, batchSize: 4, mergeEvery: 10, seed: 1, options }, 1);
  state.runs.insertStages('run-1', [{ from: 0, to: 2 }, { from: 2, to: 4 }]);
  state.runs.insert({ id: 'run-other', owner: DEV, model: 'gpt-micro', data: 'moby-dick', steps: 100, batchSize: 4, mergeEvery: 10, seed: 1, options }, 1);
  state.jobs.setRun(JOB, 'run-1');
  state.escrows.insert({ jobId: JOB, escrowId: '0x' + '1'.repeat(64), owner: DEV, amount: budgetWei, price }, 1);
  const job = resolveJobSpec(spec);
  const work = workload(job.model, job.batchSize, 1);
  const items = 4 * 16;
  const ranges = [{ from: 0, to: 2 }, { from: 2, to: 4 }];
  return {
    state,
    flopsPerMicrobatch: { forward: ranges.map((r) => work.cost(r).flopsPerToken.forward * items), backward: ranges.map((r) => work.cost(r).flopsPerToken.backward * items) },
  };
}

function log(state: OrchestratorState, minerId: string, runId: string, kind: 'forward' | 'backward' | 'dropped', stage: number, units = 1): void {
  state.ledger.logWork({ minerId, runId, kind, stage, units }, 2);
}

const shares = { 'run-1': stageSharesOf('gpt-micro', [{ from: 0, to: 2 }, { from: 2, to: 4 }]) };

test("an epoch pays a job's miners for the FLOPs they were credited on its runs, split by score; other runs' work is not the job's", async () => {
  const { state, flopsPerMicrobatch: f } = await setup(10n ** 18n);
  for (let i = 0; i < 3; i++) {
    log(state, A, 'run-1', 'forward', 0);
    log(state, A, 'run-1', 'backward', 0);
    log(state, B, 'run-1', 'forward', 1);
    log(state, B, 'run-1', 'backward', 1);
  }
  log(state, B, 'run-other', 'forward', 0, 50);
  payments(state).allocate(7, state.ledger.workBetween(0, state.ledger.lastWorkId()), shares);
  const [p] = state.escrows.payments({ jobId: JOB });
  const flops = 3 * (f.forward[0] + f.backward[0] + f.forward[1] + f.backward[1]);
  assert.ok(Math.abs(p.flops - flops) / flops < 1e-12, `${p.flops} vs ${flops}`);
  const cost = BigInt(Math.ceil((flops / 1e15) * 1e6 * 1e18));
  assert.ok(BigInt(p.total) <= cost && cost - BigInt(p.total) < 10n, `paid ${p.total} of ${cost}`);
  const split = state.escrows.shares(7, JOB);
  assert.deepEqual(split.map((s) => s.miner), [A, B]);
  // scores are the stage shares of the units: A holds the embedding stage of gpt-micro
  const ratio = Number(BigInt(split[0].amount)) / Number(BigInt(split[1].amount));
  assert.ok(Math.abs(ratio - shares['run-1'][0] / shares['run-1'][1]) < 1e-6);
  assert.equal(state.escrows.get(JOB)!.committed, p.total);
  assert.equal(state.escrows.get(JOB)!.spent, 0);
});

test('a miner with dropped work takes less; what its penalty takes stays in the escrow', async () => {
  const { state } = await setup(10n ** 18n);
  for (let i = 0; i < 4; i++) {
    log(state, A, 'run-1', 'forward', 0);
    log(state, B, 'run-1', 'forward', 0);
  }
  log(state, B, 'run-1', 'dropped', 0);
  payments(state).allocate(1, state.ledger.workBetween(0, state.ledger.lastWorkId()), shares);
  const split = state.escrows.shares(1, JOB);
  const a = BigInt(split.find((s) => s.miner === A)!.amount);
  const b = BigInt(split.find((s) => s.miner === B)?.amount ?? '0');
  // A: 4 units, B: 4 − 3 = 1: the pot (8 units' FLOPs) is split 4:1
  assert.ok(b < a);
  assert.ok(Math.abs(Number(a) / Number(b) - 4) < 1e-6);
});

test('the escrow caps the payment: what is left is paid and the job is marked spent; nothing more after', async () => {
  const { state } = await setup(1000n);
  log(state, A, 'run-1', 'forward', 0, 10);
  const pay = payments(state);
  pay.allocate(1, state.ledger.workBetween(0, state.ledger.lastWorkId()), shares);
  const e = state.escrows.get(JOB)!;
  assert.equal(e.committed, '1000');
  assert.equal(e.spent, 1);
  const from = state.ledger.lastWorkId();
  log(state, A, 'run-1', 'forward', 0, 10);
  pay.allocate(2, state.ledger.workBetween(from, state.ledger.lastWorkId()), shares);
  assert.equal(state.escrows.get(JOB)!.committed, '1000', 'never more than the budget');
  assert.deepEqual(state.escrows.payments({ jobId: JOB, status: 'pending' }).map((p) => [p.epoch, p.total]), [[1, '1000'], [2, '0']]);
});

test('work logged after the job ended is not paid from its escrow', async () => {
  const { state } = await setup(10n ** 18n);
  log(state, A, 'run-1', 'forward', 0);
  state.escrows.end(JOB, state.ledger.lastWorkId());
  log(state, A, 'run-1', 'forward', 0, 100);
  payments(state).allocate(1, state.ledger.workBetween(0, state.ledger.lastWorkId()), shares);
  const [p] = state.escrows.payments({ jobId: JOB });
  const one = BigInt(p.total);
  assert.ok(one > 0n);
  const { state: s2 } = await setup(10n ** 18n);
  log(s2, A, 'run-1', 'forward', 0);
  payments(s2).allocate(1, s2.ledger.workBetween(0, s2.ledger.lastWorkId()), shares);
  assert.equal(s2.escrows.payments({ jobId: JOB })[0].total, p.total, 'only the unit before the end');
});

test('a run that trains no job, or a job without an escrow, pays nothing from escrows', async () => {
  const { state } = await setup(10n ** 18n);
  log(state, A, 'run-other', 'forward', 0, 5);
  payments(state).allocate(1, state.ledger.workBetween(0, state.ledger.lastWorkId()), shares);
  assert.deepEqual(state.escrows.payments(), []);
});

test('keeping checkpoints is priced per GB-day, rounded up to the wei', async () => {
  const state = OrchestratorState.open(await stateTarget());
  const pay = payments(state);
  assert.equal(pay.storagePrice(1e9, 1), 10n ** 17n, '0.1 NIM per GB-day');
  assert.equal(pay.storagePrice(3.5e6, 30), 10500000000000000n);
  assert.equal(pay.storagePrice(0, 30), 0n);
});
