// The contracts against a real anvil node (JobEscrow has its own file, escrow.test.ts).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { parseEventLogs, parseUnits, keccak256, toHex, type Abi, type Address, type Hex, type LocalAccount } from 'viem';
import type { SigningClient } from '../../src/chain/client.ts';
import { modelRegistryAbi, nimAbi, stakingAbi } from '../../src/chain/abis.ts';
import { ABIS, type ContractName } from '../../src/chain/contracts.ts';
import { listModels, nameOwnerOf, publishAttestationDigest, publishModel, setModelDeployed, signPublishAttestation, type PublishAttestation } from '../../src/chain/registry.ts';
import { readEpoch, rewardsDigest, settleEpoch } from '../../src/chain/rewards.ts';
import { addStake, findSlash, isOffenceSlashed, offenceIdOf, readStake, removeStake, slashStake, stakingHasOffences, withdrawIfReady } from '../../src/chain/staking.ts';
import { transferNim } from '../../src/chain/token.ts';
import { ChainTxError, sendContractTx } from '../../src/chain/tx.ts';
import { ORCHESTRATOR_ROLE } from '../../src/chain/deploy.ts';
import { advanceTime, prng, startTestChain, supplyReport, type TestChain } from './helpers.ts';

const NIM = (n: number | string): bigint => parseUnits(String(n), 18);
let t: TestChain;

before(async () => {
  t = await startTestChain();
});
after(async () => {
  await t?.stop();
});

function call(signer: SigningClient, name: ContractName, functionName: string, args: unknown[] = []) {
  const d = t.client.deployment;
  const address = { NIM: d.nim, Staking: d.staking, RewardDistributor: d.rewardDistributor, ModelRegistry: d.modelRegistry, JobEscrow: d.jobEscrow }[name];
  assert.ok(address, `no ${name} in this deployment`);
  const abi: Abi = ABIS[name]; // any function by name: the tests also call what the library never does
  return sendContractTx(t.client, signer, { address, abi, functionName, args });
}

async function rejects(p: Promise<unknown>, errorName: string): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof ChainTxError, String(err));
    assert.equal(err.errorName, errorName, err.message);
    return true;
  });
}

const mint = (to: Address, amount: bigint) => call(t.operator, 'NIM', 'mint', [to, amount]);

test('NIM: only a minter mints', async () => {
  const alice = t.signer(1);
  await mint(alice.account.address, NIM(10));
  await rejects(call(alice, 'NIM', 'mint', [alice.account.address, NIM(1)]), 'AccessControlUnauthorizedAccount');
  const symbol = await t.client.public.readContract({ address: t.client.deployment.nim, abi: nimAbi, functionName: 'symbol' });
  assert.equal(symbol, 'NIM');
});

test('Staking: stake, unstake, withdraw with a cooldown only the admin sets', async () => {
  const bob = t.signer(2);
  const me = bob.account.address;
  await mint(me, NIM(100));
  await addStake(t.client, bob, NIM(60));
  assert.deepEqual(await readStake(t.client, me), { staked: NIM(60), unstaking: 0n, releaseAt: 0 });

  // cooldown 0 (local default): free again at once
  const r = await removeStake(t.client, bob, NIM(10));
  assert.equal(r.withdrawn, NIM(10));
  assert.equal(r.position.staked, NIM(50));

  await rejects(call(bob, 'Staking', 'setCooldown', [3600n]), 'AccessControlUnauthorizedAccount');
  await call(t.operator, 'Staking', 'setCooldown', [3600n]);
  try {
    const r2 = await removeStake(t.client, bob, NIM(20));
    assert.equal(r2.withdrawn, 0n);
    assert.equal(r2.position.unstaking, NIM(20));
    await rejects(call(bob, 'Staking', 'withdraw'), 'CooldownNotOver');
    assert.equal((await withdrawIfReady(t.client, bob)).withdrawn, 0n);
    await advanceTime(t.client, 3601);
    assert.equal((await withdrawIfReady(t.client, bob)).withdrawn, NIM(20));
  } finally {
    await call(t.operator, 'Staking', 'setCooldown', [0n]);
  }
  await rejects(call(bob, 'Staking', 'unstake', [NIM(31)]), 'InsufficientStake');
  await rejects(call(bob, 'Staking', 'withdraw'), 'NothingToWithdraw');
  await rejects(call(bob, 'Staking', 'stake', [0n]), 'ZeroAmount');
  assert.equal((await readStake(t.client, me)).staked, NIM(30));
});

