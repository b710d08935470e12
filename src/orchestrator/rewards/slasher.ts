// Slashing: every offence (./offences.ts) gets a 'pending' slash row; its
// amount is fixed and written before the first send, and its unique reason's
// keccak256 is the offence id Staking refuses a second time. The chain is asked
// first, and the transaction's hash written as soon as the node took it, so a
// retry waits for that transaction instead of sending another
// (docs/security.md, "Money"). A slash that fails is tried again only after
// its backoff (1 s doubling to 5 min, ./backoff.ts): its tries, next try and
// error are on its row (a restart waits the same) and in GET /epochs, and
// each failure is logged. ./epochs.ts runs a pass at each of its steps.
import { formatEther, TransactionNotFoundError, TransactionReceiptNotFoundError, WaitForTransactionReceiptTimeoutError, type Address, type Hash } from 'viem';
import type { ChainClient, SigningClient } from '../../chain/client.ts';
import { ChainTxError } from '../../chain/tx.ts';
import { findSlash, isOffenceSlashed, offenceIdOf, readStake, slashStake, stakingHasOffences } from '../../chain/staking.ts';
import { formatDuration } from '../../jobs/duration.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { SlashRecord } from '../state/ledger.ts';
import { retryDelayMs, retryDue } from './backoff.ts';

/** How long a slash's receipt is awaited before the pass moves on (the transaction is looked for again at the next). */
export const SLASH_RECEIPT_TIMEOUT_MS = 60_000;

export class Slasher {
  constructor(
    private readonly state: OrchestratorState,
    /** `signer` holds the slasher role on Staking; `receiptTimeoutMs`: how long a receipt is awaited (default SLASH_RECEIPT_TIMEOUT_MS) */
    private readonly chain: { client: ChainClient; signer: SigningClient; receiptTimeoutMs?: number },
    private readonly log: (line: string) => void,
    /** a slashed miner whose stake fell below the minimum is evicted */
    private readonly evictIfBelowMinimum: (minerId: string) => Promise<void>,
    private readonly now: () => number = Date.now,
  ) {}

  /** Sends each pending slash whose backoff has passed; a failure is recorded, logged and waited out. */
  async reconcile(): Promise<void> {
    for (const s of this.state.ledger.slashes({ status: 'pending' })) {
      if (!retryDue(s.retryAt, this.now())) continue;
      try {
        await this.slash(s);
      } catch (err) {
        const message = (err as Error).message.split('\n')[0];
        const attempts = s.attempts + 1;
        const wait = retryDelayMs(attempts);
        this.state.ledger.setSlashError(s.id, message, attempts, this.now() + wait);
        this.log(`slashing ${s.miner} (${s.reason}) failed (attempt ${attempts}), retrying in ${formatDuration(wait)}: ${message}`);
      }
    }
  }

