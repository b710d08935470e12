// End to end (issue 33): a model built against the inference spot checks
// does not get honest serving miners slashed. A real orchestrator on its
// anvil recomputes every served window (--inference-check-rate 1, relaxed
// SIMD, the default build) and sends its own traffic (--synthetic-prompts 4).
// The model, a gpt-micro whose MLPs hold huge opposing weights before the next
// normalization (test/helpers/whole-model.ts, opposingWeightsBytes), puts
// the two kernel builds' answers ~1e-4 apart in cosine, past the training
// checks' 1e-5: deployed on one stage with 2 replicas, one served by an
// honest miner on plain SIMD (a child process, `--simd plain`), the other by
// one that adds 20% noise to its answers (in this process, Tamper.inference).
// Without the cross-build probe the honest miner's windows fail against the
// relaxed replay and it is slashed; with it, the deploy measured the builds
// apart and the checks replay on both builds: the honest miner's windows
// pass, the cheat's fail and it is slashed on chain, and the honest stake is
// untouched. A model whose builds are too far apart for any check is refused
// at deploy, saying why.
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
import { opposingWeightsBytes } from '../helpers/whole-model.ts';
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

test('a model with opposing weights before a norm: an honest plain-SIMD miner passes its checks, a cheat is slashed, a model no check can hold is refused', { timeout: 120_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'build-probe-test';
  await cluster.startOrchestrator(['--min-stake', '0', '--inference-check-rate', '1', '--slash-fraction', '0.5', '--synthetic-prompts', '4'], { chain: true });
  const home = join(cluster.dir, 'orch');
  const honestKey = generatePrivateKey();
  const cheatKey = generatePrivateKey();
  const honest = privateKeyToAccount(honestKey).address;
  const cheat = privateKeyToAccount(cheatKey).address;
  saveWallet(home, 'dev', generatePrivateKey(), 'build-probe-test', 'light');
  saveWallet(home, 'w-honest', honestKey, 'build-probe-test', 'light');
  const session = await openChain({ dataDir: home });
  try {
    for (const [key, address] of [[honestKey, honest], [cheatKey, cheat]] as const) {
      await faucet(session.client, address, parseEther('100'));
      await ensureGas(session.client, address);
      await addStake(session.client, signerFor(session.client, privateKeyToAccount(key)), parseEther('40'));
    }
    await cluster.startMiner('honest', ['--data-dir', home, '--wallet.name', 'w-honest', '--serve', 'inference', '--simd', 'plain']);
    cheater = await Miner.start({
      orchestrator: cluster.url,
      dataDir: join(cluster.dir, 'cheat'),
      name: 'cheat',
      threads: 1,
      privateKey: cheatKey,
      serve: 'inference',
      registryLookup: chainRegistryLookup(home),
      // noise of about 20% on every value it answers with
      tamper: { inference: (out) => out.forEach((v, i) => (out[i] = v * (1 + 0.2 * Math.sin(i * 12.9898)) + 0.01 * Math.cos(i))) },
    });

    const nbcli = (...args: string[]) => cluster.nbcli([...args, '--orchestrator', cluster.url], home);
    const file = join(cluster.dir, 'micro.safetensors');
    // a model no check can hold: refused at deploy, naming the parts and the deviation
    const wild = join(cluster.dir, 'wild.safetensors');
    writeFileSync(wild, opposingWeightsBytes(1e7));
    assert.equal((await nbcli('model', 'publish', '--file', wild, '--name', 'wild-micro', '--wallet.name', 'dev')).code, 0);
    const refused = await nbcli('model', 'deploy', 'wild-micro', '--wallet.name', 'dev');
    assert.notEqual(refused.code, 0);
    assert.match(refused.stderr, /refused: honest miners on the two kernel builds \(relaxed and plain SIMD\) answer parts \[\d, \d\) of this model up to 1 − cosine/);
    assert.match(orchestratorLog(), /build probe of [0-9a-f]{12}: 10 ranges of parts in \d+ ms, worst \[\d, \d\) [^\n]*REFUSED/);

    writeFileSync(file, opposingWeightsBytes(1e5));
    assert.equal((await nbcli('model', 'publish', '--file', file, '--name', 'moby-micro', '--wallet.name', 'dev')).code, 0);
    const deployed = await nbcli('model', 'deploy', 'moby-micro', '--stages', '1', '--replicas', '2', '--wallet.name', 'dev', '--wait', '--timeout', '60');
    assert.equal(deployed.code, 0, deployed.stderr);

    // the synthetic traffic is all there is: its windows are checked, the cheat's fail and it is evicted
    await until('the cheat to be evicted', async () => ((await cluster.api.miners()).find((m) => m.id.toLowerCase() === cheat.toLowerCase())?.alive === false ? true : null));
    const log = await until('an honest window checked', () => (new RegExp(`inference check of miner ${honest}[^\\n]*: passed, \\d+ steps`, 'i').test(orchestratorLog()) ? orchestratorLog() : null));
    assert.match(log, /build probe of [0-9a-f]{12}: 10 ranges of parts[^\n]*its checks at least/);
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
