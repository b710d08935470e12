// Paying for a job from the command line (docs/jobs.md "Payment"): the spec is
// checked by the orchestrator first (nothing is escrowed for a job it would
// refuse), then the budget is escrowed on its chain's JobEscrow (the chain
// it names, checked: ../chain-options.ts onChain) from the
// developer's key (a clear error, before anything is sent, when the NIM is
// not there), then the job is submitted with the escrow's id. A submission
// that fails after the escrow was opened gets the escrow released (refunded)
// at once (nbcli credit add opens a wallet's inference credit the same way,
// ../inference/credit.ts). Keeping checkpoints longer is paid by a NIM transfer to the
// orchestrator, whose hash goes with the request. `nbcli job refund` closes
// one of the developer's escrows on chain itself, for when the orchestrator
// is gone: the contract allows it from the escrow's refund time on, and not
// while the orchestrator's lock holds it (it pays for a job that runs or
// for work not paid yet).
import { randomBytes } from 'node:crypto';
import { getAddress, type Address, type Hex } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import type { JobClient } from '../../api/job-client.ts';
import type { CheckpointView, JobView, PaymentTermsView } from '../../api/jobs.ts';
import { showNim } from '../../chain/amounts.ts';
import { signerFor, type ChainClient } from '../../chain/client.ts';
import { closeEscrow, openEscrow, readEscrow, type JobEscrowState } from '../../chain/escrow.ts';
import { faucet, transferNim } from '../../chain/token.ts';
import type { JobSpec } from '../../jobs/spec.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, type ChainCommandOptions } from '../chain-options.ts';

export interface PaidSubmitOptions {
  /** local chain only: mint the budget to the developer first (nbcli up's demo developer has no NIM) */
  faucet?: boolean;
  log?: (line: string) => void;
}

/** Submits `spec` signed by `key`, escrowing its budget first when the network is paid and the spec has one. */
export async function submitJob(flags: ChainCommandOptions, jobs: JobClient, spec: JobSpec, key: Hex, opts: PaidSubmitOptions = {}): Promise<JobView> {
  const { payment } = await jobs.terms();
  const check = await jobs.check(spec);
  if (!payment || check.escrow === null) return jobs.submit(spec);
  const amount = BigInt(check.escrow);
  const escrowId = `0x${randomBytes(32).toString('hex')}` as Hex;
  await onChain(flags, async (client) => {
    checkChain(client, payment);
    const developer = signerFor(client, privateKeyToAccount(key));
    if (opts.faucet) await faucet(client, developer.account.address, amount);
    await openEscrow(client, developer, escrowId, amount);
  }, { orchestrator: jobs.api });
  opts.log?.(`escrowed ${showNim(amount)} NIM for ${spec.name} in ${escrowId}`);
  try {
    return await jobs.submit(spec, escrowId);
  } catch (err) {
    // the escrow pays for nothing: give it back (the orchestrator refuses if the job was recorded after all)
    const back = await jobs.release(escrowId).catch((e: Error) => e);
    const note = back instanceof Error ? ` Escrow ${escrowId} still holds ${showNim(amount)} NIM: ${back.message.split('\n')[0]}` : ` Escrow ${escrowId} was refunded (${showNim(BigInt(back.refunded))} NIM).`;
    if (err instanceof NimbleError) throw new NimbleError(err.code, `${err.message}.${note}`, err.status, { cause: err });
    throw err;
  }
}

/** Keeps an ended job's checkpoints until `days` after it ended, paying the orchestrator's quote first on a paid network. */
export async function keepCheckpoints(flags: ChainCommandOptions, jobs: JobClient, id: string, days: number, key: Hex): Promise<{ list: CheckpointView[]; paid: bigint }> {
  const quote = await jobs.keepQuote(id, days);
  const price = BigInt(quote.price);
  if (price === 0n || !quote.payee) return { list: await jobs.keep(id, days), paid: 0n };
  const { payment } = await jobs.terms();
  if (!payment) throw new NimbleError('conflict', 'the orchestrator quotes a price but says it is not paid');
  const payee: Address = getAddress(quote.payee);
  const tx = await onChain(flags, async (client) => {
    checkChain(client, payment);
    return transferNim(client, signerFor(client, privateKeyToAccount(key)), payee, price);
  }, { orchestrator: jobs.api });
  return { list: await jobs.keep(id, days, tx.hash), paid: price };
}

export interface RefundResult {
  escrow: JobEscrowState;
  alreadyClosed: boolean;
  /** wei sent back (by this command, or the close before it) */
  refunded: bigint;
  tx: Hex | null;
}

/**
 * Closes escrow `escrowId` of the developer whose key is `key` on chain (the
 * owner's own close): what it did not pay goes back to the developer. The
 * contract refuses it before the escrow's refund time (RefundNotYet) and
 * while the orchestrator's lock holds it (EscrowLocked), each with the time
 * from which it would take it. On the chain the orchestrator names while it
 * answers, else on the command's own (--chain-rpc, the data dir's node).
 */
export async function refundEscrow(flags: ChainCommandOptions, escrowId: string, key: Hex): Promise<RefundResult> {
  if (!/^0x[0-9a-fA-F]{64}$/.test(escrowId)) throw new NimbleError('invalid', `an escrow id is 32 bytes of hex (0x and 64 digits, as nbcli job status shows it), got '${escrowId.slice(0, 80)}'`);
  const id = escrowId.toLowerCase() as Hex;
  return onChain(flags, async (client) => {
    const developer = signerFor(client, privateKeyToAccount(key));
    const before = await readEscrow(client, id);
    if (!before) throw new NimbleError('not_found', `no escrow ${id} on JobEscrow ${client.deployment.jobEscrow ?? '(none)'} (chain ${client.chainId})`);
    if (getAddress(before.owner) !== getAddress(developer.account.address)) throw new NimbleError('forbidden', `escrow ${id} is ${before.owner}'s, not ${developer.account.address}'s`);
    const r = await closeEscrow(client, developer, id);
    return { escrow: (await readEscrow(client, id)) ?? before, alreadyClosed: r.alreadyClosed, refunded: r.refunded, tx: r.tx?.hash ?? null };
  }, { orchestrator: flags.orchestrator, fallback: true }); // the orchestrator's chain; the command's own once the orchestrator is gone
}

/** The chain this command opened must be the orchestrator's, or the NIM would go somewhere it never looks. */
export function checkChain(client: ChainClient, terms: Pick<PaymentTermsView, 'chainId' | 'jobEscrow'>): void {
  const escrow = client.deployment.jobEscrow;
  if (client.chainId !== terms.chainId || !escrow || getAddress(escrow) !== getAddress(terms.jobEscrow)) {
    throw new NimbleError(
      'conflict',
      `the orchestrator is paid on chain ${terms.chainId} (JobEscrow ${terms.jobEscrow}); this command opened chain ${client.chainId} (JobEscrow ${escrow ?? 'none'}): use the orchestrator's chain (--chain-rpc, --data-dir)`,
    );
  }
}
