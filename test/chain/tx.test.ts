// Two senders of one account: the second send finds its nonce taken and is
// sent again with a fresh one, instead of failing (the orchestrator settling
// epochs while `nbcli wallet faucet` mints, both with the local operator key).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { nimAbi } from '../../src/chain/abis.ts';
import { signerFor } from '../../src/chain/client.ts';
import { nimBalance } from '../../src/chain/token.ts';
import { isNonceTaken, sendContractTx } from '../../src/chain/tx.ts';
import { BaseError, ContractFunctionExecutionError, NonceTooLowError } from 'viem';
import { startTestChain, type TestChain } from './helpers.ts';

let chain: TestChain;
before(async () => {
  chain = await startTestChain();
});
after(() => chain.stop());

test('concurrent sends from one account by separate clients all land, each once', async () => {
  const to = chain.signer(3).account.address;
  const start = await nimBalance(chain.client, to);
  const senders = Array.from({ length: 6 }, () => signerFor(chain.client, chain.operator.account));
  const sent = await Promise.all(
    senders.map((s, i) => sendContractTx(chain.client, s, { address: chain.client.deployment.nim, abi: nimAbi, functionName: 'mint', args: [to, BigInt(i + 1)] })),
  );
  assert.equal(new Set(sent.map((t) => t.hash)).size, 6);
  assert.equal(await nimBalance(chain.client, to), start + 21n);
});

test('a send refused because another transaction holds its nonce is recognized, mined or pending; other refusals are not', () => {
  const wrap = (inner: Error): BaseError => new ContractFunctionExecutionError(new BaseError('Transaction creation failed.', { cause: inner }), { abi: nimAbi, functionName: 'mint', args: [] });
  assert.equal(isNonceTaken(wrap(new NonceTooLowError())), true);
  assert.equal(isNonceTaken(wrap(new BaseError('Transaction creation failed.', { details: 'replacement transaction underpriced' }))), true);
  assert.equal(isNonceTaken(wrap(new BaseError('Transaction creation failed.', { details: 'insufficient funds for gas * price + value' }))), false);
  assert.equal(isNonceTaken(new Error('replacement transaction underpriced')), false);
});
