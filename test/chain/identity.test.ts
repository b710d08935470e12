// Which chain is which (src/chain/identity.ts): two local nodes of two data
// dirs (chain id 31337, the same contract addresses) are told apart by their
// genesis and contracts' block; a chain an orchestrator names is opened only
// when the RPC used is that chain and its contracts are there, and refused
// with one line otherwise: another genesis, an RPC of its own that is not the
// orchestrator's chain, addresses with no code, a contract that is not one,
// contracts the asker's deployment.json records otherwise, no RPC at all.
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { after, before, test } from 'node:test';
import type { Address } from 'viem';
import { chainIdentityOf, openClaimedChain, sameChain, type ChainClaim } from '../../src/chain/identity.ts';
import { openChain, type ChainSession } from '../../src/chain/session.ts';
import { nimBalance } from '../../src/chain/token.ts';
import { tempDir } from './helpers.ts';

const dirs = [tempDir('identity-a'), tempDir('identity-b')];
let a: ChainSession;
let b: ChainSession;
let claimA: ChainClaim;

before(async () => {
  // opened at once: their anvils most likely start in the same second, so with the same genesis
  [a, b] = await Promise.all(dirs.map((dataDir) => openChain({ dataDir, persistent: true })));
  claimA = { ...(await chainIdentityOf(a.client)), rpcUrl: a.client.rpcUrl, local: true, contracts: a.client.deployment };
});
after(async () => {
  await Promise.all([a?.close(), b?.close()]);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const who = 'this command';
const short = /0x[0-9a-f]{8}…[0-9a-f]{4}/.source;

test('two fresh local chains look alike (chain id, addresses) and are told apart', async () => {
  const [ia, ib] = await Promise.all([chainIdentityOf(a.client), chainIdentityOf(b.client)]);
  assert.equal(ia.chainId, ib.chainId);
  assert.equal(a.client.deployment.jobEscrow, b.client.deployment.jobEscrow, 'the same deterministic addresses');
  assert.equal(sameChain(ia, ib), false);
  // started in the same second they share the genesis: the salted contracts' block still differs
  assert.notEqual(ia.deployBlockHash, ib.deployBlockHash);
});

test("the chain an orchestrator names is opened on its RPC, or on one's own that is the same chain", async () => {
  const client = await openClaimedChain(claimA, { who });
  assert.equal(client.rpcUrl, a.client.rpcUrl);
  assert.equal(client.local, true, 'its local node: faucet and gas top-ups');
  assert.equal(await nimBalance(client, '0x70997970C51812dc3A010C7d01b50e0d17dc79C8'), 0n);
  const own = await openClaimedChain({ ...claimA, rpcUrl: null }, { who, rpcUrl: a.client.rpcUrl });
  assert.equal(own.rpcUrl, a.client.rpcUrl);
  const notLocal = await openClaimedChain({ ...claimA, local: false }, { who });
  assert.equal(notLocal.local, false);
});

test('refused with one line: another chain behind the RPC, an own RPC of another chain, no RPC, unreachable', async () => {
  const idB = await chainIdentityOf(b.client);
  await assert.rejects(openClaimedChain({ ...claimA, rpcUrl: b.client.rpcUrl }, { who }), (err: Error) => {
    assert.match(err.message, new RegExp(`^the orchestrator says it pays on rpc ${b.client.rpcUrl}, genesis ${short}(, contracts' block ${short})?, and that RPC is another chain \\(genesis ${short}`));
    return true;
  });
  await assert.rejects(openClaimedChain(claimA, { who, rpcUrl: b.client.rpcUrl }), (err: Error) => {
    const line = new RegExp(`^this command's chain \\(rpc ${b.client.rpcUrl}, genesis ${short}.*\\) is not the orchestrator's \\(rpc ${a.client.rpcUrl}, genesis ${short}.*\\): pass --chain-rpc ${a.client.rpcUrl} or leave --chain-rpc`);
    assert.match(err.message, line);
    assert.ok(!err.message.includes('\n'), 'one line');
    if (idB.genesisHash === claimA.genesisHash) assert.match(err.message, /contracts' block/, 'the same genesis: the contracts\' block tells them apart');
    return true;
  });
  await assert.rejects(openClaimedChain({ ...claimA, rpcUrl: null }, { who }), /pays on chain 31337 \(genesis 0x[0-9a-f]{8}…[0-9a-f]{4}\) and publishes no RPC URL for it: pass --chain-rpc URL/);
  await assert.rejects(openClaimedChain({ ...claimA, rpcUrl: 'http://127.0.0.1:9' }, { who }), /cannot reach the orchestrator's chain \(rpc http:\/\/127\.0\.0\.1:9, .*\) from here: .*a node on 127\.0\.0\.1 is reachable only on the orchestrator's machine: pass --chain-rpc URL/);
});

test("refused: addresses with no code, a contract that is not the one named, another deployment in the asker's deployment.json", async () => {
  const nowhere = '0x000000000000000000000000000000000000dEaD' as Address;
  await assert.rejects(
    openClaimedChain({ ...claimA, contracts: { ...claimA.contracts, jobEscrow: nowhere } }, { who }),
    new RegExp(`the orchestrator names JobEscrow ${nowhere} on chain 31337 \\(rpc ${a.client.rpcUrl}\\), and there is no contract there: refused`),
  );
  const registry = claimA.contracts.modelRegistry;
  await assert.rejects(openClaimedChain({ ...claimA, contracts: { ...claimA.contracts, jobEscrow: registry } }, { who }), new RegExp(`JobEscrow ${registry} .*the contract there is not one \\(no token\\(\\)\\): refused`));
  // a "NIM" that is another contract (it has code): Staking's token is not it
  const { nim, staking } = claimA.contracts;
  await assert.rejects(
    openClaimedChain({ ...claimA, contracts: { ...claimA.contracts, nim: staking } }, { who }),
    new RegExp(`the orchestrator names Staking ${staking} on chain 31337 \\(rpc [^)]+\\), whose token is ${nim}, not ${staking}: refused`),
  );
  const known = { '31337': { ...claimA.contracts, jobEscrow: nowhere } };
  await assert.rejects(openClaimedChain(claimA, { who, known, knownFile: '/x/chain/deployment.json' }), new RegExp(`/x/chain/deployment.json records other Nimble contracts on chain 31337 .*\\(jobEscrow ${nowhere}\\) than the orchestrator's \\(jobEscrow ${claimA.contracts.jobEscrow}\\): refused`));
  // the data dir's own local chain ("local") is another chain: it is not compared
  await openClaimedChain(claimA, { who, known: { local: { ...claimA.contracts, jobEscrow: nowhere } } });
});
