// nbcli dataset: a developer's uploaded datasets (docs/jobs.md, "Data").
// `job submit` uploads a spec's local data itself; these list what is kept
// and delete what is no longer wanted (the per-address quota counts them).
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { DatasetClient } from '../../api/dataset-client.ts';
import type { DatasetView } from '../../api/datasets.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { DEFAULT_ORCHESTRATOR, emit, withCommonOptions, type CommonOptions } from '../common.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';

interface Flags extends CommonOptions {
  orchestrator: string;
  'wallet.name'?: string;
  mine?: boolean;
}

export function registerDataset(program: Command): void {
  const group = program.command('dataset').description('datasets uploaded for jobs (job submit uploads a spec\'s local file or folder): list, delete');
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

  common(group.command('rm <id>').description('delete one of your datasets (sha256:<hex> or the hex); refused while a job of yours uses it')).action(async (id: string, flags: Flags) => {
    const hex = id.startsWith('sha256:') ? id.slice(7) : id;
    if (!/^[0-9a-f]{64}$/.test(hex)) throw new NimbleError('invalid', `'${id}' is not a dataset id (sha256:<64 lowercase hex digits>)`);
    const removed = await new DatasetClient(await signed(flags)).remove(hex);
    emit(flags, { event: 'deleted', ...removed }, () => `deleted ${removed.id} (${(removed.bytes / 1e6).toFixed(2)} MB)`);
  });
}

function describe(d: DatasetView): string {
  return `${d.id} ${(d.bytes / 1e6).toFixed(2)} MB owner ${d.owner} uploaded ${new Date(d.createdAt).toISOString()} kept until ${new Date(d.expiresAt).toISOString()} unless used`;
}
