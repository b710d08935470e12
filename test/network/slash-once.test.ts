// One offence, one slash, on real processes: an orchestrator on its local
// anvil, a miner that lies in its reports (test/helpers/byzantine.ts
// `inflate`) with 10 NIM staked. The chain stops mining (anvil's automine
// off, as a slow chain or a congested one would behave), so the slash
// transaction the offence causes stays pending and the orchestrator's wait
// for its receipt fails (a test-only NIMBLE_TEST_RECEIPT_TIMEOUT_MS makes
// that 1.5 s instead of a minute): the failure an RPC timeout or error after
// a broadcast gives. The orchestrator retries every pass; it must wait for
// the transaction it sent, not send another beside it. Then the chain mines:
// one Slashed event, 5 % of the stake burnt once. Then the orchestrator is
// killed with SIGKILL while a second offence's slash is pending and
// restarted: that offence is slashed once too.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Type } from '@sinclair/typebox';
import { parseAbiItem, parseEther, type Address } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import type { EpochView } from '../../src/api/schemas.ts';
import { rpc, RPC_ANY } from '../../src/chain/anvil.ts';
import { signerFor } from '../../src/chain/client.ts';
import { loadOrCreateKeyFile } from '../../src/chain/key-file.ts';
import { localOperatorAccount, openChain, type ChainSession } from '../../src/chain/session.ts';
import { addStake, readStake } from '../../src/chain/staking.ts';
import { ensureGas, faucet } from '../../src/chain/token.ts';
import { Cluster } from './helpers.ts';

const cluster = new Cluster();
after(() => cluster.stopGracefully());

const STAKE = parseEther('10');
const Quantity = Type.String({ pattern: '^0x[0-9a-fA-F]+$' });
type Slash = EpochView['slashes'][number];

async function slashesOf(miner: string): Promise<Slash[]> {
  const epochs = await cluster.epochs().catch(() => [] as EpochView[]);
  return epochs.flatMap((e) => e.slashes).filter((s) => s.miner.toLowerCase() === miner.toLowerCase());
}

