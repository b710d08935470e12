// kill -9 of a real orchestrator process in the middle of a settlement: the
// chain has taken the epoch's rewards, the orchestrator has not recorded it
// yet (it pauses there through a test-only environment hook). After a
// restart, every epoch is settled and none is paid twice: one EpochSettled
// event per on-chain epoch, each miner's stake equal to what its epochs gave.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { generatePrivateKey } from 'viem/accounts';
import { saveWallet } from '../../src/chain/wallets.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import { Cluster } from './helpers.ts';
import { assertEachEpochPaidOnce } from './paid-once.ts';

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
  const wallets = ['a', 'b'].map((n) => saveWallet(join(cluster.dir, n), `w-${n}`, generatePrivateKey(), 'pw-crash', 'light'));
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
  await assertEachEpochPaidOnce(epochs, join(cluster.dir, 'orch'), wallets, chainEpoch);
});
