// nbcli credit add|balance|withdraw (docs/inference.md, "Payment"): what
// pays for completions made with the wallet's API keys (./api-key.ts): NIM
// the wallet escrows on its orchestrator's JobEscrow (opened here from
// the wallet's key like a job's budget, ../job/job-escrow.ts, then registered with
// a signed request; an escrow the orchestrator refuses is released at once).
// Signed with --wallet.name, or <data-dir>/developer-key.json.
import { randomBytes } from 'node:crypto';
import type { Command } from 'commander';
import type { Hex } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../api/client.ts';
import { CreditClient } from '../../api/credit-client.ts';
import type { CreditView } from '../../api/credits.ts';
import { JobClient } from '../../api/job-client.ts';
import { formatNim, parseNim, showNim } from '../../chain/amounts.ts';
import { signerFor } from '../../chain/client.ts';
import { openEscrow } from '../../chain/escrow.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, withChainOption, type ChainCommandOptions } from '../chain-options.ts';
import { DEFAULT_ORCHESTRATOR, emit, withCommonOptions } from '../common.ts';
import { checkChain } from '../job/job-escrow.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';

export interface CreditFlags extends ChainCommandOptions {
  orchestrator: string;
}

const nim = (wei: string): string => showNim(BigInt(wei));

/** The options every credit and api-key command takes. */
export function creditOptions(cmd: Command): Command {
  return withChainOption(withCommonOptions(
    cmd
      .option('--orchestrator <url>', 'the network', DEFAULT_ORCHESTRATOR)
      .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
  ));
}

/** The signing key and the clients of a credit or api-key command. */
export async function creditClient(flags: CreditFlags): Promise<{ key: Hex; api: OrchestratorClient; credits: CreditClient }> {
  const key = await signingKey(flags, DEVELOPER_KEY_FILE);
  const api = new OrchestratorClient(flags.orchestrator, { wallet: key });
  return { key, api, credits: new CreditClient(api) };
}

export function registerCredit(program: Command): void {
  const common = creditOptions;
  const client = creditClient;

  const credit = program.command('credit').description('prepaid NIM that pays for completions (escrowed on the chain, drawn at each epoch)');
  common(credit.command('add').description("escrow NIM from the wallet and add it to its balance").option('--amount <nim>', 'how many NIM')).action(async (flags: CreditFlags & { amount?: string }) => {
    const amount = parseNim(flags.amount);
    const { key, api, credits } = await client(flags);
    const { payment } = await credits.terms();
    if (!payment) throw new NimbleError('conflict', 'this network takes no payment: its models are free, an API key is all a request needs');
    const escrowId = `0x${randomBytes(32).toString('hex')}` as Hex;
    await onChain(flags, async (chain) => {
      checkChain(chain, payment);
      await openEscrow(chain, signerFor(chain, privateKeyToAccount(key)), escrowId, amount);
    }, { orchestrator: api });
    let view: CreditView;
    try {
      view = await credits.add(escrowId);
    } catch (err) {
      // the escrow is no credit: give it back
      const back = await new JobClient(api).release(escrowId).catch((e: Error) => e);
      const note = back instanceof Error ? ` Escrow ${escrowId} still holds ${showNim(amount)} NIM: ${back.message.split('\n')[0]}` : ` Escrow ${escrowId} was refunded.`;
      if (err instanceof NimbleError) throw new NimbleError(err.code, `${err.message}.${note}`, err.status, { cause: err });
      throw err;
    }
    emit(flags, { escrowId, added: formatNim(amount), credit: view }, () => `escrowed ${showNim(amount)} NIM in ${escrowId}\n${describeCredit(view)}`);
  });
  common(credit.command('balance').description('balance, reserved, owed and spent, and the escrows behind them')).action(async (flags: CreditFlags) => {
    const view = await (await client(flags)).credits.balance();
    emit(flags, view, () => describeCredit(view));
  });
  common(
    credit
      .command('withdraw')
      .description('end the credit: each escrow is closed, the rest refunded, once what it owes is paid (after the next epoch when something is owed)')
      .option('--wait <seconds>', 'wait this long for the refunds', '30'),
  ).action(async (flags: CreditFlags & { wait: string }) => {
    const waitMs = Number(flags.wait) * 1000;
    if (!(waitMs >= 0) || !Number.isFinite(waitMs)) throw new NimbleError('invalid', `--wait must be a number of seconds, got '${flags.wait}'`);
    const { credits } = await client(flags);
    let view = await credits.withdraw();
    const end = Date.now() + waitMs;
    while (view.escrows.some((e) => e.status !== 'closed') && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 500));
      view = await credits.balance();
    }
    const refunded = view.escrows.reduce((a, e) => a + BigInt(e.refunded ?? '0'), 0n);
    const waiting = view.escrows.filter((e) => e.status !== 'closed').length;
    emit(flags, view, () => `${describeCredit(view)}\n${waiting === 0 ? `all closed: ${showNim(refunded)} NIM refunded in all` : `${waiting} escrow(s) close once what they owe is paid (at the next epoch); nbcli credit balance follows them`}`);
  });
}

export function describeCredit(v: CreditView): string {
  const head = `${v.owner}: balance ${nim(v.balance)} NIM, reserved ${nim(v.reserved)} NIM, owed ${nim(v.owed)} NIM, spent ${nim(v.spent)} NIM`;
  const rows = v.escrows.map((e) => {
    const lock = e.lockedUntil ? `, locked until ${new Date(e.lockedUntil).toISOString()}` : '';
    const retry = e.error && e.attempts ? ` after ${e.attempts} attempt(s)${e.retryAt ? `, next try ${new Date(e.retryAt).toISOString()}` : ''}` : '';
    return `  ${e.escrowId}  ${e.status}  ${nim(e.amount)} NIM, drawn ${nim(e.committed)}${e.refunded !== null ? `, refunded ${nim(e.refunded)}` : ''}${lock}${e.error ? `  (last error${retry}: ${e.error})` : ''}`;
  });
  return [head, ...rows].join('\n');
}
