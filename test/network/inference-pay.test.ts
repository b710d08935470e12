// Paying for inference end to end (docs/inference.md, "Payment"): a real
// orchestrator on its local anvil, one real miner serving a published
// gpt-micro priced at 0.5 NIM per 1,000 tokens, nbcli processes for the
// model's owner and a caller. The caller makes an API key and adds credit
// (an escrow on JobEscrow); the official `openai` client generates with the
// key and the balance goes down by exactly the price of the tokens; a caller
// without credit gets 402, a wrong or revoked key 401; another wallet's
// escrow, or one used twice, is refused. Once the epochs settle, the miner's
// stake grew by its emission and its 80 % of what was paid, the owner's by
// the rest, `nbcli rewards` and the dashboard's Rewards page (headless
// Chromium) show them, the operator undeploys and deploys the model from the
// Models page, and after the caller withdraws the rest comes back: NIM is
// conserved.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import chromium from '@sparticuz/chromium';
import { chromiumExecutablePath } from '../../src/engine/webgpu/chromium-unpack.ts';
import OpenAI from 'openai';
import pw, { type Browser } from 'playwright-core';
import { formatEther, parseEther, type Address, type Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { CreditClient } from '../../src/api/credit-client.ts';
import type { DeploymentView } from '../../src/api/deployments.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import { signerFor, type ChainClient } from '../../src/chain/client.ts';
import { escrowTotalHeld, openEscrow } from '../../src/chain/escrow.ts';
import { openChain } from '../../src/chain/session.ts';
import { readStake } from '../../src/chain/staking.ts';
import { faucet, nimBalance } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { NimbleError } from '../../src/protocol/errors.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'pay-test';
const PRICE = parseEther('0.5'); // per 1,000 tokens

async function onChain<T>(home: string, fn: (client: ChainClient) => Promise<T>): Promise<T> {
  const session = await openChain({ dataDir: home });
  try {
    return await fn(session.client);
  } finally {
    await session.close();
  }
}

async function refused(p: Promise<unknown>, status: number, code: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    const err = e as { status?: number; code?: string; message: string };
    assert.equal(err.status, status, err.message);
    assert.match(String(err.code), code, err.message);
    return true;
  });
}

