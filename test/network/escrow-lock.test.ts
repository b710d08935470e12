// An escrow that pays for work is not its owner's to take back while it does
// (issue 33, "Money"), end to end: a real orchestrator process on its local
// anvil (JobEscrow deployed with a 2-day refund delay and a 3-day lock, the
// chain's clock moved on by hand), a real miner, nbcli processes of a
// developer. A job's timeout is bounded and an escrow whose refund time comes
// too soon is refused; the attack (past the escrow's refund time, after the
// miners worked, the owner closes it for a full refund) fails on chain and
// through `nbcli job refund`, and the work goes on being paid; inference
// credit is locked the same way and `nbcli credit withdraw` still refunds
// it; a payment the chain refuses backs off (a handful of tries in 20 s, not
// one every 500 ms) and is reported in the job's view and events; an
// orchestrator that vanished leaves a lock that lapses by itself, after
// which the owner gets the rest back with `nbcli job refund`, and the
// restarted orchestrator stops the job and says what was left unpaid.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parseEther, type Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { CreditClient } from '../../src/api/credit-client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { jobEscrowAbi } from '../../src/chain/abis.ts';
import { signerFor, type ChainClient } from '../../src/chain/client.ts';
import { ORCHESTRATOR_ROLE } from '../../src/chain/deploy.ts';
import { chainTime, closeEscrow, escrowAddress, openEscrow, readEscrow, type JobEscrowState } from '../../src/chain/escrow.ts';
import { rpc, RPC_ANY } from '../../src/chain/anvil.ts';
import { localOperatorAccount, openChain } from '../../src/chain/session.ts';
import { faucet, nimBalance } from '../../src/chain/token.ts';
import { ChainTxError, sendContractTx } from '../../src/chain/tx.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { advanceTime } from '../chain/helpers.ts';
import { Cluster } from './helpers.ts';

const DAY = 86_400;
const REFUND_DELAY = 2 * DAY;
const LOCK = 3 * DAY;
const cluster = new Cluster();
const PASSWORD = 'escrow-lock-test';
const ARGS = ['--min-stake', '0', '--epoch-rounds', '1', '--emission', '10', '--check-rate', '0', '--price', '100', '--miner-timeout-ms', '4000'];
const devKey = generatePrivateKey();
const dev = privateKeyToAccount(devKey).address;
let home: string;
let jobs: JobClient;
/** the long job the attack, the backoff and the vanished orchestrator are tried on */
let long: { id: string; escrowId: Hex };

const spec = (name: string, extra: Partial<JobSpec> = {}): JobSpec => ({
  name,
  model: 'gpt-micro',
  data: 'moby-dick',
  training: { steps: 200_000, batchSize: 4, mergeEvery: 5 },
  limits: { timeout: '1h' },
  budget: '1',
  ...extra,
});

async function onChain<T>(fn: (client: ChainClient) => Promise<T>): Promise<T> {
  const session = await openChain({ dataDir: home });
  try {
    return await fn(session.client);
  } finally {
    await session.close();
  }
}

async function until<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 90_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

const waitJob = (id: string, pred: (j: JobView) => boolean, timeoutMs = 90_000): Promise<JobView> =>
  until(`job ${id}`, async () => {
    const j = await jobs.get(id);
    return pred(j) ? j : undefined;
  }, timeoutMs);

const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);
/** nbcli job refund: on chain only, no orchestrator */
const refund = (escrowId: string) => cluster.nbcli(['job', 'refund', escrowId, '--wallet.name', 'dev'], home);

async function refused(p: Promise<unknown>, status: number, message: RegExp): Promise<void> {
  const err = await p.then(() => null, (e: unknown) => e);
  assert.ok(err instanceof NimbleError, `expected a refusal, got ${String(err)}`);
  assert.equal(err.status, status, err.message);
  assert.match(err.message, message);
}

const setRole = (fn: 'grantRole' | 'revokeRole'): Promise<unknown> =>
  onChain((c) => sendContractTx(c, signerFor(c, localOperatorAccount()), { address: escrowAddress(c), abi: jobEscrowAbi, functionName: fn, args: [ORCHESTRATOR_ROLE, c.deployment.orchestrator] }));

before(async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  process.env.NIMBLE_ESCROW_REFUND_DELAY = String(REFUND_DELAY);
  process.env.NIMBLE_ESCROW_LOCK_SECONDS = String(LOCK);
  await cluster.startOrchestrator(ARGS, { chain: true });
  home = join(cluster.dir, 'orch');
  saveWallet(home, 'dev', devKey, PASSWORD, 'light');
  saveWallet(join(cluster.dir, 'a'), 'w-a', generatePrivateKey(), PASSWORD, 'light');
  await cluster.startMiner('a', ['--wallet.name', 'w-a']);
  jobs = new JobClient(new OrchestratorClient(cluster.url, { wallet: devKey }));
  await onChain((c) => faucet(c, dev, parseEther('20')));
});
after(() => cluster.stopGracefully());

