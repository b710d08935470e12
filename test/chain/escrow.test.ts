// JobEscrow against a real anvil node: a developer's job budget opened,
// paid to miners per (job, epoch) as stake, closed with a refund; who may do
// what; replays after a crash; the orchestrator's lock (its owner cannot
// close an escrow that pays for work, even past its refund time, until the
// lock lapses); NIM conserved throughout.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { parseEventLogs, parseUnits, type Abi, type Address, type Hex } from 'viem';
import { jobEscrowAbi, nimAbi } from '../../src/chain/abis.ts';
import type { SigningClient } from '../../src/chain/client.ts';
import { DEFAULT_ESCROW_LOCK_SECONDS, DEFAULT_ESCROW_REFUND_DELAY_SECONDS } from '../../src/chain/deploy.ts';
import {
  chainTime,
  closeEscrow,
  escrowAddress,
  escrowLockTimeout,
  escrowTotalHeld,
  jobEarnings,
  jobEpochPaid,
  jobEscrowCallAbi,
  jobIdOf,
  lockEscrow,
  openEscrow,
  payJob,
  readEscrow,
} from '../../src/chain/escrow.ts';
import { rewardsDigest } from '../../src/chain/rewards.ts';
import { readStake } from '../../src/chain/staking.ts';
import { nimBalance } from '../../src/chain/token.ts';
import { ChainTxError, sendContractTx, type SentTx } from '../../src/chain/tx.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { advanceTime, startTestChain, supplyReport, type TestChain } from './helpers.ts';

const NIM = (n: number | string): bigint => parseUnits(String(n), 18);
let t: TestChain;

before(async () => {
  t = await startTestChain();
});
after(async () => {
  await t?.stop();
});

/** Any JobEscrow function by name, straight to the contract (what the library never sends, or a replay of what it did). */
function escrowCall(signer: SigningClient, functionName: string, args: unknown[]): Promise<SentTx> {
  const abi: Abi = jobEscrowCallAbi;
  return sendContractTx(t.client, signer, { address: escrowAddress(t.client), abi, functionName, args });
}

async function mint(to: Address, amount: bigint): Promise<void> {
  await sendContractTx(t.client, t.operator, { address: t.client.deployment.nim, abi: nimAbi, functionName: 'mint', args: [to, amount] });
}

async function rejectsWith(p: Promise<unknown>, errorName: string): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof ChainTxError, String(err));
    assert.equal(err.errorName, errorName, err.message);
    return true;
  });
}

async function nonce(address: Address): Promise<number> {
  return t.client.public.getTransactionCount({ address });
}

/** Every job id this file opens an escrow for (through `newJob`). */
const jobsSeen: Hex[] = [];

function newJob(name: string): Hex {
  const jobId = jobIdOf(name);
  jobsSeen.push(jobId);
  return jobId;
}

/** Everyone the tests move NIM between: the operator and dev accounts 1..9. */
function holders(): Address[] {
  return [t.operator, ...[1, 2, 3, 4, 5, 6, 7, 8, 9].map((i) => t.signer(i))].map((s) => s.account.address);
}

/**
 * Conservation: supply = free + staked + unstaking + undistributed + escrowed;
 * the escrow holds exactly its books' totalHeld, which is Σ remaining over
 * every escrow; the Staking contract holds exactly its totals.
 */
async function checkConservation(step: string): Promise<void> {
  const r = await supplyReport(t.client, holders());
  assert.equal(r.totalSupply, r.free + r.staked + r.unstaking + r.undistributed + r.escrowed, step);
  assert.equal(r.escrowed, r.escrowTotalHeld, step);
  let remaining = 0n;
  for (const jobId of jobsSeen) remaining += (await readEscrow(t.client, jobId))?.remaining ?? 0n;
  assert.equal(r.escrowed, remaining, step);
  assert.equal(r.stakingBalance, r.totalStaked + r.totalUnstaking, step);
  assert.equal(r.staked, r.totalStaked, step);
}

