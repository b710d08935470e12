// The local node of a data dir: started from saved state, deployed to once,
// dumped and stopped after each command, shared while a persistent owner
// lives, adopted when its owner died; a deployment recorded before JobEscrow
// is brought up to date in place.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseUnits } from 'viem';
import { isAlive, stopPid } from '../../src/chain/anvil.ts';
import { stakingAbi } from '../../src/chain/abis.ts';
import { DEFAULT_ESCROW_LOCK_SECONDS, DISTRIBUTOR_ROLE, LOCAL_DEPLOYMENT_KEY, readDeployments, saveDeployment } from '../../src/chain/deploy.ts';
import { escrowLockTimeout, escrowTotalHeld } from '../../src/chain/escrow.ts';
import { localNodePaths, openLocalNode, type LocalNodeFile } from '../../src/chain/node.ts';
import { openChain, withChain } from '../../src/chain/session.ts';
import { faucet, nimBalance } from '../../src/chain/token.ts';
import { tempDir } from './helpers.ts';

const ALICE = '0x70997970C51812dc3A010C7d01b50e0d17dc79C8';
const dirs: string[] = [];
const pids: number[] = [];
after(async () => {
  for (const pid of pids) await stopPid(pid);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function newDataDir(): string {
  const d = tempDir('node');
  dirs.push(d);
  return d;
}

test('state survives stop and restart; contracts are deployed once', async () => {
  const dataDir = newDataDir();
  const paths = localNodePaths(dataDir);
  const first = await openChain({ dataDir });
  const pid = JSON.parse(readFileSync(paths.node, 'utf8')).pid as number;
  pids.push(pid);
  assert.ok(first.node?.owned);
  assert.match(first.client.rpcUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
  await faucet(first.client, ALICE, parseUnits('12.5', 18));
  const deployment = first.client.deployment;
  await first.close();
  assert.equal(isAlive(pid), false, 'anvil stopped');
  assert.equal(existsSync(paths.node), false, 'node.json removed');
  assert.equal(existsSync(paths.lock), false, 'lock released');
  assert.ok(existsSync(paths.state), 'state saved');
  assert.deepEqual(readDeployments(dataDir).local, deployment);

  const balance = await withChain({ dataDir }, async (client) => {
    assert.deepEqual(client.deployment, deployment, 'no second deployment');
    return nimBalance(client, ALICE);
  });
  assert.equal(balance, parseUnits('12.5', 18));
});

test('a persistent node is borrowed by other commands and survives them', async () => {
  const dataDir = newDataDir();
  const owner = await openChain({ dataDir, persistent: true });
  pids.push(JSON.parse(readFileSync(localNodePaths(dataDir).node, 'utf8')).pid as number);
  try {
    const borrower = await openChain({ dataDir });
    assert.equal(borrower.node?.owned, false);
    assert.equal(borrower.client.rpcUrl, owner.client.rpcUrl);
    await faucet(borrower.client, ALICE, 5n);
    await borrower.close();
    assert.equal(await nimBalance(owner.client, ALICE), 5n, 'node still up after the borrower closed');
  } finally {
    await owner.close();
  }
  assert.equal(await withChain({ dataDir }, (c) => nimBalance(c, ALICE)), 5n);
});

test("a node whose owner died is adopted, its state saved, then stopped", async () => {
  const dataDir = newDataDir();
  const session = fileURLToPath(new URL('../../src/chain/session.ts', import.meta.url));
  const token = fileURLToPath(new URL('../../src/chain/token.ts', import.meta.url));
  const script = `
    const { openChain } = await import(${JSON.stringify(session)});
    const { faucet } = await import(${JSON.stringify(token)});
    const s = await openChain({ dataDir: ${JSON.stringify(dataDir)} });
    await faucet(s.client, '${ALICE}', 7n);
    process.stdout.write('ready\\n');
    setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  pids.push(child.pid as number);
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
    child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
  });
  const info = JSON.parse(readFileSync(localNodePaths(dataDir).node, 'utf8')) as LocalNodeFile;
  pids.push(info.pid);
  child.kill('SIGKILL'); // the owner dies without saving anything
  await new Promise((resolve) => child.once('exit', resolve));
  assert.ok(isAlive(info.pid), 'its anvil lives on');

  const node = await openLocalNode(dataDir);
  assert.equal(node.owned, true);
  assert.equal(node.rpcUrl, info.rpcUrl, 'the same node, not a new one');
  await node.release();
  assert.equal(isAlive(info.pid), false);
  assert.equal(await withChain({ dataDir }, (c) => nimBalance(c, ALICE)), 7n, 'the orphan’s transactions were saved');
  assert.ok(existsSync(join(dataDir, 'chain', 'state.json')));
});

test('a local deployment recorded before JobEscrow gets it (and the attested registry) in place, balances kept', async () => {
  const dataDir = newDataDir();
  const first = await openChain({ dataDir });
  await faucet(first.client, ALICE, 9n);
  const { jobEscrow, ...old } = first.client.deployment;
  assert.ok(jobEscrow);
  await first.close();
  saveDeployment(dataDir, old, LOCAL_DEPLOYMENT_KEY); // as an older nbcli wrote it

  const upgraded = await withChain({ dataDir }, async (client) => {
    assert.ok(client.deployment.jobEscrow, 'JobEscrow added');
    assert.notEqual(client.deployment.modelRegistry, old.modelRegistry, 'a registry whose publish takes attestations');
    assert.equal(client.deployment.nim, old.nim);
    assert.equal(client.deployment.staking, old.staking);
    assert.equal(await nimBalance(client, ALICE), 9n, 'the same chain state');
    assert.equal(await escrowTotalHeld(client), 0n);
    const canCredit = await client.public.readContract({
      address: client.deployment.staking,
      abi: stakingAbi,
      functionName: 'hasRole',
      args: [DISTRIBUTOR_ROLE, client.deployment.jobEscrow],
    });
    assert.equal(canCredit, true, 'job payments can land as stake');
    return client.deployment;
  });
  assert.deepEqual(readDeployments(dataDir).local, upgraded, 'recorded');
  await withChain({ dataDir }, async (client) => assert.deepEqual(client.deployment, upgraded, 'upgraded once'));
});

test("a local deployment whose JobEscrow predates the orchestrator's lock gets a new JobEscrow in place, the rest kept", async () => {
  const dataDir = newDataDir();
  const first = await openChain({ dataDir });
  const current = first.client.deployment;
  await first.close();
  // a contract without lockTimeout stands for the JobEscrow an older nbcli deployed
  saveDeployment(dataDir, { ...current, jobEscrow: current.nim }, LOCAL_DEPLOYMENT_KEY);

  const upgraded = await withChain({ dataDir }, async (client) => {
    const escrow = client.deployment.jobEscrow;
    assert.ok(escrow && escrow !== current.nim && escrow !== current.jobEscrow, 'a new JobEscrow');
    assert.equal(client.deployment.modelRegistry, current.modelRegistry, 'the registry is kept');
    assert.equal(await escrowLockTimeout(client), DEFAULT_ESCROW_LOCK_SECONDS);
    const canCredit = await client.public.readContract({ address: client.deployment.staking, abi: stakingAbi, functionName: 'hasRole', args: [DISTRIBUTOR_ROLE, escrow] });
    assert.equal(canCredit, true, 'job payments can land as stake');
    return client.deployment;
  });
  assert.deepEqual(readDeployments(dataDir).local, upgraded, 'recorded');
});
