// nbcli run: what a developer does with a run on the network after creating
// it (nbcli train): see it, cancel it, download its checkpoint. Signed with
// the developer's key (--wallet.name, or <data-dir>/developer-key.json).
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { DEFAULT_ORCHESTRATOR, emit, resolveDataDir, withCommonOptions, type CommonOptions } from '../common.ts';
import { describeRun } from './follow.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';

interface Flags extends CommonOptions {
  orchestrator: string;
  'wallet.name'?: string;
  out?: string;
}

export function registerRun(program: Command): void {
  const group = program.command('run').description("a run on the network: its status, cancelling it, its checkpoint (the run's owner only)");
  const common = (cmd: Command): Command =>
    withCommonOptions(
      cmd
        .option('--orchestrator <url>', 'the network the run is on', DEFAULT_ORCHESTRATOR)
        .option('--wallet.name <name>', 'sign as this wallet (default: <data-dir>/developer-key.json)'),
    );
  const client = async (flags: Flags): Promise<OrchestratorClient> => new OrchestratorClient(flags.orchestrator, { wallet: await signingKey(flags, DEVELOPER_KEY_FILE) });

  common(group.command('status <id>').description("a run's status")).action(async (id: string, flags: Flags) => {
    const v = await new OrchestratorClient(flags.orchestrator).run(id);
    emit(flags, v, () => `${v.id} ${v.microbatchesDone}/${v.steps}: ${describeRun(v)}${v.message ? ` (${v.message})` : ''}`);
  });
  common(group.command('cancel <id>').description('end one of your runs; its miners go to other runs')).action(async (id: string, flags: Flags) => {
    const v = await (await client(flags)).cancelRun(id);
    emit(flags, v, () => `${v.id} ${v.status}`);
  });
  common(group.command('checkpoint <id>').description('download the merged model of one of your runs (safetensors)').option('--out <file>', 'where to write it (default: <data-dir>/checkpoints/<id>.safetensors)')).action(
    async (id: string, flags: Flags) => {
      const bytes = await (await client(flags)).checkpoint(id);
      const out = flags.out ?? join(resolveDataDir(flags), 'checkpoints', `${id}.safetensors`);
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, bytes);
      emit(flags, { id, checkpoint: out, bytes: bytes.length }, () => `${out} (${bytes.length} bytes)`);
    },
  );
}