test("a job's timeout is bounded, and an escrow whose refund time comes before the job's timeout plus a day is refused, nothing locked", { timeout: 120_000 }, async () => {
  const file = join(cluster.dir, 'forever.json');
  writeFileSync(file, JSON.stringify(spec('forever', { limits: { timeout: '30d' } })));
  const before = await onChain((c) => nimBalance(c, dev));
  const forever = await nbcli('job', 'submit', file, '--wallet.name', 'dev');
  assert.equal(forever.code, 1);
  assert.match(forever.stderr, /limits\/timeout: at most 7d .*got "30d"/);
  assert.equal(await onChain((c) => nimBalance(c, dev)), before, 'nothing was escrowed');

  // an escrow opened long ago: its owner could close it alone before the job and its settlement are over
  const old = `0x${'0a'.repeat(32)}` as Hex;
  await onChain(async (c) => {
    await openEscrow(c, signerFor(c, privateKeyToAccount(devKey)), old, parseEther('1'));
    await advanceTime(c, REFUND_DELAY - 12 * 3600);
  });
  await refused(jobs.submit(spec('late'), old), 400, /can be refunded to its owner from .*; a job with a timeout of 1h needs its escrow held until .* \(its timeout plus 1d to settle\)/);
  assert.equal((await jobs.list(dev)).length, 0, 'no job was recorded');
  assert.equal((await onChain((c) => readEscrow(c, old)))?.lockedUntil, 0, 'not locked');
  const back = await jobs.release(old);
  assert.equal(back.refunded, parseEther('1').toString());
});

test('inference credit is locked on chain: its owner cannot take it back alone past its refund time, and nbcli credit withdraw still refunds it', { timeout: 120_000 }, async () => {
  const added = await nbcli('credit', 'add', '--amount', '2', '--wallet.name', 'dev');
  assert.equal(added.code, 0, added.stderr);
  const escrowId = added.out[0].escrowId as Hex;
  const e = (await onChain((c) => readEscrow(c, escrowId)))!;
  assert.ok(e.lockedUntil >= e.refundAfter, `locked until ${e.lockedUntil}, refundable from ${e.refundAfter}`);
  const view = await new CreditClient(new OrchestratorClient(cluster.url, { wallet: devKey })).balance();
  assert.equal(view.escrows[0].lockedUntil, e.lockedUntil * 1000, 'the lock is in the credit view');

  await onChain(async (c) => advanceTime(c, e.refundAfter - (await chainTime(c)) + 60));
  const taken = await refund(escrowId);
  assert.equal(taken.code, 1, 'refused');
  assert.match(taken.stderr, /is locked by the orchestrator until/);
  assert.equal((await onChain((c) => readEscrow(c, escrowId)))?.closed, false);

  const withdrawn = await nbcli('credit', 'withdraw', '--wallet.name', 'dev', '--wait', '60');
  assert.equal(withdrawn.code, 0, withdrawn.stderr);
  const closed = (await onChain((c) => readEscrow(c, escrowId)))!;
  assert.ok(closed.closed);
  assert.equal(closed.refunded, parseEther('2'), 'all of it back: nothing was charged');
});

test('the attack: past its refund time, after its miners worked, the owner closes the escrow of a running job; refused on chain and through nbcli, and the work goes on being paid', { timeout: 240_000 }, async () => {
  const file = join(cluster.dir, 'long.json');
  writeFileSync(file, JSON.stringify(spec('long')));
  const submitted = await nbcli('job', 'submit', file, '--wallet.name', 'dev');
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;
  const job = await jobs.get(id);
  long = { id, escrowId: job.payment!.escrowId as Hex };
  const locked = (await onChain((c) => readEscrow(c, long.escrowId)))!;
  assert.ok(locked.lockedUntil > locked.refundAfter, 'locked past its refund time when it was accepted');
  assert.equal(job.payment!.lockedUntil, locked.lockedUntil * 1000, 'the lock is in the job view');

  // the miners work and are paid
  const paid = await until('a payment from the escrow', async () => {
    const e = await onChain((c) => readEscrow(c, long.escrowId));
    return e && e.paid > 0n ? e : undefined;
  });

  // past the refund time the owner asks for all that is left: refused, on chain and through nbcli
  await onChain(async (c) => advanceTime(c, paid.refundAfter - (await chainTime(c)) + 60));
  const attack = await refund(long.escrowId);
  assert.equal(attack.code, 1, 'nbcli job refund is refused');
  assert.match(attack.stderr, /is locked by the orchestrator until .*it pays for work that runs or is not paid yet/);
  await onChain(async (c) => {
    assert.ok((await chainTime(c)) > paid.refundAfter, 'past its refund time');
    await assert.rejects(closeEscrow(c, signerFor(c, privateKeyToAccount(devKey)), long.escrowId), (err: unknown) => err instanceof ChainTxError && err.errorName === 'EscrowLocked');
  });

  // the orchestrator renews its lock (less than half of it was left) and goes on paying
  const renewed = await until('the lock renewed', async () => {
    const e = await onChain((c) => readEscrow(c, long.escrowId));
    return e && e.lockedUntil > paid.lockedUntil ? e : undefined;
  });
  await until('a later payment', async () => {
    const e = await onChain((c) => readEscrow(c, long.escrowId));
    return e && !e.closed && e.paid > renewed.paid ? e : undefined;
  });
  assert.equal((await jobs.get(long.id)).status, 'executing', 'the job runs on');
});