test('a caller pays per token from its credit with an API key; miners and the model owner are paid at the epoch, as the dashboard shows; NIM is conserved', { timeout: 90_000 }, async () => {
  const launching = chromiumExecutablePath(chromium).then((executablePath) => pw.chromium.launch({ executablePath, args: chromium.args, headless: true }));
  after(() => launching.then((b) => b.close()));
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--emission', '1', '--epoch-minutes', '0.02', '--check-rate', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const devKey = generatePrivateKey();
  const aliceKey = generatePrivateKey();
  const owner = saveWallet(home, 'dev', devKey, PASSWORD, 'light').address as Address;
  const alice = saveWallet(home, 'alice', aliceKey, PASSWORD, 'light').address as Address;
  const miner = saveWallet(home, 'w-a', generatePrivateKey(), PASSWORD, 'light').address as Address;
  const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, wholeModelBytes(41, 500));
  await Promise.all([
    cluster.startMiner('a', ['--data-dir', home, '--wallet.name', 'w-a', '--serve', 'inference']),
    nbcli('model', 'publish', '--file', file, '--name', 'paid-micro', '--price-per-1k-tokens', '0.5', '--wallet.name', 'dev').then((r) => assert.equal(r.code, 0, r.stderr)),
    onChain(home, (c) => faucet(c, alice, parseEther('2'))),
  ]);
  const [deployed, created, added] = await Promise.all([
    nbcli('model', 'deploy', 'paid-micro', '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '30'),
    nbcli('api-key', 'create', '--name', 'laptop', '--wallet.name', 'alice'),
    nbcli('credit', 'add', '--amount', '1', '--wallet.name', 'alice'),
  ]);
  assert.equal(deployed.code, 0, deployed.stderr);
  assert.equal(created.code, 0, created.stderr);
  assert.equal(added.code, 0, added.stderr);
  const key = created.out[0].key as string;
  const escrowId = added.out[0].escrowId as Hex;
  const credits = new CreditClient(new OrchestratorClient(cluster.url, { wallet: aliceKey }));
  assert.equal((await credits.balance()).balance, parseEther('1').toString());

  // the official client with the key: the balance goes down by the price of the tokens, exactly
  const openai = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: key, maxRetries: 0 });
  const out = await openai.completions.create({ model: 'paid-micro', prompt: 'Call me Ishmael. ', max_tokens: 24, temperature: 0, seed: 1 });
  const tokens = out.usage!.prompt_tokens + out.usage!.completion_tokens;
  const cost = (PRICE * BigInt(tokens) + 999n) / 1000n;
  let view = await credits.balance();
  assert.equal(BigInt(view.balance), parseEther('1') - cost);
  assert.equal(view.spent, cost.toString());
  assert.equal(view.reserved, '0');

  // refusals: a wrong key, no key, a revoked key (401); no credit (402)
  await refused(new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: `nk-${'0'.repeat(48)}`, maxRetries: 0 }).completions.create({ model: 'paid-micro', prompt: 'x' }), 401, /invalid_api_key/);
  const bare = await fetch(`${cluster.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'paid-micro', prompt: 'x' }) });
  assert.equal(bare.status, 401);
  assert.equal(((await bare.json()) as { error: { code: string } }).error.code, 'invalid_api_key');
  const second = await credits.createKey('spare');
  await credits.revokeKey(second.apiKey.id);
  await refused(new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: second.key, maxRetries: 0 }).completions.create({ model: 'paid-micro', prompt: 'x' }), 401, /invalid_api_key/);
  const bobKey = generatePrivateKey();
  const bob = new CreditClient(new OrchestratorClient(cluster.url, { wallet: bobKey }));
  const bobApi = new OpenAI({ baseURL: `${cluster.url}/v1`, apiKey: (await bob.createKey()).key, maxRetries: 0 });
  await refused(bobApi.completions.create({ model: 'paid-micro', prompt: 'hello', max_tokens: 10 }), 402, /insufficient_quota/);
  // attacks on credit: someone else's escrow, an escrow used twice, another wallet's key
  const bobEscrow = `0x${'b0'.repeat(32)}` as Hex;
  await onChain(home, async (c) => {
    await faucet(c, privateKeyToAccount(bobKey).address, parseEther('1'));
    await openEscrow(c, signerFor(c, privateKeyToAccount(bobKey)), bobEscrow, parseEther('0.001'));
  });
  await refused(credits.add(bobEscrow), 403, /forbidden/);
  await bob.add(bobEscrow);
  await refused(bob.add(bobEscrow), 409, /conflict/);
  await refused(bob.add(escrowId), 409, /conflict/);
  await refused(credits.add(escrowId), 409, /conflict/);
  await refused(bob.revokeKey(second.apiKey.id), 404, /not_found/);
  await refused(bobApi.completions.create({ model: 'paid-micro', prompt: 'hello', max_tokens: 10 }), 402, /insufficient_quota/); // 0.0075 NIM > 0.001

  // the epochs pay what was charged: 80 % to the miner, the rest to the owner, as stake
  const deadline = Date.now() + 20_000;
  let epochs: EpochView[] = [];
  const paidTo = (role: string): bigint => epochs.flatMap((e) => e.inferencePayments).filter((p) => p.role === role && p.status === 'paid').reduce((a, p) => a + BigInt(p.amountWei), 0n);
  while (paidTo('miner') + paidTo('owner') < cost || epochs.some((e) => e.status === 'settling')) {
    if (Date.now() > deadline) throw new Error(`not paid: ${JSON.stringify(epochs.map((e) => [e.id, e.status, e.inferencePayments]))}`);
    await new Promise((r) => setTimeout(r, 300));
    epochs = await cluster.epochs();
  }
  assert.equal(paidTo('miner') + paidTo('owner'), cost, 'exactly what was charged');
  assert.ok(paidTo('miner') <= (cost * 8000n) / 10_000n && (cost * 8000n) / 10_000n - paidTo('miner') < 2n, `the miner's 80 %: ${paidTo('miner')} of ${cost}`);
  const emission = epochs.flatMap((e) => (e.status === 'settled' ? e.rewards : [])).filter((r) => r.miner.toLowerCase() === miner.toLowerCase()).reduce((a, r) => a + BigInt(r.amountWei), 0n);
  assert.ok(emission > 0n, 'inference earns emission');
  const rewards = await nbcli('rewards');
  assert.equal(rewards.code, 0, rewards.stderr);
  const listed = (rewards.out[0] as { epochs: EpochView[] }).epochs.flatMap((e) => e.rewards).filter((r) => r.miner.toLowerCase() === miner.toLowerCase());
  assert.ok(listed.reduce((a, r) => a + (r.units.inference ?? 0), 0) > 0, 'nbcli rewards shows the inference units');
  await dashboardOnAPaidNetwork(await launching, epochs, owner, miner);

  // withdrawing closes the escrow and refunds the rest; NIM is conserved
  await credits.withdraw();
  for (;;) {
    view = await credits.balance();
    if (view.escrows.every((e) => e.status === 'closed')) break;
    if (Date.now() > deadline + 10_000) throw new NimbleError('timeout', `not closed: ${JSON.stringify(view)}`);
    await new Promise((r) => setTimeout(r, 300));
  }
  assert.equal(view.escrows[0].refunded, (parseEther('1') - cost).toString());
  await onChain(home, async (c) => {
    assert.equal(await nimBalance(c, alice), parseEther('2') - cost);
    assert.equal((await readStake(c, owner)).staked, paidTo('owner'));
    assert.equal((await readStake(c, miner)).staked, emission + paidTo('miner'));
    assert.equal(await escrowTotalHeld(c), parseEther('0.001'), "only bob's escrow is held");
  });
});