async function until<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 60_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}; orchestrator:\n${cluster.orchestrator?.lines.slice(-15).join('\n')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test('a slash whose receipt is lost is neither sent twice nor burnt twice, across retries and a kill -9', { timeout: 240_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  process.env.NIMBLE_PASSWORD = 'slash-once';
  const args = ['--min-stake', '0', '--emission', '1', '--check-rate', '0', '--epoch-rounds', '1000', '--slash-fraction', '0.05'];
  process.env.NIMBLE_TEST_RECEIPT_TIMEOUT_MS = '1500';
  let session: ChainSession | null = null;
  try {
    await cluster.startOrchestrator(args, { chain: true });
    session = await openChain({ dataDir: join(cluster.dir, 'orch') });
    const chain = session.client;
    const operator = localOperatorAccount().address;
    const node = (method: string, params: unknown[] = []) => rpc(chain.rpcUrl, method, params, RPC_ANY);
    /** transactions of the orchestrator's account the node holds unmined */
    const unmined = async (): Promise<number> => {
      const [pending, latest] = await Promise.all(['pending', 'latest'].map((tag) => rpc(chain.rpcUrl, 'eth_getTransactionCount', [operator, tag], Quantity)));
      return Number(BigInt(pending) - BigInt(latest));
    };
    const slashedEvents = async (miner: Address) =>
      (await chain.public.getLogs({ address: chain.deployment.staking, event: parseAbiItem('event Slashed(address indexed account, uint256 amount, string reason)'), args: { account: miner }, fromBlock: 0n, toBlock: 'latest' })).map((l) => l.args);

    const { privateKey, address } = loadOrCreateKeyFile(join(cluster.dir, 'cheat', 'miner-key.json'));
    const cheat = address as Address;
    await faucet(chain, cheat, STAKE);
    await ensureGas(chain, cheat);
    await addStake(chain, signerFor(chain, privateKeyToAccount(privateKey)), STAKE);
    await cluster.startByzantine('cheat', 'inflate');

    // the chain stops mining; the cheat's first heartbeat of false reports is an offence
    await node('evm_setAutomine', [false]);
    await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 400, stages: 1, mergeEvery: 1000, batchSize: 8, minMiners: 1 });
    const first = await until('the slash to be sent and its receipt to time out', async () => (await slashesOf(cheat)).find((s) => s.error !== null));
    assert.equal(first.status, 'pending');
    // passes retry it every second or two for 8 s: none sends another transaction beside the one pending
    await new Promise((r) => setTimeout(r, 8_000));
    assert.equal(await unmined(), 1, 'one slash transaction sent, however many retries');
    assert.ok(cluster.orchestrator!.lines.filter((l) => /not mined yet: waiting for it, not sending another/.test(l)).length >= 2, 'the retries waited for the transaction sent');

    // the chain mines again: the offence is slashed once
    await node('evm_setAutomine', [true]);
    await node('evm_mine');
    const done = await until('the slash to be recorded', async () => (await slashesOf(cheat)).find((s) => s.reason === first.reason && s.status === 'slashed'));
    assert.equal(done.amountWei, (STAKE / 20n).toString(), '5 % of the stake at the offence');
    assert.deepEqual((await slashedEvents(cheat)).map((e) => e.reason), [first.reason], 'one Slashed event for the offence');
    assert.equal((await readStake(chain, cheat)).staked, STAKE - STAKE / 20n);

    // a second cheat's offence: its slash is pending when the orchestrator is killed; after the restart it is slashed once
    const second = loadOrCreateKeyFile(join(cluster.dir, 'cheat-2', 'miner-key.json'));
    const cheat2 = second.address as Address;
    await faucet(chain, cheat2, STAKE);
    await ensureGas(chain, cheat2);
    await addStake(chain, signerFor(chain, privateKeyToAccount(second.privateKey)), STAKE);
    await node('evm_setAutomine', [false]);
    await cluster.startByzantine('cheat-2', 'inflate');
    const pending = await until('the second slash to be sent', async () => (await slashesOf(cheat2)).find((s) => s.error !== null), 90_000);
    assert.equal(pending.status, 'pending');
    await session.close();
    session = null;
    const orch = cluster.orchestrator!.child;
    orch.kill('SIGKILL');
    await new Promise((r) => orch.once('exit', r));
    await cluster.startOrchestrator(args, { chain: true });
    session = await openChain({ dataDir: join(cluster.dir, 'orch') });
    const chain2 = session.client;
    await rpc(chain2.rpcUrl, 'evm_setAutomine', [true], RPC_ANY);
    await rpc(chain2.rpcUrl, 'evm_mine', [], RPC_ANY);
    await until('the second slash to be recorded', async () => (await slashesOf(cheat2)).find((s) => s.status === 'slashed'), 60_000);
    const events = (await chain2.public.getLogs({ address: chain2.deployment.staking, event: parseAbiItem('event Slashed(address indexed account, uint256 amount, string reason)'), fromBlock: 0n, toBlock: 'latest' })).map((l) => l.args);
    const reasons = events.map((e) => e.reason!);
    assert.equal(new Set(reasons).size, reasons.length, `no offence slashed twice: ${JSON.stringify(reasons)}`);
    assert.equal(events.filter((e) => e.account!.toLowerCase() === cheat2.toLowerCase()).length, 1);
    assert.equal((await readStake(chain2, cheat2)).staked, STAKE - STAKE / 20n);
    assert.equal((await readStake(chain2, cheat)).staked, STAKE - STAKE / 20n, 'the first offence was not slashed again after the restart');
  } finally {
    delete process.env.NIMBLE_TEST_RECEIPT_TIMEOUT_MS;
    await session?.close();
  }
});
