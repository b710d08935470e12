// Payments from escrows against a real anvil node, on a clock the test moves
// by hand: a payment the chain keeps refusing (the orchestrator's role
// revoked) is retried with exponential backoff, 1 s doubling to 5 min, not
// at every 500 ms pass; its attempts, next try and error are on its row and
// in the job's events; once the chain takes it again it is paid once. An
// escrow its owner closed behind the orchestrator's back (a lock that had
// lapsed) leaves its pending payment unpaid for good, said so, not retried.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { parseEther, type Hex } from 'viem';
import { jobEscrowAbi, nimAbi } from '../../../src/chain/abis.ts';
import { ORCHESTRATOR_ROLE } from '../../../src/chain/deploy.ts';
import { closeEscrow, escrowAddress, jobEpochPaid, jobIdOf, openEscrow, readEscrow } from '../../../src/chain/escrow.ts';
import { sendContractTx } from '../../../src/chain/tx.ts';
import { JobPayments } from '../../../src/orchestrator/jobs/job-payments.ts';
import { RETRY_MAX_MS, retryDelayMs } from '../../../src/orchestrator/rewards/backoff.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { advanceTime, startTestChain, type TestChain } from '../../chain/helpers.ts';
import { stateTarget } from '../helpers.ts';

let t: TestChain;
before(async () => {
  t = await startTestChain({ escrowRefundDelaySeconds: 3600 });
});
after(async () => {
  await t?.stop();
});

const DEV = 1;
const MINER = 2;

async function world(name: string): Promise<{ state: OrchestratorState; payments: JobPayments; now: { t: number }; escrowId: Hex; lines: string[] }> {
  const state = OrchestratorState.open(await stateTarget());
  const now = { t: 1_000_000 };
  const lines: string[] = [];
  const payments = new JobPayments(state, { client: t.client, signer: t.operator, log: (l) => lines.push(l) }, () => now.t);
  const dev = t.signer(DEV);
  const escrowId = jobIdOf(name);
  await sendContractTx(t.client, t.operator, { address: t.client.deployment.nim, abi: nimAbi, functionName: 'mint', args: [dev.account.address, parseEther('1')] });
  await openEscrow(t.client, dev, escrowId, parseEther('1'));
  const jobId = `job-${name}`;
  state.jobs.insert({ id: jobId, owner: dev.account.address, spec: { name, model: 'gpt-micro', data: 'moby-dick', training: { steps: 10 }, budget: '1' }, steps: 10, timeoutMs: 3_600_000, idleTimeoutMs: 600_000, checkpointEvery: 10, retentionMs: 1e6 }, now.t);
  state.escrows.insert({ jobId, escrowId, owner: dev.account.address, amount: parseEther('1'), price: 1, lockedUntil: Number.MAX_SAFE_INTEGER }, now.t);
  state.tx(() => state.escrows.addPayment(1, jobId, 1e15, [{ miner: t.signer(MINER).account.address, score: 1, amount: parseEther('0.25') }], false));
  return { state, payments, now, escrowId, lines };
}

const role = (fn: 'grantRole' | 'revokeRole'): Promise<unknown> =>
  sendContractTx(t.client, t.operator, { address: escrowAddress(t.client), abi: jobEscrowAbi, functionName: fn, args: [ORCHESTRATOR_ROLE, t.operator.account.address] });

test('the wait between tries doubles from 1 s and stops at 5 min', () => {
  assert.deepEqual([1, 2, 3, 4, 5].map(retryDelayMs), [1000, 2000, 4000, 8000, 16_000]);
  assert.equal(retryDelayMs(10), RETRY_MAX_MS);
  assert.equal(RETRY_MAX_MS, 300_000);
  assert.equal(retryDelayMs(1000), RETRY_MAX_MS);
});

test('a payment the chain refuses is retried with a growing wait, reported on its row and in the job, then paid once', { timeout: 120_000 }, async () => {
  const w = await world('backoff');
  await role('revokeRole');
  try {
    // two minutes of 500 ms passes: without backoff that is 240 tries
    for (let i = 0; i < 240; i++) {
      await w.payments.reconcile();
      w.now.t += 500;
    }
  } finally {
    await role('grantRole');
  }
  const [p] = w.state.escrows.payments({ jobId: 'job-backoff' });
  assert.equal(p.status, 'pending');
  const tries = w.lines.filter((l) => /paying epoch 1 failed \(attempt \d+\)/.test(l));
  // tries at 0, 1, 3, 7, 15, 31, 63 s (and 127 s is past the window)
  assert.equal(tries.length, 7, tries.join('\n'));
  assert.equal(p.attempts, 7);
  assert.equal(p.retryAt, 1_000_000 + 63_000 + retryDelayMs(7));
  assert.match(p.error ?? '', /AccessControlUnauthorizedAccount|not allowed|role/i);
  assert.match(tries[6], /retrying in 1\.1m/);
  const events = w.state.jobs.events('job-backoff', 0).filter((e) => /paying its miners/.test(e.message));
  assert.equal(events.length, 1, 'the job is told once while the error stays the same');
  assert.match(events[0].message, /epoch 1 failed \(attempt 1\).*retried with a growing wait/);

  // nothing is tried before its time; then it goes through, once
  await w.payments.reconcile();
  assert.equal(await jobEpochPaid(t.client, w.escrowId, 1n), null);
  w.now.t = p.retryAt!;
  await w.payments.reconcile();
  assert.equal(w.state.escrows.payments({ jobId: 'job-backoff' })[0].status, 'paid');
  assert.ok(await jobEpochPaid(t.client, w.escrowId, 1n));
  assert.equal((await readEscrow(t.client, w.escrowId))?.paid, parseEther('0.25'));
  assert.match(w.state.jobs.events('job-backoff', 0).at(-1)!.message, /were paid 0\.25 NIM for epoch 1 after 8 attempts/);
});

test('an escrow closed by its owner behind the orchestrator (its lock lapsed) leaves the pending payment unpaid for good, and says so', { timeout: 60_000 }, async () => {
  const w = await world('behind');
  await advanceTime(t.client, 3601); // past its refund time, never locked
  await closeEscrow(t.client, t.signer(DEV), w.escrowId);
  await w.payments.reconcile();
  const [p] = w.state.escrows.payments({ jobId: 'job-behind' });
  assert.equal(p.status, 'unpaid');
  assert.match(p.error ?? '', /closed on chain by someone other than this orchestrator.*0\.25 NIM of its miners' work \(epochs 1\) is unpaid/);
  const e = w.state.escrows.get('job-behind')!;
  assert.equal(e.status, 'closed');
  assert.equal(e.refunded, parseEther('1').toString());
  assert.match(w.state.jobs.events('job-behind', 0).at(-1)!.message, /is unpaid/);
  const before = w.lines.length;
  for (let i = 0; i < 20; i++) {
    w.now.t += 60_000;
    await w.payments.reconcile();
  }
  assert.equal(w.lines.filter((l, i) => i >= before && /paying epoch/.test(l)).length, 0, 'never tried again');
});