test('Staking: only the orchestrator slashes; the reason is in the event; tokens are burnt, unstaking too', async () => {
  const carol = t.signer(3);
  const me = carol.account.address;
  await mint(me, NIM(50));
  await addStake(t.client, carol, NIM(50));
  await rejects(slashStake(t.client, carol, me, NIM(1), 'self'), 'AccessControlUnauthorizedAccount');
  await rejects(slashStake(t.client, t.signer(4), me, NIM(1), 'forged'), 'AccessControlUnauthorizedAccount');

  await call(t.operator, 'Staking', 'setCooldown', [3600n]);
  try {
    await removeStake(t.client, carol, NIM(20)); // 30 staked, 20 unstaking
  } finally {
    await call(t.operator, 'Staking', 'setCooldown', [0n]);
  }
  const supplyBefore = (await supplyReport(t.client, [])).totalSupply;
  const tx = await slashStake(t.client, t.operator, me, NIM(35), 'failed spot check on microbatch 7');
  const [ev] = parseEventLogs({ abi: stakingAbi, logs: tx.receipt.logs, eventName: 'Slashed' });
  assert.deepEqual(ev.args, { account: me, amount: NIM(35), reason: 'failed spot check on microbatch 7' });
  assert.deepEqual(await findSlash(t.client, me, 'failed spot check on microbatch 7'), { txHash: tx.hash, amount: NIM(35) });
  assert.equal(await findSlash(t.client, me, 'failed spot check on microbatch 8'), null);
  assert.equal(await findSlash(t.client, t.signer(4).account.address, 'failed spot check on microbatch 7'), null);
  const pos = await readStake(t.client, me);
  assert.equal(pos.staked, 0n);
  assert.equal(pos.unstaking, NIM(15));
  assert.equal((await supplyReport(t.client, [])).totalSupply, supplyBefore - NIM(35));
  await rejects(slashStake(t.client, t.operator, me, NIM(16), 'too much'), 'InsufficientStake');
});

test('Staking: one offence is slashed once, whoever resends it; the record is per orchestrator account', async () => {
  const dave = t.signer(9);
  const me = dave.account.address;
  await mint(me, NIM(20));
  await addStake(t.client, dave, NIM(20));
  const offence = offenceIdOf('nimble check 41');
  assert.equal(await isOffenceSlashed(t.client, t.operator.account.address, offence), false);
  await slashStake(t.client, t.operator, me, NIM(1), 'nimble check 41');
  assert.equal(await isOffenceSlashed(t.client, t.operator.account.address, offence), true);
  // the same offence again (a lost receipt, a restart): refused by the contract, nothing burnt
  await rejects(slashStake(t.client, t.operator, me, NIM(1), 'nimble check 41'), 'OffenceAlreadySlashed');
  await rejects(slashStake(t.client, t.operator, me, NIM(2), 'another reason', { offence }), 'OffenceAlreadySlashed');
  assert.equal((await readStake(t.client, me)).staked, NIM(19));
  // a second orchestrator account keeps its own record (its offences are its own network's)
  await call(t.operator, 'Staking', 'grantRole', [ORCHESTRATOR_ROLE, t.signer(4).account.address]);
  assert.equal(await isOffenceSlashed(t.client, t.signer(4).account.address, offence), false);
  await slashStake(t.client, t.signer(4), me, NIM(1), 'nimble check 41');
  assert.equal((await readStake(t.client, me)).staked, NIM(18));
  // a Staking deployed before offence ids (here: a contract without offenceSlashed) is told apart, not misread
  assert.equal(await stakingHasOffences(t.client), true);
  assert.equal(await stakingHasOffences({ ...t.client, deployment: { ...t.client.deployment, staking: t.client.deployment.nim } }), false);
});

