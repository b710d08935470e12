// Paying for jobs end to end: a real orchestrator process on its local anvil,
// a real miner, and nbcli processes of a developer with a wallet. A developer
// without the NIM is refused before anything runs; a job's budget is escrowed
// on JobEscrow by `nbcli job submit`, its miner is paid from it every epoch,
// the orchestrator is killed (-9) mid-job and restarted, and when the job
// ends the rest is refunded: NIM is conserved (the developer's balance, the
// escrow's payments and refund, the miner's stake, the contract's holdings).
// A job whose budget runs out is stopped. Escrows that are someone else's,
// already used, of another amount, or missing are refused; keeping
// checkpoints longer is paid by a transfer that cannot be used twice.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parseEther, type Address, type Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import type { JobView } from '../../src/api/jobs.ts';
import { signerFor, type ChainClient } from '../../src/chain/client.ts';
import { escrowTotalHeld, jobEarnings, openEscrow, readEscrow } from '../../src/chain/escrow.ts';
import { openChain } from '../../src/chain/session.ts';
import { readStake } from '../../src/chain/staking.ts';
import { faucet, nimBalance, transferNim } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import type { JobSpec } from '../../src/jobs/spec.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
const PASSWORD = 'escrow-test';
const ARGS = ['--min-stake', '0', '--epoch-rounds', '1', '--emission', '10', '--check-rate', '0', '--price', '1000000', '--miner-timeout-ms', '4000'];
const devKey = generatePrivateKey();
const eveKey = generatePrivateKey();
const dev = privateKeyToAccount(devKey).address;
let home: string;
let miner: Address;
let jobs: JobClient;

const spec = (name: string, budget: string, steps = 40): JobSpec => ({ name, model: 'gpt-micro', data: 'moby-dick', training: { steps, batchSize: 4, mergeEvery: 5 }, checkpointEvery: 20, budget });

async function onChain<T>(fn: (client: ChainClient) => Promise<T>): Promise<T> {
  const session = await openChain({ dataDir: home });
  try {
    return await fn(session.client);
  } finally {
    await session.close();
  }
}