  /**
   * Sends one pending slash exactly once. The chain is asked first: the
   * Staking contract records each offence id its caller slashed (and refuses
   * a second), so a slash whose receipt was lost, or sent just before a
   * crash, is found there. A transaction recorded as sent and not mined yet
   * is waited for, never sent again beside it.
   */
  private async slash(s: SlashRecord): Promise<void> {
    const { client, signer } = this.chain;
    const account = s.miner as Address;
    const offence = offenceIdOf(s.reason);
    if (await stakingHasOffences(client)) {
      if (await isOffenceSlashed(client, signer.account.address, offence)) return this.foundSlashed(s);
    } else {
      // a Staking that predates offence ids (a local chain kept from then): the Slashed event with this reason is the record
      const found = await findSlash(client, account, s.reason);
      if (found) {
        this.state.ledger.markSlashed(s.id, found.txHash, found.amount);
        return;
      }
    }
    if (s.txHash !== null) {
      const sent = await this.sentSlash(s.txHash as Hash);
      if (sent === 'success') return this.foundSlashed(s);
      if (sent === 'pending') throw new Error(`slash transaction ${s.txHash} is not mined yet: waiting for it, not sending another`);
      // dropped by the node, or mined and reverted: sent again below (the contract takes an offence once)
    }
    let amount = s.amount === null ? null : BigInt(s.amount);
    if (amount === null) {
      // the stake at the offence (this pass runs within a second of it)
      const p = await readStake(client, account);
      amount = ((p.staked + p.unstaking) * BigInt(Math.round(s.fraction * 1e6))) / 1_000_000n;
      this.state.ledger.setSlashAmount(s.id, amount); // durable before sending
    }
    if (amount === 0n) {
      this.state.ledger.skipSlash(s.id, 'nothing staked to slash');
      this.log(`${s.miner} has nothing staked to slash (${s.reason})`);
      return;
    }
    try {
      const tx = await slashStake(client, signer, account, amount, s.reason, {
        offence,
        // durable as soon as the node has it: a lost receipt, an RPC error or a restart finds this transaction, not a new one
        onSent: (hash) => this.state.ledger.setSlashSent(s.id, hash),
        receiptTimeoutMs: this.chain.receiptTimeoutMs ?? SLASH_RECEIPT_TIMEOUT_MS,
      });
      this.state.ledger.markSlashed(s.id, tx.hash);
      this.log(`slashed ${formatEther(amount)} NIM of ${s.miner} (${s.reason}; tx ${tx.hash})`);
      await this.evictIfBelowMinimum(s.miner);
    } catch (err) {
      if (err instanceof ChainTxError && err.errorName === 'OffenceAlreadySlashed') return this.foundSlashed(s);
      if (!(err instanceof ChainTxError && err.errorName === 'InsufficientStake')) throw err;
      // slashed meanwhile for another check: take what is left (the amount was fixed; the stake is gone only by slashes within the cooldown)
      const p = await readStake(client, account);
      const left = p.staked + p.unstaking;
      if (left === 0n) this.state.ledger.skipSlash(s.id, 'nothing left staked to slash');
      else this.state.ledger.setSlashAmount(s.id, left, `only ${formatEther(left)} NIM left to slash`);
    }
  }

  /** Records a slash the chain shows done: its transaction and amount from the Slashed event with its reason. */
  private async foundSlashed(s: SlashRecord): Promise<void> {
    const found = await findSlash(this.chain.client, s.miner as Address, s.reason);
    const txHash = found?.txHash ?? s.txHash;
    if (!txHash) throw new Error(`the chain records offence '${s.reason}' as slashed but shows no Slashed event for it`);
    this.state.ledger.markSlashed(s.id, txHash, found?.amount);
    this.log(`slash of ${s.miner} (${s.reason}) found on chain (tx ${txHash}): not sent again`);
    await this.evictIfBelowMinimum(s.miner);
  }

  /** What became of a slash transaction sent before: mined (success or reverted), still pending, or unknown to the node (dropped). */
  private async sentSlash(hash: Hash): Promise<'success' | 'reverted' | 'pending' | 'dropped'> {
    const { client } = this.chain;
    const receipt = await client.public.getTransactionReceipt({ hash }).catch((err: unknown) => {
      if (err instanceof TransactionReceiptNotFoundError) return null;
      throw err;
    });
    if (receipt) return receipt.status === 'success' ? 'success' : 'reverted';
    const tx = await client.public.getTransaction({ hash }).catch((err: unknown) => {
      if (err instanceof TransactionNotFoundError) return null;
      throw err;
    });
    if (!tx) return 'dropped';
    try {
      const mined = await client.public.waitForTransactionReceipt({ hash, timeout: this.chain.receiptTimeoutMs ?? SLASH_RECEIPT_TIMEOUT_MS });
      return mined.status === 'success' ? 'success' : 'reverted';
    } catch (err) {
      if (err instanceof WaitForTransactionReceiptTimeoutError) return 'pending';
      throw err;
    }
  }
}