test('a payment the chain refuses is retried with a growing wait, not every 500 ms, and reported in the job until it goes through', { timeout: 240_000 }, async () => {
  const orch = cluster.orchestrator!;
  await setRole('revokeRole');
  let firstFailure: number;
  let window: string[];
  try {
    const from = orch.lines.length;
    const failures = (): string[] => orch.lines.slice(from).filter((l) => /paying epoch \d+ failed \(attempt \d+\)/.test(l));
    await until('a failed payment', async () => (failures().length > 0 ? true : undefined));
    firstFailure = Date.now();
    await new Promise((r) => setTimeout(r, 20_000));
    window = failures();
    const failing = await waitJob(long.id, (j) => j.payment?.failing != null);
    assert.match(failing.payment!.failing!.what, /^epoch \d+$/);
    assert.match(failing.payment!.failing!.error, /AccessControlUnauthorizedAccount/);
    assert.ok(failing.payment!.failing!.retryAt! > Date.now() - 1000, 'a next try is planned');
    const events = await jobs.events(long.id);
    assert.ok(events.some((e) => /paying its miners .* failed \(attempt 1\): .*retried with a growing wait/.test(e.message)), 'the job is told');
  } finally {
    await setRole('grantRole');
  }
  // per payment: tries at 0, 1, 3, 7, 15 s in 20 s (with epochs still closing, a few payments fail at once)
  const byEpoch = new Map<string, number>();
  for (const l of window) {
    const epoch = /paying epoch (\d+)/.exec(l)![1];
    byEpoch.set(epoch, (byEpoch.get(epoch) ?? 0) + 1);
  }
  const first = /paying epoch (\d+)/.exec(window[0])![1];
  assert.ok(byEpoch.get(first)! <= 6, `epoch ${first} tried ${byEpoch.get(first)} times in ${Math.round((Date.now() - firstFailure!) / 1000)} s: ${window.join('\n')}`);
  assert.ok(byEpoch.get(first)! >= 3, `retried: ${window.join('\n')}`);
  assert.match(window.find((l) => l.includes(`epoch ${first} failed (attempt 3)`)) ?? '', /retrying in 4s/);

  // once the chain takes it again, every payment goes through and the job says so
  await waitJob(long.id, (j) => j.payment?.failing === null, 120_000);
  const events = await jobs.events(long.id);
  assert.ok(events.some((e) => new RegExp(`paid [0-9.]+ NIM for epoch ${first} after \\d+ attempts`).test(e.message)), events.map((e) => e.message).join('\n'));
});

test('an orchestrator that vanished: its lock lapses by itself, the owner gets the rest back with nbcli job refund, and the restarted orchestrator stops the job and says what is unpaid', { timeout: 240_000 }, async () => {
  const orch = cluster.orchestrator!.child;
  orch.kill('SIGKILL');
  await new Promise((r) => orch.once('exit', r));

  // this process adopts the node the orchestrator left (a node started again from its state forgets how far its clock was moved)
  const held = await openChain({ dataDir: home, persistent: true });
  let e: JobEscrowState;
  let balance: bigint;
  try {
    e = (await readEscrow(held.client, long.escrowId))!;
    balance = await nimBalance(held.client, dev);
    const early = await refund(long.escrowId);
    assert.equal(early.code, 1, 'still locked');
    assert.match(early.stderr, /is locked by the orchestrator until/);
    // nobody renews it: past its end, the owner closes the escrow alone
    await rpc(held.client.rpcUrl, 'evm_setNextBlockTimestamp', [e.lockedUntil + 60], RPC_ANY);
    await rpc(held.client.rpcUrl, 'evm_mine', [], RPC_ANY);
    const back = await refund(long.escrowId);
    assert.equal(back.code, 0, back.stderr);
    const r = back.out.find((o) => o.event === 'refunded')!;
    assert.equal(BigInt(r.refunded as string), e.amount - e.paid, 'all it had not paid');
    assert.equal(await nimBalance(held.client, dev), balance + e.amount - e.paid);
  } finally {
    await held.close();
  }

  await cluster.startOrchestrator(ARGS, { chain: true });
  const stopped = await waitJob(long.id, (j) => j.status === 'failed' && j.payment?.status === 'closed', 120_000);
  assert.match(stopped.message ?? '', /its escrow 0x[0-9a-f]{64} was closed on chain, nothing pays for more work/);
  assert.equal(stopped.payment!.refunded, (e.amount - e.paid).toString());
  assert.equal(stopped.payment!.lockedUntil, null);
  const told = (await jobs.events(long.id)).find((ev) => /closed on chain by someone other than this orchestrator/.test(ev.message));
  assert.ok(told, 'the job says its escrow was closed behind the orchestrator');
  assert.match(told.message, /NIM of its miners' work .*is unpaid/);
});
