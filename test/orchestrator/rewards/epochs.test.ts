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
import { rewardHistory, settleEpoch } from '../../../src/chain/rewards.ts';
import { addStake, readStake, removeStake, setCooldown, slashStake, stakingTotals } from '../../../src/chain/staking.ts';
import { faucet } from '../../../src/chain/token.ts';
import { signerFor } from '../../../src/chain/client.ts';
import { OrchestratorClient } from '../../../src/api/client.ts';
import type { EpochView } from '../../../src/api/schemas.ts';
import { SignedClient } from '../../../src/http/client.ts';
import { findNetwork } from '../../../src/api/network.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { RequestSigner } from '../../../src/protocol/signing.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { Epochs, type ChainOptions } from '../../../src/orchestrator/rewards/epochs.ts';
import { startOrchestrator } from '../../../src/orchestrator/server.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { displayNim } from '../../../src/chain/nim-display.ts';
import { startTestChain, tempDir, type TestChain } from '../../chain/helpers.ts';
import { nbcliArgv } from '../../helpers/nbcli.ts';

/** nbcli as a child process (the build when fresh: test/helpers/nbcli.ts) */
const [node, ...pre] = nbcliArgv();

const root = fileURLToPath(new URL('../../..', import.meta.url));
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
const chainOpts = (extra: Partial<ChainOptions> = {}): ChainOptions => ({ client: chain.client, signer: chain.operator, emission: parseEther('100'), log: () => {}, local: true, ...extra });

/** A fresh orchestrator state with one 2-stage gpt-micro run and some work. */
function seed(path: string): OrchestratorState {
  const state = OrchestratorState.open(path);
  const options = { lr: 1e-3, codec: 'f16', aggregator: 'mean', minMiners: 2, outerLr: 0.7, outerMomentum: 0.9, requestedStages: 2 } as const;
  state.runs.insert({ id: 'r1', owner: '0xdev', model: 'gpt-micro', data: 'moby-dick', steps: 10, batchSize: 4, mergeEvery: 5, seed: 1, options }, 1);
  state.runs.insertStages('r1', [{ from: 0, to: 2 }, { from: 2, to: 4 }]);
  const work = (minerId: string, kind: 'forward' | 'backward' | 'merge' | 'dropped', stage: number, units = 1): void => state.ledger.logWork({ minerId, runId: 'r1', kind, units, stage }, 2);
  for (let i = 0; i < 6; i++) {
    work(miners[0], 'forward', 0);
    work(miners[0], 'backward', 0);
    work(miners[1], 'forward', 1);
    work(miners[1], 'backward', 1);
  }
  work(miners[1], 'merge', 1, 2);
  work(miners[2], 'forward', 1);
  work(miners[2], 'dropped', 1); // 1 − 3 < 0: gets nothing
  return state;
}

const staked = async (a: Address): Promise<bigint> => (await readStake(chain.client, a)).staked;

test('an epoch closes after a merge round and is paid as stake, in proportion to scores', async () => {
  const db = seed(join(dir, 'a.sqlite'));
  const epochs = new Epochs(db, chainOpts(), () => 3); // the work was logged at 2: far from owed for 10 minutes
  assert.equal(epochs.closeIfDue(), null, 'no merge round yet');
  db.runs.addCounters('r1', { merges: 1 });
  const before = await Promise.all(miners.map(staked));
  const closed = epochs.closeIfDue();
  assert.ok(closed);
  assert.equal(closed.status, 'settling');
  const rewards = db.ledger.rewards(closed.id);
  assert.equal(rewards.length, 3);
  const total = rewards.reduce((a, r) => a + BigInt(r.amount), 0n);
  assert.equal(total + BigInt(closed.remainder!), parseEther('100'));
  assert.equal(rewards.find((r) => r.miner === miners[2])!.amount, '0');
  await epochs.reconcile();
  const e = db.ledger.epoch(closed.id)!;
  assert.equal(e.status, 'settled');
  assert.match(e.txHash!, /^0x[0-9a-f]{64}$/);
  for (const [i, m] of miners.entries()) assert.equal((await staked(m)) - before[i], BigInt(rewards.find((r) => r.miner === m)!.amount));
  // the next epoch starts after it; nothing new, nothing due
  assert.equal(epochs.closeIfDue(), null);
  assert.equal(db.ledger.openEpoch(3).fromLog, e.toLog);
  db.close();
});

