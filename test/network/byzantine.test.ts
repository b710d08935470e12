// End to end, on a paid local network: two honest miners and one dishonest
// miner of each kind the network defends against (test/helpers/byzantine.ts:
// inflating reports, blaming, poisoning merges, lazy weights), each a process
// of its own with the minimum stake, train one run together. Each cheat is an
// offence (src/orchestrator/rewards/offences.ts): the cheater is slashed on chain and,
// its stake now below the minimum, evicted; the run completes; every
// completed microbatch is credited once per hop; the honest miners are
// charged nothing, lose no stake and earn more than any cheater.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseAbiItem, parseEther, type Address } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import { signerFor } from '../../src/chain/client.ts';
import { openChain } from '../../src/chain/session.ts';
import { addStake, readStake } from '../../src/chain/staking.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import type { EpochView, WorkTotal } from '../../src/api/schemas.ts';
import { KINDS, type Kind } from '../helpers/byzantine.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());

const STAKE = parseEther('10');
const roster: [string, Kind][] = [['honest-1', 'honest'], ['honest-2', 'honest'], ['honest-3', 'honest'], ['honest-4', 'honest'], ...KINDS.filter((k) => k !== 'honest').map((k): [string, Kind] => [k, k])];

test('two honest miners and one cheater of each kind: every cheat is slashed and evicted, the run completes, each microbatch is credited once per hop, the honest lose nothing and earn the most', async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  // generous liveness and deadline limits: on a loaded CI machine (2 cores, other test files beside this one) an honest
  // miner may stall for seconds, and what is under test here is cheating, not slowness (failures.test.ts tests that)
  await cluster.startOrchestrator(['--epoch-rounds', '1', '--emission', '10', '--check-rate', '0.2', '--min-stake', '10', '--miner-timeout-ms', '15000', '--deadline-ms', '30000'], { chain: true });
  const session = await openChain({ dataDir: join(cluster.dir, 'orch') });
  try {
    const kindOf = new Map<string, Kind>();
    const nameOf = new Map<string, string>();
    for (const [name, kind] of roster) {
      const { privateKey, address } = loadOrCreateKeyFile(join(cluster.dir, name, 'miner-key.json'));
      kindOf.set(address, kind);
      nameOf.set(address, name);
      await faucet(session.client, address as Address, STAKE);
      await ensureGas(session.client, address as Address);
      await addStake(session.client, signerFor(session.client, privateKeyToAccount(privateKey)), STAKE);
    }
    await Promise.all(roster.map(([name, kind]) => cluster.startByzantine(name, kind)));
    const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 200, stages: 2, mergeEvery: 5, batchSize: 8, minMiners: roster.length });
    const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 300_000);
    assert.equal(done.status, 'completed', done.message ?? '');
    assert.ok(done.loss !== null && Number.isFinite(done.loss) && done.loss < Math.log(256), `the model learned: loss ${done.loss}`);

    // credit: each completed microbatch is one forward and one backward per stage, whatever was claimed
    const work = await cluster.api.work();
    const units = (miner: string, kind: WorkTotal['kind']): number => work.filter((w) => w.miner === miner && w.kind === kind).reduce((a, w) => a + w.units, 0);
    const total = (kind: WorkTotal['kind']): number => work.filter((w) => w.kind === kind).reduce((a, w) => a + w.units, 0);
    assert.equal(total('forward'), 2 * done.microbatchesDone);
    assert.equal(total('backward'), 2 * done.microbatchesDone);

    // wait until every slash is sent and every closed epoch settled, then read every stake; the last epoch may
    // close and settle meanwhile, so keep the first snapshot whose epochs did not change while the stakes were read
    const settledNow = async (): Promise<EpochView[]> => {
      for (let i = 0; ; i++) {
        const epochs = await cluster.epochs();
        const slashes = epochs.flatMap((e) => e.slashes);
        if (slashes.every((s) => s.status !== 'pending') && epochs.filter((e) => e.status !== 'open').every((e) => e.status === 'settled')) return epochs;
        if (i > 300) throw new Error(`epochs did not settle: ${JSON.stringify(epochs.map((e) => e.status))}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    let epochs: EpochView[] = [];
    const stakes = new Map<string, bigint>();
    for (let tries = 0; ; tries++) {
      epochs = await settledNow();
      for (const a of kindOf.keys()) {
        const { staked, unstaking } = await readStake(session.client, a as Address);
        stakes.set(a, staked + unstaking);
      }
      const again = await settledNow();
      if (JSON.stringify(again) === JSON.stringify(epochs) || tries > 20) break;
    }
    const slashes = epochs.flatMap((e) => e.slashes);
    const earned = new Map<string, bigint>();
    for (const r of epochs.flatMap((e) => e.rewards)) earned.set(r.miner, (earned.get(r.miner) ?? 0n) + BigInt(r.amountWei));
    const miners = await cluster.api.miners();
    const report = [...kindOf].map(([a, k]) => `${nameOf.get(a)} (${k}): ${['forward', 'backward', 'merge', 'dropped', 'invalid', 'failed_check'].map((kind) => `${kind} ${units(a, kind as WorkTotal['kind'])}`).join(', ')}; earned ${earned.get(a) ?? 0n}; slashes ${slashes.filter((s) => s.miner === a).length}`).join('\n') + `\ncharged:\n${cluster.chargedDetails()}`;

    const honest = [...kindOf].filter(([, k]) => k === 'honest').map(([a]) => a);
    const cheaters = [...kindOf].filter(([, k]) => k !== 'honest').map(([a]) => a);
    for (const a of honest) {
      assert.deepEqual([units(a, 'invalid'), units(a, 'failed_check'), units(a, 'dropped')], [0, 0, 0], `${nameOf.get(a)} is charged nothing\n${report}`);
      assert.equal(slashes.filter((s) => s.miner === a).length, 0, `${nameOf.get(a)} is not slashed\n${report}`);
      assert.ok(miners.find((m) => m.id === a)?.alive, `${nameOf.get(a)} still works\n${report}`);
      assert.equal(stakes.get(a), STAKE + (earned.get(a) ?? 0n), `${nameOf.get(a)} keeps its stake and what it earned\n${report}`);
    }
    const leastHonest = honest.reduce((m, a) => ((earned.get(a) ?? 0n) < m ? (earned.get(a) ?? 0n) : m), BigInt(Number.MAX_SAFE_INTEGER) * 10n ** 18n);
    for (const a of cheaters) {
      const name = nameOf.get(a)!;
      assert.ok(units(a, 'invalid') + units(a, 'failed_check') > 0, `${name} committed an offence\n${report}`);
      const mine = slashes.filter((s) => s.miner === a && s.status === 'slashed');
      assert.ok(mine.length >= 1, `${name} was slashed\n${report}`);
      assert.equal(miners.find((m) => m.id === a)?.alive, false, `${name} was evicted\n${report}`);
      assert.ok((earned.get(a) ?? 0n) < leastHonest, `${name} earned less than any honest miner\n${report}`);
      const slashed = mine.reduce((x, s) => x + BigInt(s.amountWei!), 0n);
      assert.ok(slashed > 0n);
      assert.equal(stakes.get(a), STAKE + (earned.get(a) ?? 0n) - slashed, `${name}: the stake fell by what was slashed`);
    }
    // every slash sent is one Slashed event with its own reason
    const events = await session.client.public.getLogs({
      address: session.client.deployment.staking,
      event: parseAbiItem('event Slashed(address indexed account, uint256 amount, string reason)'),
      fromBlock: 0n,
      toBlock: 'latest',
    });
    assert.equal(events.length, slashes.filter((s) => s.status === 'slashed').length);
    assert.equal(new Set(events.map((e) => e.args.reason)).size, events.length);
  } finally {
    await session.close();
  }
});