test('open, pay miners as stake, close: the rest goes back to the developer', async () => {
  const dev = t.signer(1);
  const [m1, m2] = [t.signer(2).account.address, t.signer(3).account.address];
  const jobId = newJob('job-happy');
  await mint(dev.account.address, NIM(100));

  const opened = await openEscrow(t.client, dev, jobId, NIM(80));
  assert.equal(opened.alreadyOpen, false);
  assert.equal(opened.txs.length, 2, 'approve + open');
  const [ev] = parseEventLogs({ abi: jobEscrowAbi, logs: opened.txs[1].receipt.logs, eventName: 'Opened' });
  assert.equal(ev.args.owner, dev.account.address);
  assert.equal(ev.args.amount, NIM(80));
  const now = (await t.client.public.getBlock({ blockTag: 'latest' })).timestamp;
  assert.equal(BigInt(opened.escrow.refundAfter), now + BigInt(DEFAULT_ESCROW_REFUND_DELAY_SECONDS));
  assert.deepEqual(
    { ...opened.escrow, refundAfter: 0 },
    { jobId, owner: dev.account.address, amount: NIM(80), paid: 0n, refunded: 0n, remaining: NIM(80), closed: false, refundAfter: 0, lockedUntil: 0 },
  );
  assert.equal(await nimBalance(t.client, dev.account.address), NIM(20));
  // a retry of the same open sends nothing
  assert.deepEqual(await openEscrow(t.client, dev, jobId, NIM(80)), { alreadyOpen: true, escrow: opened.escrow, txs: [] });

  // duplicates merged, zeros dropped, as for epoch rewards
  const paid = await payJob(t.client, t.operator, jobId, 1n, [
    { address: m1, amount: NIM(10) },
    { address: m2, amount: NIM(5) },
    { address: m1, amount: NIM(2) },
    { address: t.signer(4).account.address, amount: 0n },
  ]);
  assert.equal(paid.alreadyPaid, false);
  assert.equal(paid.miners, 2);
  assert.equal(paid.total, NIM(17));
  assert.ok(paid.tx);
  const paidEvents = parseEventLogs({ abi: jobEscrowAbi, logs: paid.tx.receipt.logs, eventName: 'Paid' });
  assert.deepEqual(paidEvents.map((e) => [e.args.miner, e.args.amount, e.args.epoch]), [
    [m1, NIM(12), 1n],
    [m2, NIM(5), 1n],
  ]);
  assert.equal(await jobEpochPaid(t.client, jobId, 1n), paid.digest);
  assert.equal(await jobEpochPaid(t.client, jobId, 2n), null);
  // earnings land as stake, like epoch rewards
  assert.equal((await readStake(t.client, m1)).staked, NIM(12));
  assert.equal((await readStake(t.client, m2)).staked, NIM(5));
  assert.equal(await nimBalance(t.client, m1), 0n);

  await payJob(t.client, t.operator, jobId, 2n, [{ address: m2, amount: NIM(3) }]);
  assert.deepEqual(
    (await jobEarnings(t.client, m2)).map((e) => [e.jobId, e.epoch, e.amount]),
    [
      [jobId, 1n, NIM(5)],
      [jobId, 2n, NIM(3)],
    ],
  );
  const mid = await readEscrow(t.client, jobId);
  assert.equal(mid?.paid, NIM(20));
  assert.equal(mid?.remaining, NIM(60));

  const closed = await closeEscrow(t.client, t.operator, jobId);
  assert.equal(closed.alreadyClosed, false);
  assert.equal(closed.refunded, NIM(60));
  assert.ok(closed.tx);
  const [closedEv] = parseEventLogs({ abi: jobEscrowAbi, logs: closed.tx.receipt.logs, eventName: 'Closed' });
  assert.deepEqual(closedEv.args, { jobId, by: t.operator.account.address, refunded: NIM(60) });
  assert.equal(await nimBalance(t.client, dev.account.address), NIM(80));
  const final = await readEscrow(t.client, jobId);
  assert.equal(final?.closed, true);
  assert.equal(final?.remaining, 0n);
  assert.equal(final?.refunded, NIM(60));
  assert.equal(await escrowTotalHeld(t.client), 0n);
  // a closed job pays nothing more, and cannot be opened again
  await assert.rejects(payJob(t.client, t.operator, jobId, 3n, [{ address: m1, amount: 1n }]), /is closed/);
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 3n, [m1], [1n]]), 'JobClosed');
  await assert.rejects(openEscrow(t.client, dev, jobId, NIM(1)), /already has an escrow/);
  await rejectsWith(escrowCall(dev, 'open', [jobId, NIM(1)]), 'JobExists');
});