/**
 * The dashboard of this paid network, as the operator: the Rewards page shows
 * each paid epoch's split and inference payments at the API's exact amounts
 * (in the tooltips); the Models page undeploys the model and deploys it again
 * for its owner; the job form refuses a spec with a budget (an operator's job
 * is paid from no escrow).
 */
async function dashboardOnAPaidNetwork(browser: Browser, epochs: EpochView[], owner: Address, miner: Address): Promise<void> {
  const page = await (await browser.newContext({ locale: 'en-US' })).newPage();
  const message = (): Promise<string> => page.evaluate(() => document.querySelector('#message')?.textContent ?? '');
  await page.goto(cluster.loginUrl);
  await page.goto(`${cluster.url}/#/rewards`);
  await page.waitForFunction(() => /^paid on chain/.test(document.querySelector('.summary')?.textContent ?? ''), null, { timeout: 10_000 });
  for (const e of epochs.filter((x) => x.inferencePayments.length)) {
    await page.waitForSelector(`[data-epoch="${e.id}"]`, { timeout: 10_000 });
    const titles = await page.$$eval(`[data-epoch="${e.id}"] span[title]`, (els) => els.map((el) => el.getAttribute('title')));
    for (const p of e.inferencePayments) assert.ok(titles.includes(`${p.amount} NIM`), `epoch ${e.id}: ${p.role} ${p.amount} NIM in ${JSON.stringify(titles)}`);
    for (const r of e.rewards) assert.ok(titles.includes(`${r.amount} NIM (${r.amountWei} wei)`), `epoch ${e.id}: ${r.miner}'s ${r.amount} NIM`);
    const roles = await page.$$eval(`[data-epoch="${e.id}"] tr`, (trs) => trs.map((tr) => tr.querySelectorAll('td')[1]?.textContent));
    assert.ok(roles.includes('miner') && roles.includes('owner'), `the miner's and the owner's shares: ${JSON.stringify(roles)}`);
  }

  // the Network page: the miner's stake as the chain has it (its emission and its share of the payments, all settled)
  await page.goto(`${cluster.url}/#/`);
  const staked = await onChain(join(cluster.dir, 'orch'), async (c) => (await readStake(c, miner)).staked);
  const cell = (await page.waitForFunction(
    (id) => {
      const e = [...document.querySelectorAll('[data-stake]')].find((x) => x.getAttribute('data-stake')?.toLowerCase() === id);
      return e?.getAttribute('data-wei') ? [e.getAttribute('data-wei'), e.getAttribute('title')] : null;
    },
    miner.toLowerCase(),
    { timeout: 15_000 },
  ).then((handle) => handle.jsonValue())) as [string, string];
  assert.equal(cell[0], staked.toString());
  assert.match(cell[1] ?? '', new RegExp(`^${formatEther(staked).replace('.', '\\.')} NIM staked`));

  // the Models page: the operator undeploys the model, then deploys it again; it is still its owner's
  const deployment = async (): Promise<DeploymentView | undefined> => ((await (await fetch(`${cluster.url}/deployments`)).json()) as DeploymentView[]).find((d) => d.name === 'paid-micro' && d.status !== 'undeployed');
  await page.goto(`${cluster.url}/#/models`);
  // its listing on the ModelRegistry as the chain has it: the price its owner set
  await page.waitForSelector('[data-price]', { timeout: 15_000 });
  assert.equal(await page.getAttribute('[data-price]', 'data-price'), PRICE.toString());
  assert.equal(await page.textContent('[data-price]'), '0.5 NIM');
  await page.click('button[data-action="undeploy"][data-model="paid-micro"]');
  await page.waitForSelector('button[data-action="deploy"][data-model="paid-micro"]:not([disabled])', { timeout: 10_000 });
  assert.equal(await deployment(), undefined);
  assert.match(await message(), /^paid-micro: undeployed/);
  await page.click('button[data-action="deploy"][data-model="paid-micro"]');
  const deadline = Date.now() + 30_000;
  let again = await deployment();
  while (again?.status !== 'serving') {
    if (Date.now() > deadline) throw new Error(`not serving again: ${JSON.stringify(again)} ${await message()}`);
    await new Promise((r) => setTimeout(r, 300));
    again = await deployment();
  }
  assert.equal(again.owner.toLowerCase(), owner.toLowerCase(), "deployed by the operator, still its owner's");

  // the job form: an operator's job pays from no escrow, so a budget is refused with the reason
  await page.goto(`${cluster.url}/#/runs`);
  await page.click('#job-form summary');
  await page.fill('#job-spec', JSON.stringify({ name: 'budgeted', model: 'gpt-micro', data: 'moby-dick', training: { steps: 10 }, budget: '1' }));
  await page.click('#job-submit');
  await page.waitForFunction(() => /refused \(400\): a job submitted from the dashboard is the operator's and pays nothing/.test(document.querySelector('#message')?.textContent ?? ''), null, { timeout: 5_000 }).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await message()}`);
  });
  await page.context().close();
}