test('an epoch that owes work for payWithinMs closes with no merge round, no run end and no --epoch-minutes (a serving-only network pays)', async () => {
  const db = seed(join(dir, 'owed.sqlite')); // work logged at 2, a run that never merges
  db.ledger.logWork({ minerId: miners[0], runId: null, deploymentId: 'dep-1', kind: 'inference', units: 0.5, stage: 0 }, 2);
  const clock = { t: 2 + 59_999 };
  const epochs = new Epochs(db, chainOpts({ payWithinMs: 60_000 }), () => clock.t);
  assert.equal(epochs.closeIfDue(), null, 'owed for less than a minute');
  clock.t++;
  const closed = epochs.closeIfDue();
  assert.ok(closed, 'owed for a minute: closed');
  assert.equal(closed.runId, null);
  assert.equal(closed.toLog, db.ledger.lastWorkId());
  await epochs.reconcile();
  assert.equal(db.ledger.epoch(closed.id)!.status, 'settled');
  // the next epoch owes nothing until new work is logged, then as long again
  clock.t += 3_600_000;
  assert.equal(epochs.closeIfDue(), null);
  db.ledger.logWork({ minerId: miners[1], runId: null, deploymentId: 'dep-1', kind: 'inference', units: 0.5, stage: 0 }, clock.t);
  clock.t += 59_999;
  assert.equal(epochs.closeIfDue(), null);
  clock.t++;
  assert.ok(epochs.closeIfDue());
  assert.throws(() => new Epochs(db, chainOpts({ payWithinMs: 0 })), RangeError);
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
  dbB.ledger.setChainEpoch(e2.id, chainEpoch, chain.client.chainId);
  const sent = await settleEpoch(chain.client, chain.operator, chainEpoch, first.rewardList(e2.id));
  dbB.close();

  const before = await Promise.all(miners.map(staked));
  const reA = OrchestratorState.open(join(dir, 'b.sqlite'));
  const reB = OrchestratorState.open(join(dir, 'c.sqlite'));
  assert.equal(reA.ledger.epoch(e1.id)!.status, 'settling');
  await new Epochs(reA, chainOpts()).reconcile();
  await new Epochs(reB, chainOpts()).reconcile();
  const a = reA.ledger.epoch(e1.id)!;
  const b = reB.ledger.epoch(e2.id)!;
  assert.equal(a.status, 'settled');
  assert.equal(b.status, 'settled');
  assert.equal(b.txHash, sent.txHashes.at(-1), 'the hash of the earlier transaction is found on chain');
  // (b) paid nothing more; (a) paid its split once
  const after = await Promise.all(miners.map(staked));
  for (const [i, m] of miners.entries()) {
    const owed = BigInt(reA.ledger.rewards(e1.id).find((r) => r.miner === m)!.amount);
    assert.equal(after[i] - before[i], owed, `miner ${i}`);
  }
  // reconciling again (another restart) sends nothing
  await new Epochs(reA, chainOpts()).reconcile();
  assert.deepEqual(await Promise.all(miners.map(staked)), after);
  const history = await rewardHistory(chain.client, miners[0]);
  assert.equal(history.filter((h) => h.epochId === BigInt(a.chainEpoch!)).length, 1);
  assert.notEqual(a.chainEpoch, b.chainEpoch);
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
    orch.coordinator.state.runs.addCounters('r1', { merges: 1 });
    await orch.epochs!.step();
    const api = new OrchestratorClient(orch.url);
    const list = await api.epochs();
    assert.equal(list.paid, true);
    const e = list.epochs[0];
    assert.equal(e.status, 'settled');
    assert.equal(e.rewards.length, 3);
    const one = await api.epoch(e.id);
    assert.deepEqual(one, e);
    await assert.rejects(() => api.epoch(999), (err: unknown) => err instanceof NimbleError && err.status === 404 && err.code === 'not_found');

    // nbcli rewards, as JSON and for people
    const viaUrl = await nbcli(['rewards', '--orchestrator', orch.url, '--json']);
    assert.deepEqual((JSON.parse(viaUrl) as { epochs: EpochView[] }).epochs[0], e);
    const human = await nbcli(['rewards', '--epoch', String(e.id), '--orchestrator', orch.url]);
    assert.match(human, new RegExp(`epoch ${e.id}  settled`));
    // amounts for people are rounded (src/chain/nim-display.ts); the JSON above is exact
    for (const r of e.rewards) assert.ok(human.includes(r.miner) && human.includes(displayNim(r.amount)), human);
    assert.ok(human.includes(e.txHash!));

    // the minimum stake: refused with a clear 403, accepted once staked
    const key = generatePrivateKey();
    const account = privateKeyToAccount(key);
    const { domain } = await findNetwork(orch.url);
    const client = new SignedClient(orch.url, new RequestSigner(key, { domain }));
    const session = SessionKey.generate();
    const sessionClient = new SignedClient(orch.url, new RequestSigner({ session, address: account.address }, { domain }));
    const join = { name: 'poor', url: 'http://127.0.0.1:9', hardware: { gflops: 1, threads: 1, memoryBytes: 1 << 30 }, bandwidthMbps: 100, sessionKey: session.publicKey };
    await assert.rejects(
      () => client.request('POST', '/miners/join', new TextEncoder().encode(JSON.stringify(join)), 'application/json'),
      (err: unknown) => err instanceof NimbleError && err.status === 403 && /stake too low: .* 0 NIM staked, .* requires 10 NIM/.test(err.message),
    );
    assert.equal(orch.coordinator.state.miners.get(account.address), undefined);
    await faucet(chain.client, account.address, parseEther('10'));
    await addStake(chain.client, signerFor(chain.client, account), parseEther('10'));
    await client.request('POST', '/miners/join', new TextEncoder().encode(JSON.stringify(join)), 'application/json');
    assert.ok(orch.coordinator.state.miners.get(account.address));
    const beat = (): Promise<Uint8Array> =>
      sessionClient.request('POST', '/miners/heartbeat', new TextEncoder().encode(JSON.stringify({ freeSlots: 0, queue: 0, reports: [] })), 'application/json');
    await beat();

    // the stake is checked while it works, not only at join: unstaking gets it evicted
    await removeStake(chain.client, signerFor(chain.client, account));
    await orch.epochs!.step(); // (a pass already under way may have read the stake before)
    await orch.epochs!.step();
    assert.equal(orch.coordinator.state.miners.get(account.address)!.alive, false);
    await assert.rejects(beat, (err: unknown) => err instanceof NimbleError && err.status === 403 && /stake too low/.test(err.message));
  } finally {
    await orch.close();
  }
});