test('RewardDistributor: forged and replayed settlements are rejected', async () => {
  const miners = [t.signer(5).account.address, t.signer(6).account.address];
  const amounts = [NIM(3), NIM(4)];
  const digest = rewardsDigest(miners.map((address, i) => ({ address, amount: amounts[i] })));
  const post = (signer: SigningClient, epoch: bigint, index: number, count: number, dg = digest, m = miners, a = amounts, asStake = true) =>
    call(signer, 'RewardDistributor', 'postRewards', [epoch, index, count, dg, m, a, asStake]);

  await rejects(post(t.signer(5), 1n, 0, 1), 'AccessControlUnauthorizedAccount'); // a miner paying itself
  await rejects(post(t.operator, 1n, 1, 2), 'WrongBatch'); // must start at batch 0
  await post(t.operator, 1n, 0, 2, digest, [miners[0]], [amounts[0]]);
  await rejects(post(t.operator, 1n, 0, 2, digest, [miners[0]], [amounts[0]]), 'WrongBatch'); // replayed batch
  await rejects(post(t.operator, 1n, 1, 3, digest, [miners[1]], [amounts[1]]), 'BatchCountMismatch');
  await rejects(post(t.operator, 1n, 1, 2, keccak256(toHex('other')), [miners[1]], [amounts[1]]), 'DigestMismatch');
  await post(t.operator, 1n, 1, 2, digest, [miners[1]], [amounts[1]]);
  const e = await readEpoch(t.client, 1n);
  assert.equal(e.settled, true);
  assert.equal(e.total, NIM(7));
  await rejects(post(t.operator, 1n, 0, 1), 'EpochAlreadySettled'); // replayed epoch
  await rejects(post(t.operator, 1n, 2, 2), 'EpochAlreadySettled');
  assert.equal((await readStake(t.client, miners[0])).staked, NIM(3));
  assert.equal((await readStake(t.client, miners[1])).staked, NIM(4));

  // paid to wallets instead of stake when the orchestrator asks
  const before5 = (await supplyReport(t.client, [miners[0]])).free;
  await post(t.operator, 2n, 0, 1, digest, miners, amounts, false);
  assert.equal((await supplyReport(t.client, [miners[0]])).free, before5 + NIM(3));
  await rejects(post(t.operator, 3n, 0, 1, digest, [miners[0]], amounts), 'LengthMismatch');
  await rejects(post(t.operator, 3n, 0, 0), 'InvalidBatchCount');
});

/** The local operator (orchestrator) as a viem LocalAccount, to sign attestations with. */
function orchestratorAccount(): LocalAccount {
  const account = t.operator.account;
  assert.equal(account.type, 'local');
  return account as LocalAccount;
}

async function chainNow(): Promise<bigint> {
  return (await t.client.public.getBlock({ blockTag: 'latest' })).timestamp;
}

/** An attestation for `owner` to publish `sha` as `name`, valid for an hour, signed by `by` (the orchestrator by default). */
async function attest(
  sha: Hex,
  owner: Address,
  name: string,
  by: LocalAccount = orchestratorAccount(),
  fields: Partial<PublishAttestation> = {},
): Promise<PublishAttestation & { attestation: { deadline: bigint; signature: Hex } }> {
  const a: PublishAttestation = { checkpointSha256: sha, owner, name, metadataURI: `blob://sha256/${sha.slice(2, 10)}`, pricePer1kTokens: NIM('0.01'), deadline: (await chainNow()) + 3600n, ...fields };
  return { ...a, attestation: { deadline: a.deadline, signature: await signPublishAttestation(t.client, by, a) } };
}

test('ModelRegistry: publish once per checkpoint, deploy/undeploy by owner or orchestrator, list', async () => {
  const dev = t.signer(7);
  const stranger = t.signer(8);
  const sha = keccak256(toHex('checkpoint bytes'));
  const att = await attest(sha, dev.account.address, 'gpt-tiny-moby', orchestratorAccount(), { metadataURI: 'blob://sha256/abc' });
  const { id, tx } = await publishModel(t.client, dev, att);
  assert.equal(id, 0n);
  assert.equal(parseEventLogs({ abi: modelRegistryAbi, logs: tx.receipt.logs, eventName: 'ModelPublished' }).length, 1);
  await rejects(publishModel(t.client, dev, att), 'AlreadyPublished');
  await rejects(publishModel(t.client, t.operator, { checkpointSha256: sha, name: 'again', metadataURI: '', owner: dev.account.address, pricePer1kTokens: 0n }), 'AlreadyPublished');
  await rejects(
    publishModel(t.client, stranger, { checkpointSha256: keccak256(toHex('x')), name: 'squat', metadataURI: '', owner: dev.account.address, pricePer1kTokens: 0n }),
    'NotAllowed',
  );
  // the orchestrator may publish on a developer's behalf, with no attestation
  const second = await publishModel(t.client, t.operator, { checkpointSha256: keccak256(toHex('y')), name: 'mlp-spam', metadataURI: 'm', owner: dev.account.address, pricePer1kTokens: 5n });
  assert.equal(second.id, 1n);

  await rejects(setModelDeployed(t.client, stranger, 0n, true), 'NotAllowed');
  const dep = await setModelDeployed(t.client, dev, 0n, true);
  assert.equal(parseEventLogs({ abi: modelRegistryAbi, logs: dep.receipt.logs, eventName: 'ModelDeployed' }).length, 1);
  await rejects(setModelDeployed(t.client, dev, 0n, true), 'AlreadyInState');
  await rejects(setModelDeployed(t.client, dev, 9n, true), 'UnknownModel');
  const models = await listModels(t.client);
  assert.deepEqual(
    models.map((m) => [m.id, m.name, m.owner, m.deployed, m.pricePer1kTokens]),
    [
      [0n, 'gpt-tiny-moby', dev.account.address, true, NIM('0.01')],
      [1n, 'mlp-spam', dev.account.address, false, 5n],
    ],
  );
  const undep = await setModelDeployed(t.client, t.operator, 0n, false);
  assert.equal(parseEventLogs({ abi: modelRegistryAbi, logs: undep.receipt.logs, eventName: 'ModelUndeployed' }).length, 1);
  assert.deepEqual((await listModels(t.client, 1n, 5n)).map((m) => m.name), ['mlp-spam']);
  assert.deepEqual(await listModels(t.client, 7n, 5n), []);
});

