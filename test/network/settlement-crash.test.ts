// kill -9 of a real orchestrator process in the middle of a settlement: the
// chain has taken the epoch's rewards, the orchestrator has not recorded it
// yet (it pauses there through a test-only environment hook). After a
// restart, every epoch is settled and none is paid twice: one EpochSettled
// event per on-chain epoch, each miner's stake equal to what its epochs gave.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseAbiItem, type Address } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { openChain } from '../../src/chain/session.ts';
import { readStake } from '../../src/chain/staking.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const epochs = (): Promise<EpochView[]> => cluster.epochs();

test('kill -9 of the orchestrator between the chain taking an epoch and recording it: paid exactly once after restart', async () => {
  process.env.NIMBLE_PASSWORD = 'pw-crash';
  process.env.NIMBLE_CHAIN_RPC = '';
  const args = ['--min-stake', '0', '--epoch-rounds', '1', '--emission', '10', '--check-rate', '0'];
  process.env.NIMBLE_TEST_SETTLE_PAUSE_MS = '60000';
  try {
    await cluster.startOrchestrator(args, { chain: true });
  } finally {
    delete process.env.NIMBLE_TEST_SETTLE_PAUSE_MS;
  }
  const wallets = ['a', 'b'].map((n) => saveWallet(join(cluster.dir, n), `w-${n}`, generatePrivateKey(), 'pw-crash'));
  await Promise.all(['a', 'b'].map((n) => cluster.startMiner(n, ['--wallet.name', `w-${n}`])));
  const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 40, stages: 2, mergeEvery: 5, batchSize: 8, minMiners: 2 });

  const paused = await cluster.orchestrator!.waitFor((v) => v.event === 'log' && /pausing .* before recording it/.test(String(v.message)), 120_000);
  const chainEpoch = BigInt(/as epoch (\d+)/.exec(String(paused.message))![1]);
  const orch = cluster.orchestrator!.child;
  orch.kill('SIGKILL');
  await new Promise((r) => orch.once('exit', r));

  await cluster.startOrchestrator(args, { chain: true });
  const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 180_000);
  assert.equal(done.status, 'completed');
  // The ledger and the chain are read as one snapshot: the epochs before and
  // after the chain reads must be the same, all settled. A last epoch can
  // still close (the run's final work) while the chain is read; a stake read
  // then would include a payment the earlier epoch list does not show.
  const session = await openChain({ dataDir: join(cluster.dir, 'orch') });
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
    const interrupted = closed.find((e) => e.chainEpoch === chainEpoch.toString());
    assert.ok(interrupted, `the interrupted epoch (on chain ${chainEpoch}) is recorded as settled after the restart`);
    assert.equal(new Set(ids).size, ids.length, 'no on-chain epoch settled twice');
    assert.equal(ids.filter((id) => id === chainEpoch.toString()).length, 1);
    const paid = closed.filter((e) => e.rewards.some((r) => BigInt(r.amountWei) > 0n));
    assert.equal(ids.length, paid.length, 'one settlement per paying epoch');
    wallets.forEach((w, i) => {
      const owed = paid.flatMap((e) => e.rewards).filter((r) => r.miner === w.address).reduce((s, r) => s + BigInt(r.amountWei), 0n);
      assert.equal(stakes[i], owed, `${w.name}: stake = what its epochs paid`);
    });
  } finally {
    await session.close();
  }
});
