// End to end: spot checks catch a dishonest miner and slash it. An orchestrator
// on its local anvil checks half of all forwards; two honest miners (child
// processes) and one that inflates every activation it sends and every loss it
// reports (in this process, through the miner's fault-injection hook). The
// honest miners pass every check; the dishonest one fails, loses score, is
// evicted, and for each failed check loses half of what it then has staked,
// exactly once. The run completes on the honest miners.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { signerFor } from '../../src/chain/client.ts';
import { openChain } from '../../src/chain/session.ts';
import { addStake, readStake } from '../../src/chain/staking.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import { Miner } from '../../src/miner/miner.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import { slashedEvents } from '../helpers/chain-events.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let cheater: Miner | null = null;
after(async () => {
  await cheater?.stop();
  await cluster.stopGracefully();
});
const epochs = (): Promise<EpochView[]> => cluster.epochs();

test('spot checks pass an honest miner and slash a dishonest one', async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  await cluster.startOrchestrator(['--epoch-rounds', '1', '--emission', '10', '--check-rate', '0.5', '--slash-fraction', '0.5', '--min-stake', '0'], { chain: true });
  const key = generatePrivateKey();
  const address = privateKeyToAccount(key).address;
  const session = await openChain({ dataDir: join(cluster.dir, 'orch') });
  try {
    await faucet(session.client, address, parseEther('100'));
    await ensureGas(session.client, address);
    await addStake(session.client, signerFor(session.client, privateKeyToAccount(key)), parseEther('40'));

    await cluster.startMiner('honest');
    await cluster.startMiner('honest-2');
    cheater = await Miner.start({
      orchestrator: cluster.url,
      dataDir: join(cluster.dir, 'cheater'),
      name: 'cheater',
      threads: 1,
      privateKey: key,
      tamper: { activation: (a) => a.forEach((x, i) => (a[i] = x * 1.5)), loss: (l) => l * 0.5 },
    });
    const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 60, stages: 2, mergeEvery: 5, batchSize: 8, minMiners: 3 });
    const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 180_000);
    assert.equal(done.status, 'completed');
    const byName = new Map(done.checks.map((c) => [c.name, c]));
    const honest = ['honest', 'honest-2'].map((n) => byName.get(n) ?? { passed: 0, failed: 0 });
    const bad = byName.get('cheater');
    assert.ok(honest.reduce((a, h) => a + h.passed, 0) >= 3, `honest checks: ${JSON.stringify(done.checks)}`);
    assert.ok(honest.every((h) => h.failed === 0), `an honest miner never fails: ${JSON.stringify(done.checks)}`);
    assert.ok(bad && bad.failed >= 1, `dishonest checks: ${JSON.stringify(done.checks)}`);
    assert.equal(bad.passed, 0);
    // a failed check is an offence: the cheater is out, and may not join again for a while
    assert.equal((await cluster.api.miners()).find((m) => m.id === address)?.alive, false);

    // slashed on chain: every 'slashed' row is one Slashed event, the stake fell by their sum
    let slashes: EpochView['slashes'] = [];
    for (let i = 0; i < 150; i++) {
      const es = await epochs();
      slashes = es.flatMap((e) => e.slashes);
      if (slashes.length > 0 && slashes.every((s) => s.status !== 'pending') && es.filter((e) => e.status !== 'open').every((e) => e.status === 'settled')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.ok(slashes.length >= 1, 'the dishonest miner was slashed');
    assert.ok(slashes.every((s) => s.miner === address && s.failed === 1), JSON.stringify(slashes));
    const sent = slashes.filter((s) => s.status === 'slashed');
    assert.ok(sent.length >= 1 && slashes.every((s) => s.status === 'slashed' || s.status === 'skipped'), JSON.stringify(slashes));
    assert.ok(slashes.length <= bad.failed, 'at most one slash per failed check');
    const events = await slashedEvents(session.client, address as Address);
    assert.equal(events.length, sent.length, 'one Slashed event per slashed row, none twice');
    assert.deepEqual(new Set(events.map((e) => e.args.reason)).size, events.length);
    const earned = (await epochs()).flatMap((e) => e.rewards).filter((r) => r.miner === address).reduce((a, r) => a + BigInt(r.amountWei), 0n);
    const slashed = sent.reduce((a, s) => a + BigInt(s.amountWei!), 0n);
    const { staked, unstaking } = await readStake(session.client, address as Address);
    assert.equal(staked + unstaking, parseEther('40') + earned - slashed);
    assert.ok(slashed >= parseEther('20'), 'the first slash took half of the stake');
  } finally {
    await session.close();
  }
});