test('only the orchestrator pays; a stranger never closes', async () => {
  const dev = t.signer(5);
  const miner = t.signer(6);
  const jobId = newJob('job-roles');
  await mint(dev.account.address, NIM(10));
  await openEscrow(t.client, dev, jobId, NIM(10));
  const pays = [{ address: miner.account.address, amount: NIM(4) }];
  await rejectsWith(payJob(t.client, dev, jobId, 1n, pays), 'AccessControlUnauthorizedAccount'); // the developer
  await rejectsWith(payJob(t.client, miner, jobId, 1n, pays), 'AccessControlUnauthorizedAccount'); // a miner paying itself
  await rejectsWith(closeEscrow(t.client, miner, jobId), 'NotAllowed');
  await advanceTime(t.client, DEFAULT_ESCROW_REFUND_DELAY_SECONDS + 1);
  await rejectsWith(closeEscrow(t.client, miner, jobId), 'NotAllowed'); // not even after the expiry
  const e = await readEscrow(t.client, jobId);
  assert.equal(e?.paid, 0n);
  assert.equal(e?.closed, false);
  assert.equal(await jobEpochPaid(t.client, jobId, 1n), null);
  assert.equal((await readStake(t.client, miner.account.address)).staked, 0n);
  await assert.rejects(payJob(t.client, t.operator, jobIdOf('never opened'), 1n, pays), (err: unknown) => err instanceof NimbleError && err.code === 'not_found');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobIdOf('never opened'), 1n, [miner.account.address], [1n]]), 'UnknownJob');
  // past the expiry the owner takes its NIM back itself
  assert.equal((await closeEscrow(t.client, dev, jobId)).refunded, NIM(10));
});

test('an overpayment is refused, by the library before sending and by the contract', async () => {
  const dev = t.signer(1);
  const miner = t.signer(7).account.address;
  const jobId = newJob('job-overpay');
  await mint(dev.account.address, NIM(10));
  await openEscrow(t.client, dev, jobId, NIM(10));
  await payJob(t.client, t.operator, jobId, 1n, [{ address: miner, amount: NIM(6) }]);
  const n = await nonce(t.operator.account.address);
  await assert.rejects(
    payJob(t.client, t.operator, jobId, 2n, [{ address: miner, amount: NIM(3) }, { address: t.signer(8).account.address, amount: NIM(2) }]),
    /would overpay its escrow: 5 NIM asked, 4 NIM left/,
  );
  assert.equal(await nonce(t.operator.account.address), n, 'nothing sent');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 2n, [miner], [NIM(4) + 1n]]), 'InsufficientEscrow');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 2n, [miner, miner], [NIM(1)]]), 'LengthMismatch');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 2n, [], []]), 'EmptyPayment');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 2n, ['0x0000000000000000000000000000000000000000'], [1n]]), 'ZeroAddress');
  assert.equal(await jobEpochPaid(t.client, jobId, 2n), null);
  // exactly what remains is fine
  await payJob(t.client, t.operator, jobId, 2n, [{ address: miner, amount: NIM(4) }]);
  const e = await readEscrow(t.client, jobId);
  assert.equal(e?.remaining, 0n);
  assert.equal((await readStake(t.client, miner)).staked, NIM(10));
  assert.equal((await closeEscrow(t.client, t.operator, jobId)).refunded, 0n);
});

