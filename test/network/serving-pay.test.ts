// A network that only serves inference pays its miners, restarts included
// (docs/inference.md, "Payment"): a real orchestrator on its local anvil
// with no run and no --epoch-minutes, one real miner serving a published
// gpt-micro, a caller with an API key and credit. A completion's charge is
// drawn from the caller's escrow and paid to the miner and the model's owner
// within --pay-within-minutes (6 s here; 10 minutes by default) of being
// made. Then a long streamed generation is cut short by a kill -9 of the
// orchestrator after its first tokens: after the restart it is charged for
// what it had processed (not released for free), its miner's rows are its
// work, and that charge is paid within the same bound.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { CreditClient } from '../../src/api/credit-client.ts';
import type { EpochView } from '../../src/api/schemas.ts';
import { openChain } from '../../src/chain/session.ts';
import { faucet } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'serving-pay';
const PAY_WITHIN_MS = 6_000;

type Payment = EpochView['inferencePayments'][number];

async function paid(): Promise<{ epochs: EpochView[]; payments: Payment[]; total: bigint }> {
  const epochs = await cluster.epochs();
  const payments = epochs.flatMap((e) => e.inferencePayments).filter((p) => p.status === 'paid');
  return { epochs, payments, total: payments.reduce((a, p) => a + BigInt(p.amountWei), 0n) };
}

async function until<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs: number): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown = null;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      last = err; // the orchestrator restarting
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (${String(last)}); orchestrator:\n${cluster.orchestrator?.lines.slice(-12).join('\n')}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

test('a serving-only network pays every charged token within --pay-within-minutes, a generation cut short by a kill -9 included', { timeout: 180_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  const args = ['--min-stake', '0', '--emission', '1', '--check-rate', '0', '--inference-check-rate', '0', '--pay-within-minutes', String(PAY_WITHIN_MS / 60_000)];
  await cluster.startOrchestrator(args, { chain: true });
  const home = join(cluster.dir, 'orch');
  const aliceKey = generatePrivateKey();
  saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const alice = saveWallet(home, 'alice', aliceKey, PASSWORD, 'light').address as Address;
  const miner = saveWallet(home, 'w-a', generatePrivateKey(), PASSWORD, 'light').address as Address;
  const nbcli = (...a: string[]) => cluster.nbcli([...a, '--orchestrator', cluster.url], home);
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, wholeModelBytes(43, 500));
  const session = await openChain({ dataDir: home });
  try {
    await faucet(session.client, alice, parseEther('2'));
  } finally {
    await session.close();
  }
  await Promise.all([
    cluster.startMiner('a', ['--data-dir', home, '--wallet.name', 'w-a', '--serve', 'inference']),
    nbcli('model', 'publish', '--file', file, '--name', 'served', '--price-per-1k-tokens', '0.01', '--wallet.name', 'dev').then((r) => assert.equal(r.code, 0, r.stderr)),
  ]);
  const [deployed, created, added] = await Promise.all([
    nbcli('model', 'deploy', 'served', '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '30'),
    nbcli('api-key', 'create', '--wallet.name', 'alice'),
    nbcli('credit', 'add', '--amount', '1', '--wallet.name', 'alice'),
  ]);
  assert.equal(deployed.code, 0, deployed.stderr);
  assert.equal(created.code, 0, created.stderr);
  assert.equal(added.code, 0, added.stderr);
  const key = created.out[0].key as string;
  const credits = (): CreditClient => new CreditClient(new OrchestratorClient(cluster.url, { wallet: aliceKey }));
  const complete = (body: Record<string, unknown>): Promise<Response> =>
    fetch(`${cluster.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify({ model: 'served', ...body }) });

  // 1. a completion: its charge is paid to the miner and the owner by an epoch that only the time owed closes
  const res = await complete({ prompt: 'Call me Ishmael. ', max_tokens: 24, temperature: 0, seed: 1 });
  assert.equal(res.status, 200, await res.clone().text());
  const chargedAt = Date.now();
  const spent = BigInt((await credits().balance()).spent);
  assert.ok(spent > 0n);
  const first = await until('the charge to be paid', async () => {
    const p = await paid();
    return p.total === spent && p.epochs.every((e) => e.status !== 'settling') && p;
  }, PAY_WITHIN_MS + 20_000);
  const payingEpoch = first.epochs.find((e) => e.inferencePayments.length > 0)!;
  assert.equal(payingEpoch.runId, null, 'no run closed it');
  assert.ok(Date.now() - chargedAt < PAY_WITHIN_MS + 15_000, `paid ${Date.now() - chargedAt} ms after the charge`);
  assert.ok(first.payments.some((p) => p.role === 'miner' && p.payee.toLowerCase() === miner.toLowerCase()), 'the serving miner is paid');
  const unitsOf = async (): Promise<number> => (await cluster.api.work()).filter((w) => w.miner.toLowerCase() === miner.toLowerCase() && w.kind === 'inference').reduce((a, w) => a + w.units, 0);
  const unitsBefore = await unitsOf();

  // 2. a long streamed generation; the orchestrator is killed after its first tokens
  const stream = await complete({ prompt: 'It is a way I have of driving off the spleen. ', max_tokens: 4096, temperature: 1, seed: 7, stream: true });
  assert.equal(stream.status, 200);
  const reader = stream.body!.getReader();
  let events = 0;
  let text = '';
  while (events < 40) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended after ${events} events: a generation of 4096 tokens should take longer (${text.slice(-200)})`);
    text += new TextDecoder().decode(value);
    events = text.split('data: ').length - 1;
  }
  // the orchestrator writes a generation's progress every 250 ms: go on reading for a second, so that what the
  // 40 events show is written before the kill (a kill within the first 250 ms may lose them: docs/security.md)
  const readUntil = Date.now() + 1_000;
  while (Date.now() < readUntil) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stream ended after ${events} events: a generation of 4096 tokens should take longer (${text.slice(-200)})`);
    text += new TextDecoder().decode(value);
  }
  const orch = cluster.orchestrator!.child;
  orch.kill('SIGKILL');
  await new Promise((r) => orch.once('exit', r));
  void reader.cancel().catch(() => {});
  await cluster.startOrchestrator(args, { chain: true });
  const restartedAt = Date.now();

  // charged for what it had processed: its prompt and the tokens sampled (at least the 40 events seen), never released for free
  const view = await credits().balance();
  assert.equal(view.reserved, '0');
  const cut = BigInt(view.spent) - spent;
  const atLeast = (((parseEther('0.01') * BigInt(40 + 20)) + 999n) / 1000n);
  assert.ok(cut >= atLeast, `the cut generation is charged ${cut} wei, at least ${atLeast} (its prompt and 40 tokens)`);
  assert.ok(cut <= (parseEther('0.01') * BigInt(4096 + 64) + 999n) / 1000n, 'never more than it reserved');
  assert.ok((await unitsOf()) > unitsBefore, "the cut generation's rows are its miner's work");
  // and paid within the same bound after the restart
  await until('the cut generation to be paid', async () => {
    const p = await paid();
    return p.total === BigInt(view.spent) && p.epochs.every((e) => e.status !== 'settling') && p;
  }, PAY_WITHIN_MS + 20_000);
  assert.ok(Date.now() - restartedAt < PAY_WITHIN_MS + 15_000);
});
