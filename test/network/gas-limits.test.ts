// What the orchestrator pays gas for on others' behalf is bounded per owner
// (src/orchestrator/rewards/gas.ts), on real processes: an orchestrator on
// its local anvil, a miner serving inference, nbcli for a model's owner. The
// owner cycles deploy and undeploy (each cycle: the ModelRegistry's deployed
// flag set and cleared by the orchestrator's transactions, the owner only
// signs): its seventh deploy within the hour is refused with a 429 that says
// when the next is allowed, and the orchestrator sent at most two
// transactions per cycle. A developer opens escrows (its own transactions)
// and asks the orchestrator to release them (one transaction each, the
// orchestrator's): the eleventh release within the hour is refused, and so is
// the eleventh credit escrow registered.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { parseEther, type Address, type Hex } from 'viem';
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../src/api/client.ts';
import { CreditClient } from '../../src/api/credit-client.ts';
import { JobClient } from '../../src/api/job-client.ts';
import { signerFor, type ChainClient } from '../../src/chain/client.ts';
import { openEscrow } from '../../src/chain/escrow.ts';
import { localOperatorAccount, openChain, type ChainSession } from '../../src/chain/session.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import { saveWallet } from '../../src/chain/wallets.ts';
import { GAS_LIMITS } from '../../src/orchestrator/rewards/gas.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';
import { assertRefused } from '../helpers/refusals.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());
const PASSWORD = 'gas-limits';

test("deploy/undeploy cycles, escrow releases and credit escrows cost the orchestrator gas only a few times an hour per owner", { timeout: 240_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = PASSWORD;
  await cluster.startOrchestrator(['--min-stake', '0', '--check-rate', '0', '--inference-check-rate', '0'], { chain: true });
  const home = join(cluster.dir, 'orch');
  saveWallet(home, 'dev', generatePrivateKey(), PASSWORD, 'light');
  const nbcli = (...a: string[]) => cluster.nbcli([...a, '--orchestrator', cluster.url], home);
  const file = join(cluster.dir, 'micro.safetensors');
  writeFileSync(file, wholeModelBytes(44, 500));
  await Promise.all([
    cluster.startMiner('a', ['--data-dir', home, '--serve', 'inference']),
    nbcli('model', 'publish', '--file', file, '--name', 'churn', '--wallet.name', 'dev').then((r) => assert.equal(r.code, 0, r.stderr)),
  ]);
  const session: ChainSession = await openChain({ dataDir: home });
  try {
    const c: ChainClient = session.client;
    const operator = localOperatorAccount().address;
    /** transactions the orchestrator's account has sent */
    const sent = (): Promise<number> => c.public.getTransactionCount({ address: operator, blockTag: 'latest' });

    // 1. deploy/undeploy cycles: six an hour, each at most two registry transactions of the orchestrator
    const before = await sent();
    for (let i = 0; i < GAS_LIMITS.deploysPerOwner; i++) {
      const d = await nbcli('model', 'deploy', 'churn', '--stages', '1', '--wallet.name', 'dev', '--wait', '--timeout', '30');
      assert.equal(d.code, 0, d.stderr);
      const u = await nbcli('model', 'undeploy', 'churn', '--wallet.name', 'dev');
      assert.equal(u.code, 0, u.stderr);
    }
    const seventh = await nbcli('model', 'deploy', 'churn', '--stages', '1', '--wallet.name', 'dev');
    assert.notEqual(seventh.code, 0, 'the seventh deploy within the hour is refused');
    assert.match(seventh.stderr, /deployed 6 times in the last hour; each deploy and undeploy costs the orchestrator a ModelRegistry transaction, so an owner deploys at most 6 times an hour: the next in \d+ minutes?/);
    await new Promise((r) => setTimeout(r, 2_000)); // the last flag cleared
    const spent = (await sent()) - before;
    assert.ok(spent <= 2 * GAS_LIMITS.deploysPerOwner, `${spent} transactions for ${GAS_LIMITS.deploysPerOwner} cycles`);
    assert.ok(spent >= 2, 'the flag followed the deployments');

    // 2. escrow releases and credit escrows: ten an hour per owner
    const devKey = generatePrivateKey();
    const dev = privateKeyToAccount(devKey);
    await faucet(c, dev.address as Address, parseEther('30'));
    await ensureGas(c, dev.address as Address);
    const signer = signerFor(c, dev);
    const api = new OrchestratorClient(cluster.url, { wallet: devKey });
    const jobs = new JobClient(api);
    const credits = new CreditClient(api);
    const escrow = async (i: number): Promise<Hex> => {
      const id = `0x${(0xe5c0000 + i).toString(16).padStart(64, '0')}` as Hex;
      await openEscrow(c, signer, id, parseEther('0.5'));
      return id;
    };
    const releasedBefore = await sent();
    for (let i = 0; i < GAS_LIMITS.escrowReleasesPerOwner; i++) {
      const r = await jobs.release(await escrow(i));
      assert.ok(r.tx, 'released by a transaction of the orchestrator');
    }
    const extra = await escrow(100);
    await assertRefused(jobs.release(extra), 429, 'rate_limited', /released 10 escrows in the last hour, each a transaction the orchestrator pays: 10 an hour at most; the next in \d+ minutes?/);
    assert.equal((await sent()) - releasedBefore, GAS_LIMITS.escrowReleasesPerOwner, 'no transaction for the refused release');
    for (let i = 0; i < GAS_LIMITS.creditEscrowsPerOwner; i++) await credits.add(await escrow(200 + i));
    await assertRefused(credits.add(extra), 429, 'rate_limited', /added 10 credit escrows in the last hour, each closed by a transaction the orchestrator pays: 10 an hour at most/);
    // the limit is the owner's: another wallet is not held back, and gets the 4xx its request earns
    await assertRefused(new CreditClient(new OrchestratorClient(cluster.url, { wallet: generatePrivateKey() })).add(extra), 403, 'forbidden', /not 0x/);
  } finally {
    await session.close();
  }
});