test('a pay replayed for the same (job, epoch) pays nothing: the library says alreadyPaid, the contract refuses', async () => {
  const dev = t.signer(1);
  const miner = t.signer(9).account.address;
  const jobId = newJob('job-replay');
  await mint(dev.account.address, NIM(50));
  await openEscrow(t.client, dev, jobId, NIM(50));
  const list = [{ address: miner, amount: NIM(7) }];
  const first = await payJob(t.client, t.operator, jobId, 5n, list);
  const n = await nonce(t.operator.account.address);
  const again = await payJob(t.client, t.operator, jobId, 5n, list);
  assert.deepEqual(again, { jobId, epoch: 5n, alreadyPaid: true, miners: 1, total: NIM(7), digest: first.digest });
  assert.equal(await nonce(t.operator.account.address), n, 'nothing sent');
  await rejectsWith(escrowCall(t.operator, 'pay', [jobId, 5n, [miner], [NIM(7)]]), 'EpochAlreadyPaid');
  await assert.rejects(payJob(t.client, t.operator, jobId, 5n, [{ address: miner, amount: NIM(8) }]), /already paid with a different list/);
  assert.equal((await readStake(t.client, miner)).staked, NIM(7));
  assert.equal((await readEscrow(t.client, jobId))?.paid, NIM(7));
  // the same epoch of another job, and the next epoch of this one, are their own payments
  await payJob(t.client, t.operator, jobId, 6n, list);
  assert.equal((await readStake(t.client, miner)).staked, NIM(14));
  await closeEscrow(t.client, t.operator, jobId);
});

test('NIM is conserved across opens, payments, refunds and a crashed orchestrator replaying its calls', async () => {
  const [devA, devB] = [t.signer(2), t.signer(3)];
  const miners = [4, 5, 6].map((i) => t.signer(i).account.address);
  const jobA = newJob('job-conserve-a');
  const jobB = newJob('job-conserve-b');
  await checkConservation('start');
  await mint(devA.account.address, NIM(40));
  await mint(devB.account.address, NIM('12.5'));
  await checkConservation('minted');
  await openEscrow(t.client, devA, jobA, NIM(40));
  await checkConservation('open A');
  await openEscrow(t.client, devB, jobB, NIM('12.5'));
  await checkConservation('open B');

  const epoch1 = miners.map((address, i) => ({ address, amount: NIM(i + 1) }));
  await payJob(t.client, t.operator, jobA, 1n, epoch1);
  await checkConservation('pay A/1');

  // the orchestrator sends A/2 and crashes before recording it...
  const epoch2 = [{ address: miners[0], amount: NIM('0.5') }, { address: miners[2], amount: NIM('1.25') }];
  await escrowCall(t.operator, 'pay', [jobA, 2n, epoch2.map((p) => p.address), epoch2.map((p) => p.amount)]);
  await checkConservation('pay A/2 (then crash)');
  // ...and after its restart replays everything it had not recorded
  assert.equal((await payJob(t.client, t.operator, jobA, 2n, epoch2)).alreadyPaid, true);
  assert.equal((await payJob(t.client, t.operator, jobA, 1n, epoch1)).alreadyPaid, true);
  await rejectsWith(escrowCall(t.operator, 'pay', [jobA, 2n, epoch2.map((p) => p.address), epoch2.map((p) => p.amount)]), 'EpochAlreadyPaid');
  await checkConservation('replayed pays');
  assert.equal(await jobEpochPaid(t.client, jobA, 2n), rewardsDigest(epoch2));

  await payJob(t.client, t.operator, jobB, 1n, [{ address: miners[1], amount: NIM(10) }]);
  await checkConservation('pay B/1');

  // it closes A, crashes, and closes again
  const closeA = await closeEscrow(t.client, t.operator, jobA);
  assert.equal(closeA.refunded, NIM(40 - 6 - 1.75));
  await checkConservation('close A');
  assert.deepEqual(await closeEscrow(t.client, t.operator, jobA), { jobId: jobA, alreadyClosed: true, refunded: closeA.refunded });
  await rejectsWith(escrowCall(t.operator, 'close', [jobA]), 'JobClosed');
  await checkConservation('replayed close A');

  // B is closed straight on the contract (a crash before the library saw the receipt), then through the library
  await escrowCall(t.operator, 'close', [jobB]);
  assert.deepEqual(await closeEscrow(t.client, t.operator, jobB), { jobId: jobB, alreadyClosed: true, refunded: NIM('2.5') });
  await checkConservation('close B');

  assert.equal(await nimBalance(t.client, devA.account.address), closeA.refunded);
  assert.equal(await nimBalance(t.client, devB.account.address), NIM('2.5'));
  assert.equal(await escrowTotalHeld(t.client), 0n);
});

