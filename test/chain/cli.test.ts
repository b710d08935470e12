// nbcli wallet / stake end to end: real processes against the real anvil node
// each command starts from the data dir's saved state.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseUnits, type Address } from 'viem';
import { signerFor } from '../../src/chain/client.ts';
import { nimAbi } from '../../src/chain/abis.ts';
import { saveDeployment } from '../../src/chain/deploy.ts';
import { settleEpoch } from '../../src/chain/rewards.ts';
import { localOperatorAccount, withChain } from '../../src/chain/session.ts';
import { nimBalance } from '../../src/chain/token.ts';
import { sendContractTx } from '../../src/chain/tx.ts';
import { startTestChain, supplyReport, tempDir } from './helpers.ts';
import { nbcliArgv } from '../helpers/nbcli.ts';

/** nbcli as a child process (the build when fresh: test/helpers/nbcli.ts) */
const [node, ...pre] = nbcliArgv();

const root = fileURLToPath(new URL('../..', import.meta.url));
let dataDir: string;
let bobAddress = '';
let aliceAddress = '';

before(() => {
  dataDir = tempDir('cli');
});
after(() => {
  // every command stops the node it started: nothing may be left running
  assert.equal(existsSync(join(dataDir, 'chain', 'node.json')), false, 'no node left running');
  rmSync(dataDir, { recursive: true, force: true });
});

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function nbcli(args: string[], env: Record<string, string | undefined> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(node, [...pre, ...args, '--data-dir', dataDir], {
      cwd: root,
      env: { ...process.env, NIMBLE_PASSWORD: 'hunter2', NIMBLE_CHAIN_RPC: '', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

async function ok(args: string[], env?: Record<string, string | undefined>): Promise<Record<string, unknown>> {
  const r = await nbcli([...args, '--json'], env);
  assert.equal(r.code, 0, `nbcli ${args.join(' ')} failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as Record<string, unknown>;
}

async function fails(args: string[], pattern: RegExp, env?: Record<string, string | undefined>): Promise<void> {
  const r = await nbcli(args, env);
  assert.equal(r.code, 1, `expected failure: nbcli ${args.join(' ')}\n${r.stdout}${r.stderr}`);
  const lines = r.stderr.trim().split('\n');
  assert.equal(lines.length, 1, `one line of error, got:\n${r.stderr}`);
  assert.match(lines[0], pattern);
  assert.equal(r.stdout, '');
}

async function balances(name: string): Promise<{ free: string; staked: string; unstaking: string; rewardsTotal: string }> {
  const b = await ok(['wallet', 'balance', '--wallet.name', name]);
  return { free: b.free as string, staked: b.staked as string, unstaking: b.unstaking as string, rewardsTotal: b.rewardsTotal as string };
}

test('create two wallets, faucet, transfer, stake, unstake, transfer again: exact balances', async () => {
  const alice = await ok(['wallet', 'create', '--wallet.name', 'alice', '--light-kdf']);
  const bob = await ok(['wallet', 'create', '--wallet.name', 'bob', '--light-kdf']);
  bobAddress = String(bob.address);
  aliceAddress = String(alice.address);
  assert.match(String(alice.address), /^0x[0-9a-fA-F]{40}$/);
  assert.deepEqual(readdirSync(join(dataDir, 'wallets')).sort(), ['alice.json', 'bob.json']);
  // --light-kdf: geth's light scrypt cost, so the many commands below open the wallets quickly
  const kdf = (JSON.parse(readFileSync(join(dataDir, 'wallets', 'alice.json'), 'utf8')) as { crypto: { kdfparams: { n: number; p: number } } }).crypto.kdfparams;
  assert.deepEqual([kdf.n, kdf.p], [4096, 6]);
  const list = (await nbcli(['wallet', 'list', '--json'])).stdout;
  assert.deepEqual((JSON.parse(list) as { name: string }[]).map((w) => w.name), ['alice', 'bob']);

  assert.equal((await ok(['wallet', 'faucet', '--wallet.name', 'alice', '--amount', '100'])).free, '100');
  const sent = await ok(['wallet', 'transfer', '--wallet.name', 'alice', '--to', String(bob.address), '--amount', '30.5']);
  assert.equal(sent.free, '69.5');
  const staked = await ok(['stake', 'add', '--wallet.name', 'bob', '--amount', '20']);
  assert.deepEqual([staked.staked, staked.free], ['20', '10.5']);

  const partial = await ok(['stake', 'remove', '--wallet.name', 'bob', '--amount', '5']);
  assert.deepEqual([partial.unstaked, partial.withdrawn, partial.staked, partial.free], ['5', '5', '15', '15.5']);
  const all = await ok(['stake', 'remove', '--wallet.name', 'bob']);
  assert.deepEqual([all.unstaked, all.withdrawn, all.staked, all.unstaking, all.free], ['15', '15', '0', '0', '30.5']);

  await ok(['wallet', 'transfer', '--wallet.name', 'bob', '--to', String(alice.address), '--amount', '30.25']);
  assert.deepEqual(await balances('bob'), { free: '0.25', staked: '0', unstaking: '0', rewardsTotal: '0' });
  assert.deepEqual(await balances('alice'), { free: '99.75', staked: '0', unstaking: '0', rewardsTotal: '0' });

  const human = await nbcli(['wallet', 'balance', '--wallet.name', 'alice']);
  assert.match(human.stdout, /free\s+99\.75 NIM/);
});

test('each mistake gets a one-line error and changes nothing', async () => {
  // where the first test left them
  const before = { alice: { free: '99.75', staked: '0', unstaking: '0', rewardsTotal: '0' }, bob: { free: '0.25', staked: '0', unstaking: '0', rewardsTotal: '0' } };
  const bob = bobAddress;
  // run side by side: the ones that reach the chain also exercise the data dir's lock
  await Promise.all([
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', bob, '--amount', '1'], /^nbcli: wrong password for wallet 'alice'$/, {
      NIMBLE_PASSWORD: 'wrong',
    }),
    fails(['wallet', 'transfer', '--wallet.name', 'carol', '--to', bob, '--amount', '1'], /unknown wallet 'carol'/),
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', '0x1234', '--amount', '1'], /--to is not a valid address/),
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', bob.toLowerCase().replace('0x', '0X'), '--amount', '1'], /--to is not a valid address/),
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', bob, '--amount', '99.76'], /amount too large: 99\.76 NIM asked, 99\.75 NIM free/),
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', bob, '--amount', 'lots'], /--amount must be a number of NIM/),
    fails(['wallet', 'transfer', '--wallet.name', 'alice', '--to', bob, '--amount', '-3'], /--amount must be a number of NIM/),
    fails(['stake', 'add', '--wallet.name', 'bob', '--amount', '1'], /amount too large: 1 NIM asked, 0\.25 NIM free/),
    fails(['stake', 'remove', '--wallet.name', 'bob'], /nothing staked/),
    fails(['stake', 'add', '--wallet.name', 'alice', '--amount', '1'], /no password: set NIMBLE_PASSWORD/, { NIMBLE_PASSWORD: undefined }),
    fails(['wallet', 'create', '--wallet.name', 'alice'], /wallet 'alice' already exists/),
    fails(['wallet', 'faucet', '--wallet.name', 'alice', '--amount', '5', '--chain-rpc', 'http://127.0.0.1:9'], /faucet only exists on the local chain/),
    fails(['wallet', 'balance', '--wallet.name', 'alice', '--chain-rpc', 'http://127.0.0.1:9'], /cannot reach the chain at http:\/\/127\.0\.0\.1:9/),
  ]);
  assert.deepEqual({ alice: await balances('alice'), bob: await balances('bob') }, before);
});

test('import a mnemonic; concurrent commands on one data dir are serialized, none lost', async () => {
  const imported = await ok(['wallet', 'import', '--wallet.name', 'dev1', '--index', '1', '--light-kdf'], {
    NIMBLE_WALLET_SECRET: 'test test test test test test test test test test test junk',
  });
  assert.equal(imported.address, '0x70997970C51812dc3A010C7d01b50e0d17dc79C8');
  await fails(['wallet', 'import', '--wallet.name', 'dev2'], /not a valid BIP-39 mnemonic/, { NIMBLE_WALLET_SECRET: 'junk junk junk junk junk junk junk junk junk junk junk junk' });
  const runs = await Promise.all([1, 2, 3].map(() => ok(['wallet', 'faucet', '--wallet.name', 'dev1', '--amount', '1'])));
  assert.equal(runs.length, 3);

  // the orchestrator's library settles an epoch on the same chain; the CLI shows it per epoch
  const dev1 = imported.address as Address;
  await withChain({ dataDir }, (client) => settleEpoch(client, signerFor(client, localOperatorAccount()), 1n, [{ address: dev1, amount: parseUnits('2.5', 18) }]));
  const b = await ok(['wallet', 'balance', '--wallet.name', 'dev1']);
  assert.deepEqual([b.free, b.staked, b.rewardsTotal, b.rewards], ['3', '2.5', '2.5', [{ epoch: '1', amount: '2.5' }]]);

  // conservation over everything the commands did
  const r = await withChain({ dataDir }, (client) => supplyReport(client, [aliceAddress as Address, bobAddress as Address, dev1]));
  assert.equal(r.totalSupply, r.free + r.staked + r.unstaking + r.undistributed);
  assert.equal(r.totalSupply, parseUnits('105.5', 18));
});

test('--chain-rpc: the same commands against another node, addresses from deployment.json', async () => {
  const remote = await startTestChain();
  try {
    saveDeployment(dataDir, remote.client.deployment); // under its chain id, next to "local"
    const dev1 = '0x70997970C51812dc3A010C7d01b50e0d17dc79C8';
    await sendContractTx(remote.client, remote.operator, {
      address: remote.client.deployment.nim,
      abi: nimAbi,
      functionName: 'mint',
      args: [dev1, parseUnits('40', 18)],
    });
    const rpc = ['--chain-rpc', remote.client.rpcUrl];
    const sent = await ok(['wallet', 'transfer', '--wallet.name', 'dev1', '--to', bobAddress, '--amount', '15', ...rpc]);
    assert.equal(sent.free, '25');
    assert.equal(await nimBalance(remote.client, bobAddress as Address), parseUnits('15', 18));
    assert.equal((await ok(['wallet', 'balance', '--wallet.name', 'bob', ...rpc])).free, '15');
    // the local chain did not move
    assert.equal((await ok(['wallet', 'balance', '--wallet.name', 'bob'])).free, '0.25');
  } finally {
    await remote.stop();
  }
});