test('ModelRegistry: a name is its first publisher\'s: another owner is refused (NameTaken), by the orchestrator too; its owner publishes new versions under it', async () => {
  const dev = t.signer(7);
  const attacker = t.signer(9);
  assert.equal(await nameOwnerOf(t.client, 'popular-model'), null);
  await publishModel(t.client, t.operator, { checkpointSha256: keccak256(toHex('popular v1')), name: 'popular-model', metadataURI: '', owner: dev.account.address, pricePer1kTokens: 1n });
  assert.equal(await nameOwnerOf(t.client, 'popular-model'), dev.account.address);
  // the attacker with an attestation of its own, and the orchestrator on its behalf: both refused
  const att = await attest(keccak256(toHex('attacker weights')), attacker.account.address, 'popular-model');
  await rejects(publishModel(t.client, attacker, att), 'NameTaken');
  await rejects(publishModel(t.client, t.operator, { checkpointSha256: keccak256(toHex('attacker weights 2')), name: 'popular-model', metadataURI: '', owner: attacker.account.address, pricePer1kTokens: 99n }), 'NameTaken');
  // names are compared as bytes: another spelling is another name
  await publishModel(t.client, attacker, await attest(keccak256(toHex('attacker weights')), attacker.account.address, 'Popular-model'));
  // the owner's next version keeps the name
  const v2 = await publishModel(t.client, dev, await attest(keccak256(toHex('popular v2')), dev.account.address, 'popular-model'));
  assert.equal((await listModels(t.client, v2.id, 1n))[0].name, 'popular-model');
  assert.equal(await nameOwnerOf(t.client, 'popular-model'), dev.account.address);
});