test('the owner closes its own escrow only after refundAfter, and gets all that is left', async () => {
  const dev = t.signer(4);
  const miner = t.signer(6).account.address;
  const jobId = newJob('job-expiry');
  await mint(dev.account.address, NIM(30));
  const { escrow } = await openEscrow(t.client, dev, jobId, NIM(30));
  await payJob(t.client, t.operator, jobId, 1n, [{ address: miner, amount: NIM(5) }]);
  const free = await nimBalance(t.client, dev.account.address);

  await assert.rejects(closeEscrow(t.client, dev, jobId), (err: unknown) => {
    assert.ok(err instanceof ChainTxError && err.errorName === 'RefundNotYet', String(err));
    assert.match(err.message, new RegExp(`from ${new Date(escrow.refundAfter * 1000).toISOString()}`));
    return true;
  });
  await advanceTime(t.client, DEFAULT_ESCROW_REFUND_DELAY_SECONDS - 3600);
  await rejectsWith(closeEscrow(t.client, dev, jobId), 'RefundNotYet');
  assert.equal((await readEscrow(t.client, jobId))?.closed, false);
  await advanceTime(t.client, 3601);
  const closed = await closeEscrow(t.client, dev, jobId);
  assert.equal(closed.alreadyClosed, false);
  assert.equal(closed.refunded, NIM(25));
  assert.equal(await nimBalance(t.client, dev.account.address), free + NIM(25));
  assert.equal((await closeEscrow(t.client, dev, jobId)).alreadyClosed, true);
  await assert.rejects(payJob(t.client, t.operator, jobId, 2n, [{ address: miner, amount: 1n }]), /is closed/);
});

test("the orchestrator's lock: its owner cannot close an escrow that pays for work, even past its refund time, until the orchestrator closes it or the lock lapses", async () => {
  const dev = t.signer(7);
  const miner = t.signer(6).account.address;
  const [jobId, other] = [newJob('job-locked'), newJob('job-locked-released')];
  await mint(dev.account.address, NIM(20));
  await openEscrow(t.client, dev, jobId, NIM(10));
  await openEscrow(t.client, dev, other, NIM(10));
  assert.equal(await escrowLockTimeout(t.client), DEFAULT_ESCROW_LOCK_SECONDS);
  assert.equal((await readEscrow(t.client, jobId))?.lockedUntil, 0, 'not locked until the orchestrator locks it');

  // only the orchestrator locks, and only an open escrow
  await rejectsWith(escrowCall(dev, 'lock', [jobId]), 'AccessControlUnauthorizedAccount');
  await rejectsWith(escrowCall(t.operator, 'lock', [jobIdOf('never opened')]), 'UnknownJob');
  const locked = await lockEscrow(t.client, t.operator, jobId);
  const [ev] = parseEventLogs({ abi: jobEscrowAbi, logs: locked.tx.receipt.logs, eventName: 'Locked' });
  assert.equal(Number(ev.args.lockedUntil), locked.lockedUntil);
  assert.ok(Math.abs(locked.lockedUntil - ((await chainTime(t.client)) + DEFAULT_ESCROW_LOCK_SECONDS)) < 60, `locked until ${locked.lockedUntil}`);
  await lockEscrow(t.client, t.operator, other);
  await rejectsWith(closeEscrow(t.client, dev, other), 'RefundNotYet');

  // the lock holds lockTimeout from its last renewal: renewed, it outlasts the refund time
  await advanceTime(t.client, DEFAULT_ESCROW_REFUND_DELAY_SECONDS - DEFAULT_ESCROW_LOCK_SECONDS + 3600);
  await rejectsWith(closeEscrow(t.client, dev, jobId), 'RefundNotYet');
  const renewed = await lockEscrow(t.client, t.operator, jobId);
  assert.ok(renewed.lockedUntil > locked.lockedUntil, 'renewed from now');
  assert.ok(renewed.lockedUntil > (await readEscrow(t.client, jobId))!.refundAfter);

  // the attack: past its refund time, after the miners worked, the owner takes it all back; refused while locked
  await advanceTime(t.client, DEFAULT_ESCROW_LOCK_SECONDS - 3600 + 1);
  assert.ok((await chainTime(t.client)) > (await readEscrow(t.client, jobId))!.refundAfter, 'past its refund time');
  await payJob(t.client, t.operator, jobId, 1n, [{ address: miner, amount: NIM(3) }]);
  await assert.rejects(closeEscrow(t.client, dev, jobId), (err: unknown) => {
    assert.ok(err instanceof ChainTxError && err.errorName === 'EscrowLocked', String(err));
    assert.match(err.message, /is locked by the orchestrator until \d{4}-.*if the orchestrator is gone, its owner can close it from \d{4}-/);
    return true;
  });
  await rejectsWith(escrowCall(dev, 'close', [jobId]), 'EscrowLocked');
  assert.equal((await readEscrow(t.client, jobId))?.closed, false);
  // the work keeps being paid while the lock holds
  await payJob(t.client, t.operator, jobId, 2n, [{ address: miner, amount: NIM(2) }]);

  // the orchestrator's close ends the lock: the rest goes back to the owner
  assert.equal((await closeEscrow(t.client, t.operator, other)).refunded, NIM(10));
  await rejectsWith(escrowCall(t.operator, 'lock', [other]), 'JobClosed');

  // an orchestrator that vanished renews nothing: the lock lapses by itself and the owner closes
  await advanceTime(t.client, renewed.lockedUntil - (await chainTime(t.client)) - 120);
  await rejectsWith(closeEscrow(t.client, dev, jobId), 'EscrowLocked');
  await advanceTime(t.client, 121);
  const free = await nimBalance(t.client, dev.account.address);
  const closed = await closeEscrow(t.client, dev, jobId);
  assert.equal(closed.refunded, NIM(5), 'all that was not paid');
  assert.equal(await nimBalance(t.client, dev.account.address), free + NIM(5));
  await checkConservation('after the locked escrows closed');
});

