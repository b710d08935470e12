// Epoch settlement against a real anvil: closing, paying as stake, crash
// recovery (an epoch left 'settling' is paid exactly once after a restart),
// GET /epochs and `nbcli rewards`, and the minimum stake at join.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { rewardHistory, settleEpoch } from '../../src/chain/rewards.ts';
import { addStake, readStake, removeStake } from '../../src/chain/staking.ts';
import { faucet } from '../../src/chain/token.ts';
import { signerFor } from '../../src/chain/client.ts';
import { SignedClient } from '../../src/http/client.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { OrchestratorDb } from '../../src/orchestrator/db.ts';
import { Epochs, type ChainOptions } from '../../src/orchestrator/epochs.ts';
import { startOrchestrator } from '../../src/orchestrator/server.ts';
import type { EpochView } from '../../src/orchestrator/views.ts';
import { startTestChain, tempDir, type TestChain } from '../chain/helpers.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));
let chain: TestChain;
let dir: string;
before(async () => {
  chain = await startTestChain();
  dir = tempDir('epochs');
});
after(async () => {
  await chain.stop();
  rmSync(dir, { recursive: true, force: true });
});

const miners = [1, 2, 3].map(() => privateKeyToAccount(generatePrivateKey()).address);
const chainOpts = (extra: Partial<ChainOptions> = {}): ChainOptions => ({ client: chain.client, signer: chain.operator, emission: parseEther('100'), log: () => {}, ...extra });

/** A fresh orchestrator database with one 2-stage gpt-micro run and some work. */
function seed(path: string): OrchestratorDb {
  const db = new OrchestratorDb(path);
  db.insertRun({ id: 'r1', model: 'gpt-micro', data: 'moby-dick', steps: 10, batch_size: 4, merge_every: 5, seed: 1, stage_count: 2, plan: '{}', options: '{}' }, 1);
  db.insertStage({ run_id: 'r1', stage: 0, from_part: 0, to_part: 2 });
  db.insertStage({ run_id: 'r1', stage: 1, from_part: 2, to_part: 4 });
  for (let i = 0; i < 6; i++) {
    db.logWork(miners[0], 'r1', 'forward', 1, 2, 0);
    db.logWork(miners[0], 'r1', 'backward', 1, 2, 0);
    db.logWork(miners[1], 'r1', 'forward', 1, 2, 1);
    db.logWork(miners[1], 'r1', 'backward', 1, 2, 1);
  }
  db.logWork(miners[1], 'r1', 'merge', 2, 2, 1);
  db.logWork(miners[2], 'r1', 'forward', 1, 2, 1);
  db.logWork(miners[2], 'r1', 'dropped', 1, 2, 1); // 1 − 3 < 0: gets nothing
  return db;
}

const staked = async (a: Address): Promise<bigint> => (await readStake(chain.client, a)).staked;

test('an epoch closes after a merge round and is paid as stake, in proportion to scores', async () => {
  const db = seed(join(dir, 'a.sqlite'));
  const epochs = new Epochs(db, chainOpts());
  assert.equal(epochs.closeIfDue(), null, 'no merge round yet');
  db.addRunCounters('r1', { merges: 1 });
  const before = await Promise.all(miners.map(staked));
  const closed = epochs.closeIfDue();
  assert.ok(closed);
  assert.equal(closed.status, 'settling');
  const rewards = db.epochRewards(closed.id);
  assert.equal(rewards.length, 3);
  const total = rewards.reduce((a, r) => a + BigInt(r.amount), 0n);
  assert.equal(total + BigInt(closed.remainder!), parseEther('100'));
  assert.equal(rewards.find((r) => r.miner === miners[2])!.amount, '0');
  await epochs.reconcile();
  const e = db.epoch(closed.id)!;
  assert.equal(e.status, 'settled');
  assert.match(e.tx_hash!, /^0x[0-9a-f]{64}$/);
  for (const [i, m] of miners.entries()) assert.equal((await staked(m)) - before[i], BigInt(rewards.find((r) => r.miner === m)!.amount));
  // the next epoch starts after it; nothing new, nothing due
  assert.equal(epochs.closeIfDue(), null);
  assert.equal(db.openEpoch(3).from_log, e.to_log);
  db.close();
});

