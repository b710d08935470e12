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
  let closed: EpochView[] = [];
  for (let i = 0; i < 150; i++) {
    closed = (await epochs()).filter((e) => e.status !== 'open');
    if (closed.length >= 2 && closed.every((e) => e.status === 'settled')) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.ok(closed.every((e) => e.status === 'settled'), JSON.stringify(closed));
  const interrupted = closed.find((e) => e.chainEpoch === chainEpoch.toString());
  assert.ok(interrupted, `the interrupted epoch (on chain ${chainEpoch}) is recorded as settled after the restart`);

  const session = await openChain({ dataDir: join(cluster.dir, 'orch') });
  try {
    const settled = await session.client.public.getLogs({
      address: session.client.deployment.rewardDistributor,
      event: parseAbiItem('event EpochSettled(uint256 indexed epochId, uint32 batchCount, uint256 total, bytes32 digest)'),
      fromBlock: 0n,
      toBlock: 'latest',
    });
    const ids = settled.map((l) => l.args.epochId!.toString());
    assert.equal(new Set(ids).size, ids.length, 'no on-chain epoch settled twice');
    assert.equal(ids.filter((id) => id === chainEpoch.toString()).length, 1);
    const paid = closed.filter((e) => e.rewards.some((r) => BigInt(r.amountWei) > 0n));
    assert.equal(ids.length, paid.length, 'one settlement per paying epoch');
    for (const w of wallets) {
      const owed = paid.flatMap((e) => e.rewards).filter((r) => r.miner === w.address).reduce((s, r) => s + BigInt(r.amountWei), 0n);
      assert.equal((await readStake(session.client, w.address as Address)).staked, owed, `${w.name}: stake = what its epochs paid`);
    }
  } finally {
    await session.close();
  }
});