async function waitJob(id: string, pred: (j: JobView) => boolean, timeoutMs = 120_000): Promise<JobView> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const j = await jobs.get(id).catch(() => undefined); // undefined while the orchestrator restarts
    if (j && pred(j)) return j;
    if (Date.now() > end) throw new Error(`job ${id} did not get there: ${JSON.stringify(j)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);

before(async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(ARGS, { chain: true });
  home = join(cluster.dir, 'orch');
  saveWallet(home, 'dev', devKey, PASSWORD, 'light');
  miner = saveWallet(join(cluster.dir, 'a'), 'w-a', generatePrivateKey(), PASSWORD, 'light').address as Address;
  await cluster.startMiner('a', ['--wallet.name', 'w-a']);
  jobs = new JobClient(new OrchestratorClient(cluster.url, { wallet: devKey }));
});
after(() => cluster.stopGracefully());

test('a developer without the NIM is refused before anything runs; with it, the budget is escrowed, paid to the miner per epoch across a kill -9, and the rest refunded: NIM is conserved', { timeout: 240_000 }, async () => {
  const file = join(cluster.dir, 'paid.json');
  writeFileSync(file, JSON.stringify(spec('paid', '1')));
  const poor = await nbcli('job', 'submit', file, '--wallet.name', 'dev');
  assert.equal(poor.code, 1);
  assert.match(poor.stderr, /not enough NIM to escrow job 0x[0-9a-f]{64}: 1 NIM needed, 0 NIM free in 0x[0-9a-fA-F]{40} \(1 NIM short\)/);
  assert.deepEqual(await jobs.list(dev), [], 'nothing was recorded');

  const start = parseEther('5');
  await onChain((client) => faucet(client, dev, start));
  const submitted = await nbcli('job', 'submit', file, '--wallet.name', 'dev');
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;
  const job = await jobs.get(id);
  assert.equal(job.payment?.budget, parseEther('1').toString());
  const escrowId = job.payment!.escrowId as Hex;
  assert.equal((await onChain((c) => readEscrow(c, escrowId)))?.amount, parseEther('1'), 'the budget is on chain');

  // kill -9 once an epoch has paid the miner from the escrow
  await waitJob(id, (j) => BigInt(j.payment?.committed ?? '0') > 0n);
  const orch = cluster.orchestrator!.child;
  orch.kill('SIGKILL');
  await new Promise((r) => orch.once('exit', r));
  await cluster.startOrchestrator(ARGS, { chain: true });

  const done = await waitJob(id, (j) => j.status === 'completed' && j.payment?.status === 'closed', 180_000);
  assert.equal(done.step, 40);
  const { escrow, held, devBalance, earned, stake } = await onChain(async (c) => ({
    escrow: (await readEscrow(c, escrowId))!,
    held: await escrowTotalHeld(c),
    devBalance: await nimBalance(c, dev),
    earned: (await jobEarnings(c, miner)).filter((e) => e.jobId === escrowId),
    stake: await readStake(c, miner),
  }));
  assert.ok(escrow.closed);
  assert.ok(escrow.paid > 0n && escrow.paid < escrow.amount, `paid ${escrow.paid}`);
  assert.equal(escrow.paid + escrow.refunded, escrow.amount, 'what was not paid was refunded');
  assert.equal(BigInt(done.payment!.committed), escrow.paid, "the orchestrator's record is the chain's");
  assert.equal(BigInt(done.payment!.refunded!), escrow.refunded);
  assert.equal(held, 0n, 'the contract holds nothing for closed escrows');
  assert.equal(devBalance, start - escrow.paid, "the developer's NIM: what it had, less what its miners were paid");
  const byEpoch = earned.map((e) => e.epoch.toString());
  assert.equal(new Set(byEpoch).size, byEpoch.length, 'each epoch paid once');
  assert.equal(earned.reduce((a, e) => a + e.amount, 0n), escrow.paid, 'every NIM paid went to the miner');
  const rewards = (await cluster.epochs()).filter((e: EpochView) => e.status === 'settled').flatMap((e) => e.rewards).filter((r) => r.miner === miner);
  assert.equal(stake.staked, rewards.reduce((a, r) => a + BigInt(r.amountWei), 0n) + escrow.paid, "the miner's stake: the emission's rewards plus the job's payments");
  // the job's payments can be seen from its status
  const status = await nbcli('job', 'status', id);
  assert.equal(status.code, 0, status.stderr);
});

test('a job whose budget runs out is stopped, its checkpoint kept and its escrow emptied, never overdrawn', { timeout: 180_000 }, async () => {
  const file = join(cluster.dir, 'small.json');
  writeFileSync(file, JSON.stringify(spec('small', '0.05', 400)));
  const submitted = await nbcli('job', 'submit', file, '--wallet.name', 'dev');
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.out.find((o) => o.event === 'submitted')!.id as string;
  const done = await waitJob(id, (j) => j.status === 'failed' && j.payment?.status === 'closed', 150_000);
  const ended = (await jobs.events(id)).find((e) => e.kind === 'status' && e.status === 'failed');
  assert.match(ended?.message ?? '', /its budget of 0\.05 NIM is spent, at step \d+ of 400; its last checkpoint is kept/);
  assert.ok(done.checkpoints.length >= 1, 'its last checkpoint is kept');
  assert.ok(done.step < 400);
  assert.ok(done.payment!.spent);
  const escrow = (await onChain((c) => readEscrow(c, done.payment!.escrowId as Hex)))!;
  assert.equal(escrow.paid, parseEther('0.05'), 'the whole budget, not a wei more');
  assert.equal(escrow.refunded, 0n);
});

test("escrows that are someone else's, used, of another amount or missing are refused; a failed submission's escrow is released to its owner only", { timeout: 120_000 }, async () => {
  const s = spec('attack', '0.5');
  const eve = new JobClient(new OrchestratorClient(cluster.url, { wallet: eveKey }));
  const eveAddress = privateKeyToAccount(eveKey).address;
  const ids = { eve: `0x${'e'.repeat(63)}1` as Hex, wrong: `0x${'d'.repeat(63)}2` as Hex, spare: `0x${'d'.repeat(63)}3` as Hex };
  await onChain(async (c) => {
    await faucet(c, eveAddress, parseEther('1'));
    await faucet(c, dev, parseEther('1'));
    await openEscrow(c, signerFor(c, privateKeyToAccount(eveKey)), ids.eve, parseEther('0.5'));
    await openEscrow(c, signerFor(c, privateKeyToAccount(devKey)), ids.wrong, parseEther('0.25'));
    await openEscrow(c, signerFor(c, privateKeyToAccount(devKey)), ids.spare, parseEther('0.5'));
  });
  const refused = async (p: Promise<unknown>, status: number, message: RegExp): Promise<void> => {
    const err = await p.then(() => null, (e: unknown) => e);
    assert.ok(err instanceof NimbleError, `expected a refusal, got ${String(err)}`);
    assert.equal(err.status, status, err.message);
    assert.match(err.message, message);
  };
  await refused(jobs.submit(s), 402, /this network is paid: escrow the job's budget of 0\.5 NIM on JobEscrow 0x[0-9a-fA-F]{40}/);
  await refused(jobs.submit(s, ids.eve), 403, /is 0x[0-9a-fA-F]{40}'s, not/);
  await refused(jobs.submit(s, ids.wrong), 400, /holds 0\.25 NIM; the job's budget is 0\.5 NIM/);
  await refused(jobs.submit(s, `0x${'9'.repeat(64)}`), 402, /no escrow 0x9{64}/);
  const [paid] = await jobs.list(dev);
  await refused(jobs.submit(s, paid.payment!.escrowId), 409, /already pays for job/);
  assert.equal((await jobs.list(dev)).filter((j) => j.name === 'attack').length, 0, 'no job was recorded');

  // a spare escrow goes back to its owner only; one that pays for a job is never released
  await refused(eve.release(ids.spare), 403, /not 0x/);
  await refused(jobs.release(paid.payment!.escrowId), 409, /pays for job/);
  const before = await onChain((c) => nimBalance(c, dev));
  const back = await jobs.release(ids.spare);
  assert.equal(back.refunded, parseEther('0.5').toString());
  assert.equal(await onChain((c) => nimBalance(c, dev)), before + parseEther('0.5'));
  await refused(jobs.submit(s, ids.spare), 409, /is closed/);

  // keeping an ended job's checkpoints longer is quoted, paid by a transfer to the orchestrator, once
  const days = 30;
  const quote = await jobs.keepQuote(paid.id, days);
  assert.ok(BigInt(quote.price) > 0n && quote.payee, JSON.stringify(quote));
  await refused(jobs.keep(paid.id, days), 402, /costs [0-9.]+ NIM: transfer it to 0x/);
  const short = await onChain((c) => transferNim(c, signerFor(c, privateKeyToAccount(devKey)), quote.payee as Address, BigInt(quote.price) - 1n));
  await refused(jobs.keep(paid.id, days, short.hash), 402, /moved .* NIM from .*; keeping these checkpoints costs/);
  const tx = await onChain((c) => transferNim(c, signerFor(c, privateKeyToAccount(devKey)), quote.payee as Address, BigInt(quote.price)));
  const kept = await jobs.keep(paid.id, days, tx.hash);
  assert.ok(kept.every((cp) => cp.expiresAt === quote.until));
  await refused(jobs.keep(paid.id, days + 1, tx.hash), 409, /has paid for a keep already/);
  await refused(eve.keep(paid.id, days + 1), 403, /is not 0x/);
});

test("a completed job's checkpoint is published with nbcli model publish --job by its owner only, and downloads verified against the chain", { timeout: 120_000 }, async () => {
  const [paid] = (await jobs.list(dev)).filter((j) => j.name === 'paid' && j.status === 'completed');
  assert.ok(paid, 'the paid job of the first test');
  saveWallet(home, 'eve', eveKey, PASSWORD, 'light');
  const stolen = await nbcli('model', 'publish', '--job', paid.id, '--name', 'not-eves', '--wallet.name', 'eve');
  assert.equal(stolen.code, 1);
  assert.match(stolen.stderr, /not .*'s|owner/i);

  const step = paid.checkpoints[0].step;
  const published = await nbcli('model', 'publish', '--job', paid.id, '--step', String(step), '--name', 'paid-micro', '--wallet.name', 'dev', '--price-per-1k-tokens', '0.25');
  assert.equal(published.code, 0, published.stderr);
  const p = published.out.find((o) => o.event === 'published')!;
  assert.equal(p.jobId, paid.id);
  assert.equal(p.step, step);
  assert.equal(p.owner, dev);
  assert.equal(p.sha256, paid.checkpoints[0].sha256, "the published bytes are the job's checkpoint");

  const out = join(cluster.dir, 'paid-micro.safetensors');
  const downloaded = await nbcli('model', 'download', 'paid-micro', '--out', out);
  assert.equal(downloaded.code, 0, downloaded.stderr);
  assert.equal(createHash('sha256').update(readFileSync(out)).digest('hex'), p.sha256);
  const shown = await nbcli('model', 'show', 'paid-micro');
  assert.equal(shown.code, 0, shown.stderr);
  assert.equal((shown.out[0].stored as Record<string, unknown>).jobId, paid.id);
});
