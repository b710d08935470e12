// Finding a published model from what a user types (nbcli model show and
// download), against a real anvil: by sha256; by name (its owner's newest);
// another owner cannot publish under a taken name at all (NameTaken), so an
// impostor's model under the same name is never picked.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { keccak256, toHex, type Address } from 'viem';
import { publishModel } from '../../../src/chain/registry.ts';
import { ChainTxError } from '../../../src/chain/tx.ts';
import { resolvePublished } from '../../../src/cli/model/model-resolve.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { startTestChain, type TestChain } from '../../chain/helpers.ts';

let t: TestChain;
let alice: Address;
let mallory: Address;
const hash = (s: string) => keccak256(toHex(s));

before(async () => {
  t = await startTestChain();
  alice = t.signer(1).account.address;
  mallory = t.signer(2).account.address;
  // the orchestrator publishes for any owner (no attestation needed from it)
  const put = (sha: string, name: string, owner: Address) => publishModel(t.client, t.operator, { checkpointSha256: hash(sha), name, metadataURI: 'm', owner, pricePer1kTokens: 0n });
  await put('a1', 'gpt', alice);
  await put('b1', 'solo', alice);
  await put('m1', 'mgpt', mallory);
  await put('b2', 'solo', alice);
  // mallory under alice's name: the registry refuses it, whoever sends it
  await assert.rejects(put('m2', 'gpt', mallory), (err: unknown) => err instanceof ChainTxError && /NameTaken\(gpt, 0x/.test(err.message));
});
after(() => t?.stop());

const refused = async (p: Promise<unknown>, code: string, message: RegExp): Promise<void> => {
  await assert.rejects(p, (err: unknown) => err instanceof NimbleError && err.code === code && message.test(err.message));
};

test('by sha256 (with or without 0x), by a name of one owner (its newest), by name and owner', async () => {
  assert.equal((await resolvePublished(t.client, hash('m1'))).owner, mallory);
  assert.equal((await resolvePublished(t.client, hash('m1').slice(2).toUpperCase())).id, 2n);
  assert.equal((await resolvePublished(t.client, 'solo')).checkpointSha256, hash('b2'));
  assert.equal((await resolvePublished(t.client, 'gpt', alice)).checkpointSha256, hash('a1'));
  assert.equal((await resolvePublished(t.client, 'gpt')).checkpointSha256, hash('a1'));
  assert.equal((await resolvePublished(t.client, 'mgpt', mallory)).checkpointSha256, hash('m1'));
});

test('unknown names, names of another owner and hashes are not found', async () => {
  await refused(resolvePublished(t.client, 'gpt', mallory), 'not_found', /named 'gpt' by 0x/);
  await refused(resolvePublished(t.client, 'nope'), 'not_found', /no published model is named 'nope'/);
  await refused(resolvePublished(t.client, 'solo', mallory), 'not_found', /named 'solo' by 0x/);
  await refused(resolvePublished(t.client, hash('zz')), 'not_found', /no model with sha256/);
  await refused(resolvePublished(t.client, hash('m1'), alice), 'not_found', /published by 0x/);
});
