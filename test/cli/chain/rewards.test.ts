// The CLI's human output shows NIM rounded for people (src/chain/nim-display.ts)
// where its JSON keeps the exact amounts: an epoch's split of 100 NIM among
// three miners is printed as 33.3333 each, not 33.333333333333333333.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EpochView } from '../../../src/api/schemas.ts';
import { formatNim, showNim } from '../../../src/chain/amounts.ts';
import { describeEpoch } from '../../../src/cli/chain/rewards.ts';

const miner = (n: number): `0x${string}` => `0x${String(n).repeat(40)}`;

test('an epoch\'s split in the human output is rounded for people; the exact amounts stay in the view (the JSON)', () => {
  const third = 10n ** 20n / 3n; // 33.333333333333333333 NIM
  const e = {
    id: 4, status: 'settled', runId: 'run-1', workLog: [0, 10], openedAt: 0, closedAt: 1, emission: '100', remainder: formatNim(10n ** 20n - 3n * third),
    chainId: 31337, chainEpoch: '4', txHash: null, settledAt: 2, error: null,
    rewards: [1, 2, 3].map((n) => ({ miner: miner(n), name: `m${n}`, score: 1 / 3, amount: formatNim(third), amountWei: third.toString(), units: { inference: 0.5 } })),
    inferencePayments: [{ payee: miner(4), name: null, role: 'owner', amount: '0.0000123456789', amountWei: '12345678900000', status: 'paid' }],
    slashes: [],
  } as unknown as EpochView;
  const text = describeEpoch(e);
  assert.doesNotMatch(text, /33\.33333333/);
  assert.equal(text.match(/ 33\.3333(?!\d)/g)?.length, 3, text);
  assert.match(text, /remainder 0\.000000000000000001 NIM/, 'a remainder below one keeps its significant digits');
  assert.match(text, /0\.00001235 NIM {2}paid/);
  assert.equal(e.rewards[0].amount, '33.333333333333333333', 'the view itself is exact');
  assert.equal(showNim(99_999_999_999_999_999_997n), '100');
  assert.equal(showNim(15n * 10n ** 17n), '1.5');
});
