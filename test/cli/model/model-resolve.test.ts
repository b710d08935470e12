// Finding a published model from what a user types (nbcli model show and
// download), against a real anvil: by sha256; by name when one owner
// published it (its newest); a name several owners published is refused as
// ambiguous unless --owner says whose, so an impostor's model under the same
// name is never picked silently.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { keccak256, toHex, type Address } from 'viem';
import { publishModel } from '../../../src/chain/registry.ts';
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
  await put('m1', 'gpt', mallory);
  await put('b2', 'solo', alice);
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
  assert.equal((await resolvePublished(t.client, 'gpt', mallory)).checkpointSha256, hash('m1'));
});

test('a name of several owners is ambiguous; unknown names and hashes are not found', async () => {
  await refused(resolvePublished(t.client, 'gpt'), 'ambiguous', /published by 2 owners: #0 by 0x.*#2 by 0x.*add --owner/);
  await refused(resolvePublished(t.client, 'nope'), 'not_found', /no published model is named 'nope'/);
  await refused(resolvePublished(t.client, 'solo', mallory), 'not_found', /named 'solo' by 0x/);
  await refused(resolvePublished(t.client, hash('zz')), 'not_found', /no model with sha256/);
  await refused(resolvePublished(t.client, hash('m1'), alice), 'not_found', /published by 0x/);
});
