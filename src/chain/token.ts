// NIM balances and transfers, the local faucet, and gas on the local chain.
import type { Address } from 'viem';
import { parseEther } from 'viem';
import { NimbleError } from '../protocol/errors.ts';
import { nimAbi } from './abis.ts';
import { formatNim } from './amounts.ts';
import { rpc, RPC_ANY } from './anvil.ts';
import { signerFor, type ChainClient, type SigningClient } from './client.ts';
import { localOperatorAccount } from './session.ts';
import { sendContractTx, type SentTx } from './tx.ts';

/** Most NIM one faucet call may mint. */
export const FAUCET_MAX = 1_000_000n * 10n ** 18n;

export async function nimBalance(client: ChainClient, address: Address): Promise<bigint> {
  return client.public.readContract({ address: client.deployment.nim, abi: nimAbi, functionName: 'balanceOf', args: [address] });
}

export async function nimTotalSupply(client: ChainClient): Promise<bigint> {
  return client.public.readContract({ address: client.deployment.nim, abi: nimAbi, functionName: 'totalSupply' });
}

/** Sends `amount` NIM from the signer to `to`; refuses (sending nothing) when the free balance is short. */
export async function transferNim(client: ChainClient, signer: SigningClient, to: Address, amount: bigint): Promise<SentTx> {
  const free = await nimBalance(client, signer.account.address);
  if (amount > free) {
    throw new NimbleError('invalid', `amount too large: ${formatNim(amount)} NIM asked, ${formatNim(free)} NIM free in ${signer.account.address}`);
  }
  await ensureGas(client, signer.account.address);
  return sendContractTx(client, signer, { address: client.deployment.nim, abi: nimAbi, functionName: 'transfer', args: [to, amount] });
}

/** Mints NIM to `to` with the local operator key. Local chain only. */
export async function faucet(client: ChainClient, to: Address, amount: bigint): Promise<SentTx> {
  if (!client.local || !client.deployment.faucet) {
    throw new NimbleError('not_found', `the faucet only exists on the local chain; chain ${client.chainId} (${client.rpcUrl}) has none`);
  }
  if (amount > FAUCET_MAX) throw new NimbleError('invalid', `the faucet gives at most ${formatNim(FAUCET_MAX)} NIM per call`);
  const operator = signerFor(client, localOperatorAccount());
  await ensureGas(client, to);
  return sendContractTx(client, operator, { address: client.deployment.nim, abi: nimAbi, functionName: 'mint', args: [to, amount] });
}

/**
 * On the local chain, tops an account up to 1 ETH for gas when it has less
 * than 0.1 (anvil_setBalance): local wallets never need to find ether. On any
 * other chain gas is the user's business and this does nothing.
 */
export async function ensureGas(client: ChainClient, address: Address): Promise<void> {
  if (!client.local) return;
  const balance = await client.public.getBalance({ address });
  if (balance < parseEther('0.1')) await rpc(client.rpcUrl, 'anvil_setBalance', [address, `0x${parseEther('1').toString(16)}`], RPC_ANY);
}
