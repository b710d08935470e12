// End to end: spot checks of inference catch a serving miner that returns
// wrong activations, and slash it on chain. A real orchestrator on its local
// anvil recomputes every served window (--inference-check-rate 1) and sends
// its own traffic (--synthetic-prompts 4: no outside request is made here);
// a published gpt-micro is deployed on 2 stages, one served by an honest
// miner (a child process), the other by one that adds noise to every answer
// of POST /infer (in this process, through the miner's fault-injection hook
// Tamper.inference). Both stake 40 NIM. The honest miner's windows pass, bit
// for bit, even those whose input came from the cheat; the cheat's fail: it
// is charged 'failed_check' work, evicted (out of serving) and slashed on
// chain, once per failed window; the honest miner keeps its whole stake.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { writeFileSync } from 'node:fs';
import { after, test } from 'node:test';
import Database from 'better-sqlite3';
import { parseEther, type Address } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import type { EpochView } from '../../src/api/schemas.ts';
import { signerFor } from '../../src/chain/client.ts';
import { openChain } from '../../src/chain/session.ts';
import { addStake, readStake } from '../../src/chain/staking.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { chainRegistryLookup } from '../../src/inference/verify.ts';
import { Miner } from '../../src/miner/miner.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { slashedEvents } from '../helpers/chain-events.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
let cheater: Miner | null = null;
after(async () => {
  await cheater?.stop();
  await cluster.stopGracefully();
});

/** The orchestrator's log lines so far. */
const orchestratorLog = (): string => (cluster.orchestrator?.lines ?? []).filter((l) => l.startsWith('stderr: orchestrator: ')).join('\n');

async function until<T>(what: string, probe: () => Promise<T | null> | T | null, timeoutMs = 30_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== null) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; orchestrator log:\n${orchestratorLog().split('\n').slice(-30).join('\n')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test('inference spot checks pass an honest serving miner and slash one that returns noisy activations', { timeout: 120_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'inference-checks-test';
  await cluster.startOrchestrator(['--min-stake', '0', '--inference-check-rate', '1', '--slash-fraction', '0.5', '--synthetic-prompts', '4'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const honestKey = generatePrivateKey();
  const cheatKey = generatePrivateKey();
  const honest = privateKeyToAccount(honestKey).address;
  const cheat = privateKeyToAccount(cheatKey).address;
  saveWallet(home, 'dev', generatePrivateKey(), 'inference-checks-test', 'light');
  saveWallet(home, 'w-honest', honestKey, 'inference-checks-test', 'light');
  const session = await openChain({ dataDir: home });
  try {
    for (const [key, address] of [[honestKey, honest], [cheatKey, cheat]] as const) {
      await faucet(session.client, address, parseEther('100'));
      await ensureGas(session.client, address);
      await addStake(session.client, signerFor(session.client, privateKeyToAccount(key)), parseEther('40'));
    }
    await cluster.startMiner('honest', ['--data-dir', home, '--wallet.name', 'w-honest', '--serve', 'inference']);
    cheater = await Miner.start({
      orchestrator: cluster.url,
      dataDir: join(cluster.dir, 'cheat'),
      name: 'cheat',
      threads: 1,
      privateKey: cheatKey,
      serve: 'inference',
      registryLookup: chainRegistryLookup(home),
      // noise of about 5% on every value it answers with
      tamper: { inference: (out) => out.forEach((v, i) => (out[i] = v * (1 + 0.05 * Math.sin(i * 12.9898)) + 0.01 * Math.cos(i))) },
    });

    const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);
    const file = join(cluster.dir, 'micro.safetensors');
    writeFileSync(file, wholeModelBytes(41, 500));
    assert.equal((await nbcli('model', 'publish', '--file', file, '--name', 'moby-micro', '--wallet.name', 'dev')).code, 0);
    const deployed = await nbcli('model', 'deploy', 'moby-micro', '--stages', '2', '--wallet.name', 'dev', '--wait', '--timeout', '60');
    assert.equal(deployed.code, 0, deployed.stderr);

    // the synthetic traffic is all there is: its windows are checked, the cheat's fail and it is evicted
    await until('the cheat to be evicted', async () => ((await cluster.api.miners()).find((m) => m.id.toLowerCase() === cheat.toLowerCase())?.alive === false ? true : null));
    const log = await until('an honest window checked', () => (new RegExp(`inference check of miner ${honest}[^\\n]*: passed, \\d+ steps, each bitwise equal`, 'i').test(orchestratorLog()) ? orchestratorLog() : null));
    assert.match(log, /synthetic prompts: 4 requests a second/);
    assert.match(log, new RegExp(`inference check of miner ${cheat}[^\\n]*session cmpl-[^\\n]*: FAILED, step \\d+ of \\d+`, 'i'));
    assert.doesNotMatch(log, new RegExp(`inference check of miner ${honest}[^\\n]*FAILED`, 'i'));

    // slashed on chain, once per failed window; the honest miner never
    let slashes: EpochView['slashes'] = [];
    await until('the slashes to be sent', async () => {
      slashes = (await cluster.epochs()).flatMap((e) => e.slashes);
      return slashes.length > 0 && slashes.every((s) => s.status !== 'pending') ? true : null;
    });
    assert.ok(slashes.every((s) => s.miner.toLowerCase() === cheat.toLowerCase()), JSON.stringify(slashes));
    const sent = slashes.filter((s) => s.status === 'slashed');
    assert.ok(sent.length >= 1, JSON.stringify(slashes));
    const events = await slashedEvents(session.client);
    assert.equal(events.length, sent.length, 'one Slashed event per slashed row, none twice');
    assert.ok(events.every((e) => e.args.account?.toLowerCase() === cheat.toLowerCase() && /^nimble inference check dep-/.test(e.args.reason ?? '')));
    const cheatStake = await readStake(session.client, cheat as Address);
    const slashed = sent.reduce((a, s) => a + BigInt(s.amountWei!), 0n);
    assert.ok(slashed >= parseEther('20'), 'the first slash took half of the stake');
    assert.equal(cheatStake.staked + cheatStake.unstaking, parseEther('40') - slashed);
    const honestStake = await readStake(session.client, honest as Address);
    assert.equal(honestStake.staked + honestStake.unstaking, parseEther('40'));

    // the penalty in the work log: the cheat's only
    const db = new Database(join(home, 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const charged = db.prepare("SELECT miner_id AS miner, COUNT(*) AS n FROM work_log WHERE kind = 'failed_check' GROUP BY miner_id").all() as { miner: string; n: number }[];
      assert.deepEqual(charged.map((c) => c.miner.toLowerCase()), [cheat.toLowerCase()]);
      assert.ok(charged[0].n >= slashes.length);
    } finally {
      db.close();
    }
  } finally {
    await session.close();
  }
});
