// The check that a paid network paid each epoch exactly once after a crash in
// the middle of a settlement (the chain took the epoch, the orchestrator had
// not recorded it): one EpochSettled event per on-chain epoch, the
// interrupted one among them, each miner's stake equal to what its epochs
// gave. The ledger and the chain are read as one snapshot: the epochs before
// and after the chain reads must be the same, all settled. A last epoch can
// still close (a run's final work) while the chain is read; a stake read then
// would include a payment the earlier epoch list does not show.
import assert from 'node:assert/strict';
import { parseAbiItem, type Address } from 'viem';
import type { EpochView } from '../../src/api/schemas.ts';
import { openChain } from '../../src/chain/session.ts';
import { readStake } from '../../src/chain/staking.ts';

export async function assertEachEpochPaidOnce(
  epochs: () => Promise<EpochView[]>,
  chainDataDir: string,
  wallets: readonly { name: string; address: string }[],
  interruptedChainEpoch: bigint,
): Promise<void> {
  const session = await openChain({ dataDir: chainDataDir });
  try {
    const summary = (list: EpochView[]): string => JSON.stringify(list.filter((e) => e.status !== 'open').map((e) => [e.id, e.status, e.chainEpoch]));
    let snapshot: { closed: EpochView[]; ids: string[]; stakes: bigint[] } | null = null;
    let last = '';
    for (let i = 0; i < 150 && !snapshot; i++) {
      const before = await epochs();
      const closed = before.filter((e) => e.status !== 'open');
      last = JSON.stringify(closed);
      if (closed.length >= 2 && closed.every((e) => e.status === 'settled')) {
        const settled = await session.client.public.getLogs({
          address: session.client.deployment.rewardDistributor,
          event: parseAbiItem('event EpochSettled(uint256 indexed epochId, uint32 batchCount, uint256 total, bytes32 digest)'),
          fromBlock: 0n,
          toBlock: 'latest',
        });
        const stakes = await Promise.all(wallets.map(async (w) => (await readStake(session.client, w.address as Address)).staked));
        if (summary(await epochs()) === summary(before)) snapshot = { closed, ids: settled.map((l) => l.args.epochId!.toString()), stakes };
      }
      if (!snapshot) await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(snapshot, `the epochs never all settled and held still: ${last}`);
    const { closed, ids, stakes } = snapshot;
    const interrupted = closed.find((e) => e.chainEpoch === interruptedChainEpoch.toString());
    assert.ok(interrupted, `the interrupted epoch (on chain ${interruptedChainEpoch}) is recorded as settled`);
    assert.equal(new Set(ids).size, ids.length, 'no on-chain epoch settled twice');
    assert.equal(ids.filter((id) => id === interruptedChainEpoch.toString()).length, 1);
    const paid = closed.filter((e) => e.rewards.some((r) => BigInt(r.amountWei) > 0n));
    assert.equal(ids.length, paid.length, 'one settlement per paying epoch');
    wallets.forEach((w, i) => {
      const owed = paid.flatMap((e) => e.rewards).filter((r) => r.miner === w.address).reduce((s, r) => s + BigInt(r.amountWei), 0n);
      assert.equal(stakes[i], owed, `${w.name}: stake = what its epochs paid`);
    });
  } finally {
    await session.close();
  }
}