test('one slash per failed check, its amount from the stake at the offence, sent once; a cooldown shorter than the slash window is raised (local) or refused (remote)', async () => {
  const db = seed(join(dir, 'slash.sqlite'));
  const account = privateKeyToAccount(generatePrivateKey());
  await faucet(chain.client, account.address, parseEther('40'));
  await addStake(chain.client, signerFor(chain.client, account), parseEther('40'));
  const epochs = new Epochs(db, chainOpts());
  db.ledger.putSlash({ epoch: 1, miner: account.address, checkId: 7, fraction: 0.25, reason: 'nimble check 7' });
  db.ledger.putSlash({ epoch: 1, miner: account.address, checkId: 7, fraction: 0.25, reason: 'nimble check 7' }); // the same check again: ignored
  db.ledger.putSlash({ epoch: 1, miner: account.address, checkId: 8, fraction: 0.25, reason: 'nimble check 8' });
  assert.equal(db.ledger.slashes().length, 2);
  await epochs.reconcile();
  const [a, b] = db.ledger.slashes();
  assert.equal(a.status, 'slashed');
  assert.equal(b.status, 'slashed');
  assert.equal(a.amount, parseEther('10').toString(), 'a quarter of 40');
  assert.equal(b.amount, parseEther('7.5').toString(), 'a quarter of the 30 left');
  await epochs.reconcile(); // nothing pending: nothing sent twice
  assert.equal((await readStake(chain.client, account.address)).staked, parseEther('22.5'));

  // a crash after the send, before it was recorded: the Slashed event with that reason is found, not resent
  db.ledger.putSlash({ epoch: 1, miner: account.address, checkId: 9, fraction: 0.5, reason: 'nimble check 9' });
  await slashStake(chain.client, chain.operator, account.address, parseEther('1'), 'nimble check 9');
  await epochs.reconcile();
  const c = db.ledger.slashes().find((x) => x.checkId === 9)!;
  assert.equal(c.status, 'slashed');
  assert.equal(c.amount, parseEther('1').toString());
  assert.equal((await readStake(chain.client, account.address)).staked, parseEther('21.5'));

  const window = 180_000;
  await setCooldown(chain.client, chain.operator, 60n); // (an orchestrator started above raised it already)
  const remote = new Epochs(db, chainOpts({ local: false, intervalMs: 60_000 }), Date.now, window);
  await assert.rejects(() => remote.start(), (err: unknown) => err instanceof NimbleError && err.code === 'conflict' && /cooldown is \d+ s; spot checks need at least 180 s/.test(err.message));
  await remote.stop();
  const local = new Epochs(db, chainOpts({ local: true, intervalMs: 60_000 }), Date.now, window);
  await local.start();
  await local.stop();
  assert.equal((await stakingTotals(chain.client)).cooldown, 180);
  db.close();
});

function nbcli(args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(node, [...pre, ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`nbcli ${args.join(' ')}: ${code} ${err}`))));
  });
}
