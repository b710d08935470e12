// Sending one contract call: simulate first (so a revert is reported with its
// reason and nothing is sent), then send and wait for the receipt. Calls are
// typed by the contract's ABI (src/chain/abis.ts): function names and
// arguments are checked by the compiler.
import { NimbleError } from '../protocol/errors.ts';
import {
  BaseError,
  ContractFunctionRevertedError,
  NonceTooLowError,
  type Abi,
  type Address,
  type Chain,
  type ContractFunctionArgs,
  type ContractFunctionName,
  type ContractFunctionParameters,
  type Hash,
  type PublicClient,
  type TransactionReceipt,
  type Transport,
} from 'viem';
import type { SigningClient } from './client.ts';

type Writable = 'nonpayable' | 'payable';

/** One state-changing call: address, ABI, function name and arguments (typed by the ABI). */
export type ContractCall<
  abi extends Abi,
  functionName extends ContractFunctionName<abi, Writable>,
  args extends ContractFunctionArgs<abi, Writable, functionName>,
> = ContractFunctionParameters<abi, Writable, functionName, args>;

interface AnyCall {
  address: Address;
  abi: Abi;
  functionName: string;
  args?: readonly unknown[];
}

export interface SentTx {
  hash: Hash;
  gasUsed: bigint;
  receipt: TransactionReceipt;
}

/** A transaction the chain refused (simulation or receipt reverted): 409, the chain's state does not allow it. */
export class ChainTxError extends NimbleError {
  override readonly name = 'ChainTxError';

  constructor(
    message: string,
    /** the custom error's name when the contract reverted with one */
    readonly errorName?: string,
  ) {
    super('chain_refused', message, 409);
  }
}

/** How a send reports and waits (both optional). */
export interface SendOptions {
  /** called with the hash once the node took the transaction, before its receipt is awaited (record it: it may be mined later) */
  onSent?: (hash: Hash) => void;
  /** how long to wait for the receipt (viem's default: 180 s) */
  receiptTimeoutMs?: number;
}

/**
 * Simulates, sends and waits for one call; a ChainTxError naming the contract
 * error when it would revert (nothing is sent then) or did revert.
 */
export async function sendContractTx<
  const abi extends Abi,
  functionName extends ContractFunctionName<abi, Writable>,
  const args extends ContractFunctionArgs<abi, Writable, functionName>,
>(client: { public: PublicClient<Transport, Chain> }, signer: SigningClient, call: ContractCall<abi, functionName, args>, options?: SendOptions): Promise<SentTx>;
// The implementation sees any ABI: the signature above is what callers are checked against.
export async function sendContractTx(client: { public: PublicClient<Transport, Chain> }, signer: SigningClient, call: AnyCall, options: SendOptions = {}): Promise<SentTx> {
  let request;
  try {
    ({ request } = await client.public.simulateContract({
      account: signer.account,
      address: call.address,
      abi: call.abi,
      functionName: call.functionName,
      args: call.args ?? [],
    }));
  } catch (err) {
    throw explainRevert(err, call.functionName);
  }
  const hash = await withFreshNonce(() => signer.writeContract(request));
  options.onSent?.(hash);
  const receipt = await client.public.waitForTransactionReceipt({ hash, ...(options.receiptTimeoutMs ? { timeout: options.receiptTimeoutMs } : {}) });
  if (receipt.status !== 'success') throw new ChainTxError(`${call.functionName} reverted in transaction ${hash}`);
  return { hash, gasUsed: receipt.gasUsed, receipt };
}

/** How many times a send is retried when another sender of the same account took its nonce. */
const NONCE_RETRIES = 8;

/**
 * Sends a simulated request. Two processes may sign with one account (on the
 * local chain the orchestrator settles epochs with the operator key that
 * `nbcli wallet faucet` mints with): both read the same next nonce and the
 * second send is refused, having sent nothing. Such a send is retried with the
 * nonce read again; any other error is the caller's.
 */
async function withFreshNonce(send: () => Promise<Hash>): Promise<Hash> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await send();
    } catch (err) {
      if (!isNonceTaken(err) || attempt >= NONCE_RETRIES) throw err;
      // jittered, so that senders that collided once do not collide again
      await new Promise((resolve) => setTimeout(resolve, 25 * (attempt + 1) + Math.random() * 50));
    }
  }
}

/**
 * Whether a send was refused because another transaction holds its nonce:
 * "nonce too low" once that one is mined, "replacement transaction
 * underpriced" while it is still pending at the same fee (a node takes a
 * second transaction with a pending one's nonce as an attempt to replace it).
 */
export function isNonceTaken(err: unknown): boolean {
  if (!(err instanceof BaseError)) return false;
  if (err.walk((e) => e instanceof NonceTooLowError) instanceof NonceTooLowError) return true;
  return err.walk((e) => e instanceof BaseError && /replacement transaction underpriced/i.test(e.details)) !== null;
}

/** Turns a viem revert into one line naming the contract error. */
export function explainRevert(err: unknown, functionName: string): ChainTxError {
  if (err instanceof BaseError) {
    const revert = err.walk((e) => e instanceof ContractFunctionRevertedError);
    if (revert instanceof ContractFunctionRevertedError) {
      const name = revert.data?.errorName;
      const args = revert.data?.args?.map((a) => String(a)).join(', ');
      const reason = name ? `${name}(${args ?? ''})` : (revert.reason ?? revert.shortMessage);
      return new ChainTxError(`${functionName} rejected by the contract: ${reason}`, name);
    }
    return new ChainTxError(`${functionName} failed: ${err.shortMessage}`);
  }
  return new ChainTxError(`${functionName} failed: ${err instanceof Error ? err.message : String(err)}`);
}
