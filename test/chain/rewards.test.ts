// settleEpoch / isEpochSettled: the library the orchestrator settles with.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { getAddress, keccak256, parseUnits, toHex, type Address } from 'viem';
import { rewardDistributorAbi } from '../../src/chain/abis.ts';
import {
  batchRanges,
  isEpochSettled,
  normalizeRewards,
  readEpoch,
  rewardHistory,
  rewardsDigest,
  settleEpoch,
  settlementTxOf,
  type Reward,
} from '../../src/chain/rewards.ts';
import { readStake } from '../../src/chain/staking.ts';
import { nimBalance } from '../../src/chain/token.ts';
import { ChainTxError, sendContractTx } from '../../src/chain/tx.ts';
import { startTestChain, supplyReport, type TestChain } from './helpers.ts';

const NIM = (n: number | string): bigint => parseUnits(String(n), 18);
let t: TestChain;

before(async () => {
  t = await startTestChain();
});
after(async () => {
  await t?.stop();
});

function miners(n: number, salt: string): Address[] {
  return Array.from({ length: n }, (_, i) => getAddress(keccak256(toHex(`${salt}-${i}`)).slice(0, 42)));
}

test('batchRanges cuts near-equal consecutive batches', () => {
  assert.deepEqual(batchRanges(10, 3), [[0, 4], [4, 8], [8, 10]]);
  assert.deepEqual(batchRanges(1000, 4), [[0, 250], [250, 500], [500, 750], [750, 1000]]);
  assert.deepEqual(batchRanges(0, 1), [[0, 0]]);
});

test('normalizeRewards merges duplicates, drops zeros, rejects bad entries', () => {
  const [a, b] = miners(2, 'norm');
  assert.deepEqual(
    normalizeRewards([
      { address: a, amount: 1n },
      { address: b.toLowerCase() as Address, amount: 0n },
      { address: a.toLowerCase() as Address, amount: 2n },
    ]),
    [{ address: a, amount: 3n }],
  );
  assert.throws(() => normalizeRewards([{ address: '0x12' as Address, amount: 1n }]), /invalid miner address/);
  assert.throws(() => normalizeRewards([{ address: a, amount: -1n }]), /invalid reward amount/);
  assert.throws(() => normalizeRewards([{ address: '0x0000000000000000000000000000000000000000', amount: 1n }]), /zero address/);
});

test('settleEpoch pays in batches as stake, once; a second call does nothing and says so', async () => {
  const list: Reward[] = miners(23, 'e1').map((address, i) => ({ address, amount: NIM(i + 1) }));
  const total = list.reduce((s, r) => s + r.amount, 0n);
  assert.equal(await isEpochSettled(t.client, 1n), false);
  const seen: number[] = [];
  const r = await settleEpoch(t.client, t.operator, 1n, list, { maxBatchSize: 10, onBatch: (b) => seen.push(b.miners) });
  assert.equal(r.alreadySettled, false);
  assert.equal(r.batchCount, 3);
  assert.deepEqual(seen, [8, 8, 7]);
  assert.equal(r.total, total);
  assert.equal(await isEpochSettled(t.client, 1n), true);
  assert.equal(await settlementTxOf(t.client, 1n), r.txHashes.at(-1), 'the last batch settled it');
  assert.equal(await settlementTxOf(t.client, 99n), null);
  for (const [i, m] of list.entries()) {
    assert.equal((await readStake(t.client, m.address)).staked, NIM(i + 1));
    assert.equal(await nimBalance(t.client, m.address), 0n);
  }
  const again = await settleEpoch(t.client, t.operator, 1n, list, { maxBatchSize: 10 });
  assert.equal(again.alreadySettled, true);
  assert.equal(again.batchesSent, 0);
  assert.deepEqual(again.txHashes, []);
  assert.equal((await readStake(t.client, list[0].address)).staked, NIM(1)); // not paid twice
  const report = await supplyReport(t.client, list.map((m) => m.address));
  assert.equal(report.staked, total);
});

test('settleEpoch resumes a half-posted epoch with the same list and refuses a different one', async () => {
  const list: Reward[] = miners(9, 'e2').map((address) => ({ address, amount: NIM(2) }));
  const digest = rewardsDigest(list);
  // an orchestrator that crashed after the first of three batches
  await sendContractTx(t.client, t.operator, {
    address: t.client.deployment.rewardDistributor,
    abi: rewardDistributorAbi,
    functionName: 'postRewards',
    args: [2n, 0, 3, digest, list.slice(0, 3).map((r) => r.address), list.slice(0, 3).map((r) => r.amount), true],
  });
  assert.equal(await isEpochSettled(t.client, 2n), false);
  const changed = list.map((r, i) => (i === 8 ? { ...r, amount: NIM(3) } : r));
  await assert.rejects(settleEpoch(t.client, t.operator, 2n, changed), /half-posted with a different reward list/);
  // a different batch size now does not matter: the chain's batch count wins
  const r = await settleEpoch(t.client, t.operator, 2n, list, { maxBatchSize: 100 });
  assert.equal(r.batchesSent, 2);
  assert.equal(r.batchCount, 3);
  const e = await readEpoch(t.client, 2n);
  assert.equal(e.settled, true);
  assert.equal(e.total, NIM(18));
  for (const m of list) assert.equal((await readStake(t.client, m.address)).staked, NIM(2));
});

test('only the orchestrator can settle', async () => {
  const list: Reward[] = [{ address: t.signer(1).account.address, amount: NIM(1000) }];
  await assert.rejects(settleEpoch(t.client, t.signer(1), 3n, list), (err: unknown) => err instanceof ChainTxError && err.errorName === 'AccessControlUnauthorizedAccount');
  assert.equal(await isEpochSettled(t.client, 3n), false);
  assert.equal((await readStake(t.client, t.signer(1).account.address)).staked, 0n);
});

test('rewardHistory lists what a miner earned per epoch', async () => {
  const m = miners(1, 'hist')[0];
  await settleEpoch(t.client, t.operator, 10n, [{ address: m, amount: NIM('1.5') }]);
  await settleEpoch(t.client, t.operator, 11n, [{ address: m, amount: NIM('0.25') }], { asStake: false });
  const h = await rewardHistory(t.client, m);
  assert.deepEqual(h.map((r) => [r.epochId, r.amount]), [
    [10n, NIM('1.5')],
    [11n, NIM('0.25')],
  ]);
  assert.equal((await readStake(t.client, m)).staked, NIM('1.5'));
  assert.equal(await nimBalance(t.client, m), NIM('0.25'));
});