test("ModelRegistry: an owner's publish is bound to the orchestrator's attestation (no front-running)", async () => {
  const dev = t.signer(7);
  const frontRunner = t.signer(8);
  const sha = keccak256(toHex('weights the orchestrator saw dev store first'));
  const att = await attest(sha, dev.account.address, 'dev-model');
  const count = async (): Promise<bigint> =>
    t.client.public.readContract({ address: t.client.deployment.modelRegistry, abi: modelRegistryAbi, functionName: 'modelCount' });
  const before = await count();

  // the contract hashes what viem signs
  const onChain = await t.client.public.readContract({
    address: t.client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: 'publishAttestationDigest',
    args: [att.checkpointSha256, att.owner, att.name, att.metadataURI, att.pricePer1kTokens, att.deadline],
  });
  assert.equal(onChain, publishAttestationDigest(t.client, att));

  // without an attestation the owner alone cannot publish
  await rejects(publishModel(t.client, dev, { ...att, attestation: undefined }), 'MissingAttestation');
  // a front-runner replaying dev's pending transaction from its own address: as dev's model, or as its own
  await rejects(publishModel(t.client, frontRunner, att), 'NotAllowed');
  await rejects(publishModel(t.client, frontRunner, { ...att, owner: frontRunner.account.address }), 'InvalidAttestation');
  // a copy with any signed field changed no longer matches the signature
  await rejects(publishModel(t.client, dev, { ...att, pricePer1kTokens: 0n }), 'InvalidAttestation');
  await rejects(publishModel(t.client, dev, { ...att, name: 'other name' }), 'InvalidAttestation');
  await rejects(publishModel(t.client, dev, { ...att, attestation: { ...att.attestation, deadline: att.deadline + 1n } }), 'InvalidAttestation');
  // a signer without ORCHESTRATOR_ROLE: the front-runner attesting for itself, or the developer for itself
  const selfSigned = await attest(sha, frontRunner.account.address, 'dev-model', frontRunner.account as LocalAccount);
  await rejects(publishModel(t.client, frontRunner, selfSigned), 'InvalidAttestation');
  await rejects(publishModel(t.client, dev, await attest(sha, dev.account.address, 'dev-model', dev.account as LocalAccount)), 'InvalidAttestation');
  await rejects(publishModel(t.client, dev, { ...att, attestation: { ...att.attestation, signature: '0x1234' } }), 'InvalidAttestation');
  // an expired attestation
  const expired = await attest(sha, dev.account.address, 'dev-model', orchestratorAccount(), { deadline: (await chainNow()) - 1n });
  await rejects(publishModel(t.client, dev, expired), 'AttestationExpired');
  assert.equal(await count(), before, 'nothing published so far');

  // the legitimate owner, with the orchestrator's attestation
  const { id } = await publishModel(t.client, dev, att);
  const model = (await listModels(t.client, id, 1n))[0];
  assert.deepEqual([model.checkpointSha256, model.owner, model.name, model.pricePer1kTokens], [sha, dev.account.address, 'dev-model', att.pricePer1kTokens]);
  // and the attestation is spent: the checkpoint is taken
  await rejects(publishModel(t.client, dev, att), 'AlreadyPublished');
});

test('conservation: supply = free + staked + unstaking + undistributed after a random sequence', async () => {
  const holders = [1, 2, 3, 4, 5, 6, 7, 8, 9].map((i) => t.signer(i));
  const addresses = [t.operator.account.address, ...holders.map((h) => h.account.address)];
  const rand = prng(42);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  let epoch = 100n;
  const check = async (step: string): Promise<void> => {
    const r = await supplyReport(t.client, addresses);
    assert.equal(r.totalSupply, r.free + r.staked + r.unstaking + r.undistributed + r.escrowed, step);
    assert.equal(r.stakingBalance, r.totalStaked + r.totalUnstaking, step);
    assert.equal(r.staked, r.totalStaked, step);
    assert.equal(r.unstaking, r.totalUnstaking, step);
  };
  await check('start');
  for (let i = 0; i < 30; i++) {
    const who = pick(holders);
    const me = who.account.address;
    const op = pick(['mint', 'transfer', 'stake', 'unstake', 'withdraw', 'slash', 'settle', 'cooldown']);
    const free = (await supplyReport(t.client, [me])).free;
    const pos = await readStake(t.client, me);
    const some = (max: bigint): bigint => (max === 0n ? 0n : (max * BigInt(1 + Math.floor(rand() * 100))) / 100n);
    if (op === 'mint') await mint(me, NIM(1 + Math.floor(rand() * 50)));
    else if (op === 'transfer' && free > 0n) await transferNim(t.client, who, pick(holders).account.address, some(free));
    else if (op === 'stake' && free > 0n) await addStake(t.client, who, some(free));
    else if (op === 'unstake' && pos.staked > 0n) await call(who, 'Staking', 'unstake', [some(pos.staked)]);
    else if (op === 'withdraw') await withdrawIfReady(t.client, who);
    else if (op === 'slash' && pos.staked + pos.unstaking > 0n) await slashStake(t.client, t.operator, me, some(pos.staked + pos.unstaking), `random ${i}`);
    else if (op === 'cooldown') await call(t.operator, 'Staking', 'setCooldown', [rand() < 0.5 ? 0n : 1n]);
    else if (op === 'settle') {
      const rewards = holders.slice(0, 1 + Math.floor(rand() * 9)).map((h) => ({ address: h.account.address, amount: NIM(rand().toFixed(6)) }));
      await settleEpoch(t.client, t.operator, epoch++, rewards, { maxBatchSize: 3, asStake: rand() < 0.8 });
    }
    await check(`step ${i} ${op}`);
  }
  await call(t.operator, 'Staking', 'setCooldown', [0n]);
});