test('a developer short of NIM or of allowance gets a clear error and nothing changes', async () => {
  const dev = t.signer(8);
  const me = dev.account.address;
  const jobId = newJob('job-poor');
  await mint(me, NIM(5) - (await nimBalance(t.client, me)));
  const allowance = async (): Promise<bigint> =>
    t.client.public.readContract({ address: t.client.deployment.nim, abi: nimAbi, functionName: 'allowance', args: [me, escrowAddress(t.client)] });
  const n = await nonce(me);

  await assert.rejects(openEscrow(t.client, dev, jobId, NIM('8.25')), (err: unknown) => {
    assert.ok(err instanceof NimbleError, String(err));
    assert.equal(err.message, `not enough NIM to escrow job ${jobId}: 8.25 NIM needed, 5 NIM free in ${me} (3.25 NIM short)`);
    return true;
  });
  await assert.rejects(openEscrow(t.client, dev, jobId, NIM(5), { approve: false }), /may spend 0 NIM of .*needs 5 \(5 NIM short\): approve it first/);
  await assert.rejects(openEscrow(t.client, dev, jobId, 0n), /more than 0 NIM/);
  await assert.rejects(openEscrow(t.client, dev, '0x1234', NIM(1)), /32 bytes of hex/);
  assert.equal(await nonce(me), n, 'no transaction sent');
  assert.equal(await allowance(), 0n);
  // straight to the contract without an approval: the token's own error, nothing escrowed
  await rejectsWith(escrowCall(dev, 'open', [jobId, NIM(5)]), 'ERC20InsufficientAllowance');
  await rejectsWith(escrowCall(dev, 'open', [jobId, 0n]), 'ZeroAmount');
  assert.equal(await readEscrow(t.client, jobId), null);
  assert.equal(await nimBalance(t.client, me), NIM(5));

  // with enough NIM it works, and another developer cannot take the same job id
  const ok = await openEscrow(t.client, dev, jobId, NIM(5));
  assert.equal(ok.escrow.owner, me);
  await assert.rejects(openEscrow(t.client, t.signer(9), jobId, NIM(5)), (err: unknown) => err instanceof NimbleError && err.code === 'conflict');
  await closeEscrow(t.client, t.operator, jobId);
});