test('kill -9 while settling: the epoch is completed exactly once after restart', async () => {
  // (a) crashed after writing the split, before sending
  const dbA = seed(join(dir, 'b.sqlite'));
  const e1 = new Epochs(dbA, chainOpts()).close('r1', 1)!;
  dbA.close();
  // (b) crashed after the chain took the batches, before marking settled
  const dbB = seed(join(dir, 'c.sqlite'));
  const first = new Epochs(dbB, chainOpts());
  const e2 = first.close('r1', 1)!;
  // what settle() does before sending: choose and record the on-chain id
  const chainEpoch = (await chain.client.public.getBlockNumber()) + 1000n;
  dbB.updateEpoch(e2.id, { chain_epoch: chainEpoch.toString(), chain_id: chain.client.chainId });
  const sent = await settleEpoch(chain.client, chain.operator, chainEpoch, first.rewardList(e2.id));
  dbB.close();

  const before = await Promise.all(miners.map(staked));
  const reA = new OrchestratorDb(join(dir, 'b.sqlite'));
  const reB = new OrchestratorDb(join(dir, 'c.sqlite'));
  assert.equal(reA.epoch(e1.id)!.status, 'settling');
  await new Epochs(reA, chainOpts()).reconcile();
  await new Epochs(reB, chainOpts()).reconcile();
  const a = reA.epoch(e1.id)!;
  const b = reB.epoch(e2.id)!;
  assert.equal(a.status, 'settled');
  assert.equal(b.status, 'settled');
  assert.equal(b.tx_hash, sent.txHashes.at(-1), 'the hash of the earlier transaction is found on chain');
  // (b) paid nothing more; (a) paid its split once
  const after = await Promise.all(miners.map(staked));
  for (const [i, m] of miners.entries()) {
    const owed = BigInt(reA.epochRewards(e1.id).find((r) => r.miner === m)!.amount);
    assert.equal(after[i] - before[i], owed, `miner ${i}`);
  }
  // reconciling again (another restart) sends nothing
  await new Epochs(reA, chainOpts()).reconcile();
  assert.deepEqual(await Promise.all(miners.map(staked)), after);
  const history = await rewardHistory(chain.client, miners[0]);
  assert.equal(history.filter((h) => h.epochId === BigInt(a.chain_epoch!)).length, 1);
  assert.notEqual(a.chain_epoch, b.chain_epoch);
  reA.close();
  reB.close();
});

test('GET /epochs, nbcli rewards, a join below the minimum stake gets 403, a miner that unstakes is evicted', async () => {
  const orchDir = join(dir, 'orchestrator'); // where `nbcli orchestrator start --data-dir dir` keeps it
  const db = seed(join(dir, 'seed.sqlite'));
  db.close();
  const { mkdirSync, copyFileSync } = await import('node:fs');
  mkdirSync(orchDir, { recursive: true });
  copyFileSync(join(dir, 'seed.sqlite'), join(orchDir, 'orchestrator.sqlite'));
  const orch = await startOrchestrator({ dataDir: orchDir, chain: chainOpts({ minStake: parseEther('10'), epochRounds: 1, intervalMs: 100, stakeCheckMs: 0 }) });
  try {
    orch.coordinator.db.addRunCounters('r1', { merges: 1 });
    await orch.epochs!.step();
    const list = (await (await fetch(`${orch.url}/epochs`)).json()) as { paid: boolean; epochs: EpochView[] };
    assert.equal(list.paid, true);
    const e = list.epochs[0];
    assert.equal(e.status, 'settled');
    assert.equal(e.rewards.length, 3);
    const one = (await (await fetch(`${orch.url}/epochs/${e.id}`)).json()) as EpochView;
    assert.deepEqual(one, e);
    assert.equal((await fetch(`${orch.url}/epochs/999`)).status, 404);

    // nbcli rewards, from the orchestrator and from the data dir
    const viaUrl = await nbcli(['rewards', '--orchestrator', orch.url, '--json']);
    assert.deepEqual((JSON.parse(viaUrl) as { epochs: EpochView[] }).epochs[0], e);
    const human = await nbcli(['rewards', '--epoch', String(e.id), '--data-dir', dir]);
    assert.match(human, new RegExp(`epoch ${e.id}  settled`));
    for (const r of e.rewards) assert.ok(human.includes(r.miner) && human.includes(r.amount), human);
    assert.ok(human.includes(e.txHash!));

    // the minimum stake: refused with a clear 403, accepted once staked
    const key = generatePrivateKey();
    const account = privateKeyToAccount(key);
    const client = new SignedClient(orch.url, key);
    const join = { name: 'poor', url: 'http://127.0.0.1:9', hardware: { gflops: 1, threads: 1, memoryBytes: 1 << 30 }, bandwidthMbps: 100 };
    await assert.rejects(
      () => client.request('POST', '/miners/join', new TextEncoder().encode(JSON.stringify(join)), 'application/json'),
      (err: unknown) => err instanceof NimbleError && err.status === 403 && /stake too low: .* 0 NIM staked, .* requires 10 NIM/.test(err.message),
    );
    assert.equal(orch.coordinator.db.miner(account.address), undefined);
    await faucet(chain.client, account.address, parseEther('10'));
    await addStake(chain.client, signerFor(chain.client, account), parseEther('10'));
    await client.request('POST', '/miners/join', new TextEncoder().encode(JSON.stringify(join)), 'application/json');
    assert.ok(orch.coordinator.db.miner(account.address));
    const beat = (): Promise<Uint8Array> =>
      client.request('POST', '/miners/heartbeat', new TextEncoder().encode(JSON.stringify({ freeSlots: 0, queue: 0, reports: [] })), 'application/json');
    await beat();

    // the stake is checked while it works, not only at join: unstaking gets it evicted
    await removeStake(chain.client, signerFor(chain.client, account));
    await orch.epochs!.step(); // (a pass already under way may have read the stake before)
    await orch.epochs!.step();
    assert.equal(orch.coordinator.db.miner(account.address)!.alive, 0);
    await assert.rejects(beat, (err: unknown) => err instanceof NimbleError && err.status === 403 && /stake too low/.test(err.message));
  } finally {
    await orch.close();
  }
});

function nbcli(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', join(root, 'src/cli/main.ts'), ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`nbcli ${args.join(' ')}: ${code} ${err}`))));
  });
}
