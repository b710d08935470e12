// nbcli model rm | keep: a developer's models in the network's model store
// (docs/security.md, "Storage"; the orchestrator's rules in
// src/orchestrator/blobs/store-budget.ts). An unpublished model is collected
// after the orchestrator's --model-retention unless kept longer: `keep` pays
// the quote (NIM per GB-day, a transfer to the orchestrator on a paid network,
// as `checkpoint keep` does) and extends it; `rm` deletes it (refused while
// deployed). NAME is a sha256, or a name: every model of the wallet stored
// under it.
import type { Command } from 'commander';
import type { Address, Hex } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../api/client.ts';
import { ModelClient } from '../../api/model-client.ts';
import type { StoredModelView } from '../../api/models.ts';
import { formatNim } from '../../chain/amounts.ts';
import { loadWalletFile, unlockWallet } from '../../chain/wallets.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, type ChainCommandOptions } from '../chain-options.ts';
import { emit, parsePositiveInt, resolveDataDir } from '../common.ts';
import { readPassword } from '../prompt.ts';
import { payStore } from '../store-payment.ts';

interface Flags extends ChainCommandOptions {
  orchestrator: string;
  days?: string;
}

const SHA256 = /^[0-9a-f]{64}$/;

async function unlocked(flags: Flags): Promise<{ key: Hex; address: Address; client: ModelClient }> {
  const walletName = flags['wallet.name'];
  if (!walletName) throw new NimbleError('invalid', "--wallet.name is required: the wallet that stored the model");
  const dataDir = resolveDataDir(flags);
  loadWalletFile(dataDir, walletName);
  const { account, privateKey } = unlockWallet(dataDir, walletName, await readPassword(`Password for wallet '${walletName}': `));
  return { key: privateKey, address: account.address, client: new ModelClient(new OrchestratorClient(flags.orchestrator, { wallet: privateKey })) };
}

/** The wallet's stored models `ref` names (a sha256, or every one under a name). */
async function storedOf(client: ModelClient, owner: Address, ref: string): Promise<StoredModelView[]> {
  const mine = await client.list(owner);
  const found = mine.filter((m) => (SHA256.test(ref) ? m.sha256 === ref : m.name === ref));
  if (found.length === 0) throw new NimbleError('not_found', `${owner} stores no model ${SHA256.test(ref) ? ref : `named '${ref}'`} on this orchestrator (nbcli model list shows the published ones)`);
  return found;
}

/** Keeps a stored model `days` more, paying the orchestrator's quote first on a paid network. */
export async function keepModel(flags: ChainCommandOptions, client: ModelClient, key: Hex, m: StoredModelView, days: number, api: OrchestratorClient): Promise<{ model: StoredModelView; paid: bigint }> {
  const quote = await client.quote(m.bytes, days);
  const price = BigInt(quote.price);
  if (price === 0n || !quote.payee) return { model: await client.keep(m.sha256, days), paid: 0n };
  const paid = await onChain(flags, (chain) => payStore(chain, async () => quote, privateKeyToAccount(key), m.bytes, days, false), { orchestrator: api });
  return { model: await client.keep(m.sha256, days, paid.payment), paid: price };
}

export function registerModelStore(group: Command, common: (cmd: Command) => Command): void {
  common(
    group
      .command('keep <name>')
      .description("keep your stored model (by name or sha256) N days more before the store collects it (on a paid network: NIM per GB-day, paid first)")
      .requiredOption('--days <n>', 'days')
      .option('--wallet.name <name>', 'the wallet that stored the model (a file in <data-dir>/wallets/)'),
  ).action(async (ref: string, flags: Flags) => {
    const days = parsePositiveInt('--days', flags.days, 1);
    const { key, address, client } = await unlocked(flags);
    const out: { model: StoredModelView; paid: bigint }[] = [];
    for (const m of await storedOf(client, address, ref)) out.push(await keepModel(flags, client, key, m, days, new OrchestratorClient(flags.orchestrator)));
    emit(
      flags,
      out.map((o) => ({ event: 'kept', sha256: o.model.sha256, name: o.model.name, expiresAt: o.model.expiresAt ?? null, paid: formatNim(o.paid) })),
      () => out.map((o) => `kept ${o.model.name} (${o.model.sha256.slice(0, 12)}…) until ${o.model.expiresAt ? new Date(o.model.expiresAt).toISOString() : 'published: kept'}${o.paid ? `, paid ${formatNim(o.paid)} NIM` : ''}`).join('\n'),
    );
  });

  common(
    group
      .command('rm <name>')
      .description('delete your stored model (by name or sha256) from the network\'s model store (not while deployed); its name stays yours')
      .option('--wallet.name <name>', 'the wallet that stored the model (a file in <data-dir>/wallets/)'),
  ).action(async (ref: string, flags: Flags) => {
    const { address, client } = await unlocked(flags);
    const removed: StoredModelView[] = [];
    for (const m of await storedOf(client, address, ref)) removed.push(await client.remove(m.sha256));
    emit(
      flags,
      removed.map((m) => ({ event: 'removed', sha256: m.sha256, name: m.name, bytes: m.bytes })),
      () => removed.map((m) => `removed ${m.name} (${m.sha256}), ${m.bytes} bytes`).join('\n'),
    );
  });
}
