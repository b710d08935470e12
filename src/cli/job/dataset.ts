// nbcli dataset: a developer's uploaded datasets (docs/jobs.md, "Data").
// `job submit` uploads a spec's local data itself, for free while the
// network's free store has room; `upload` packs and uploads a file or folder
// the same way, paid for --keep-days past it (the quote's NIM transfer,
// src/cli/store-payment.ts); `keep` pays to keep one longer; `list` shows
// what is kept and `rm` deletes what is no longer wanted.
import type { Command } from 'commander';
import { privateKeyToAccount } from 'viem/accounts';
import { OrchestratorClient } from '../../api/client.ts';
import { DatasetClient } from '../../api/dataset-client.ts';
import type { DatasetView } from '../../api/datasets.ts';
import { ModelClient } from '../../api/model-client.ts';
import { formatNim } from '../../chain/amounts.ts';
import { datasetHex, packDataset } from '../../data/dataset.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, withChainOption, type ChainCommandOptions } from '../chain-options.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, withCommonOptions } from '../common.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';
import { payStore, type PaidKeep } from '../store-payment.ts';

interface Flags extends ChainCommandOptions {
  orchestrator: string;
  'wallet.name'?: string;
  mine?: boolean;
  keepDays?: string;
  days?: string;
}

/** Pays the quote for keeping `bytes` `days` from the signing key, on the orchestrator's chain (nothing on an unpaid network). */
async function pay(flags: Flags, api: OrchestratorClient, key: `0x${string}`, bytes: number, days: number, fresh: boolean): Promise<PaidKeep> {
  const quote = await new ModelClient(api).quote(bytes, days);
  if (BigInt(quote.price) === 0n || !quote.payee) return { days };
  return onChain(flags, (chain) => payStore(chain, async () => quote, privateKeyToAccount(key), bytes, days, fresh), { orchestrator: api });
}

function paidWords(p: PaidKeep): string {
  return p.payment && p.price !== undefined ? `, paid ${formatNim(p.price)} NIM (tx ${p.payment})` : '';
}

export function registerDataset(program: Command): void {
  const group = program.command('dataset').description("datasets uploaded for jobs (job submit uploads a spec's local file or folder): upload (paid past the free store), keep, list, delete");
  const common = (cmd: Command): Command =>
    withCommonOptions(
      cmd
        .option('--orchestrator <url>', 'the network', DEFAULT_ORCHESTRATOR)
        .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
    );
  const signed = async (flags: Flags): Promise<OrchestratorClient> => new OrchestratorClient(flags.orchestrator, { wallet: await signingKey(flags, DEVELOPER_KEY_FILE) });

  common(group.command('list').description('datasets kept on the network').option('--mine', 'only yours')).action(async (flags: Flags) => {
    const api = flags.mine ? await signed(flags) : new OrchestratorClient(flags.orchestrator);
    const owner = flags.mine ? (await api.signed()).address : undefined;
    const list = await new DatasetClient(api).list(owner);
    emit(flags, list, () => (list.length ? list.map(describe).join('\n') : 'no datasets'));
  });

  withChainOption(
    common(
      group
        .command('upload <path>')
        .description("pack a text file or folder as job submit does and upload it; past the network's free store it is stored only paid (--keep-days)")
        .option('--keep-days <n>', 'keep it paid this many days (NIM per GB-day, paid first: GET /storage/quote says the price)'),
    ),
  ).action(async (path: string, flags: Flags) => {
    const days = flags.keepDays === undefined ? undefined : parsePositiveInt('--keep-days', flags.keepDays, 1);
    const packed = packDataset(path);
    const hex = datasetHex(packed.id);
    const key = await signingKey(flags, DEVELOPER_KEY_FILE);
    const api = new OrchestratorClient(flags.orchestrator, { wallet: key });
    const client = new DatasetClient(api);
    const held = await client.get(hex, (await api.signed()).address);
    const paid = days === undefined ? undefined : await pay(flags, api, key, packed.bytes.length, days, held === null);
    const dataset = held && paid ? await client.keep(hex, paid.days, paid.payment) : held ?? (await client.upload(packed.bytes, hex, () => {}, paid)).dataset;
    const uploaded = held === null;
    emit(
      flags,
      { event: 'dataset', ...dataset, uploaded, payment: paid?.payment ?? null, paid: paid?.price === undefined ? '0' : formatNim(paid.price) },
      () => `${uploaded ? 'uploaded' : 'already stored'} ${dataset.id} (${(dataset.bytes / 1e6).toFixed(2)} MB, ${packed.files.length} file${packed.files.length === 1 ? '' : 's'}), kept until ${new Date(dataset.expiresAt).toISOString()} unless used${paid ? paidWords(paid) : ''}`,
    );
  });

  withChainOption(
    common(group.command('keep <id>').description('keep one of your datasets N days more before the store collects it (on a paid network: NIM per GB-day, paid first)').requiredOption('--days <n>', 'days')),
  ).action(async (id: string, flags: Flags) => {
    const days = parsePositiveInt('--days', flags.days, 1);
    const hex = hexOf(id);
    const key = await signingKey(flags, DEVELOPER_KEY_FILE);
    const api = new OrchestratorClient(flags.orchestrator, { wallet: key });
    const client = new DatasetClient(api);
    const mine = await client.get(hex, (await api.signed()).address);
    if (!mine) throw new NimbleError('not_found', `${(await api.signed()).address} keeps no dataset sha256:${hex} on this orchestrator (nbcli dataset list --mine)`);
    const paid = await pay(flags, api, key, mine.bytes, days, false);
    const kept = await client.keep(hex, days, paid.payment);
    emit(flags, { event: 'kept', ...kept, payment: paid.payment ?? null, paid: paid.price === undefined ? '0' : formatNim(paid.price) }, () => `kept ${kept.id} until ${new Date(kept.expiresAt).toISOString()}${paidWords(paid)}`);
  });

  common(group.command('rm <id>').description('delete one of your datasets (sha256:<hex> or the hex); refused while a job of yours uses it')).action(async (id: string, flags: Flags) => {
    const hex = hexOf(id);
    const removed = await new DatasetClient(await signed(flags)).remove(hex);
    emit(flags, { event: 'deleted', ...removed }, () => `deleted ${removed.id} (${(removed.bytes / 1e6).toFixed(2)} MB)`);
  });
}

/** The hex of a dataset id (sha256:<hex> or the hex). */
function hexOf(id: string): string {
  const hex = id.startsWith('sha256:') ? id.slice(7) : id;
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new NimbleError('invalid', `'${id}' is not a dataset id (sha256:<64 lowercase hex digits>)`);
  return hex;
}

function describe(d: DatasetView): string {
  return `${d.id} ${(d.bytes / 1e6).toFixed(2)} MB owner ${d.owner} uploaded ${new Date(d.createdAt).toISOString()} kept until ${new Date(d.expiresAt).toISOString()} unless used`;
}
