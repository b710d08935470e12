// nbcli chain status|stop: the local chain node of a data dir (docs/chain.md,
// "The local chain"). A command starts it and stops it; an orchestrator keeps
// it up while it runs and saves and stops it when it stops; one killed (kill
// -9, a crash, a closed terminal) leaves it running, to be adopted by the next
// command of that data dir, or stopped here: by the pid node.json records,
// once that pid is checked to be an anvil process, its state saved first.
import type { Command } from 'commander';
import { localNodeStatus, stopLocalNode, type LocalNodeStatus } from '../../chain/node.ts';
import { emit, resolveDataDir, withCommonOptions, type CommonOptions } from '../common.ts';

export function registerChain(program: Command): void {
  const chain = program.command('chain').description("the data dir's local chain node (anvil): is it running, stop it");

  withCommonOptions(chain.command('status'))
    .description("whether the data dir's local chain node runs: its pid, RPC URL and the process that keeps it")
    .action(async (opts: CommonOptions) => {
      const dataDir = resolveDataDir(opts);
      const status = await localNodeStatus(dataDir);
      emit(opts, { dataDir, ...status }, () => describeStatus(dataDir, status));
    });

  withCommonOptions(chain.command('stop'))
    .description("stop the data dir's local chain node left running (its state saved first); refused while the orchestrator that keeps it runs")
    .action(async (opts: CommonOptions) => {
      const dataDir = resolveDataDir(opts);
      const stopped = await stopLocalNode(dataDir);
      emit(opts, { event: stopped.pid === null ? 'not-running' : 'stopped', dataDir, ...stopped }, () =>
        stopped.pid === null
          ? `no local chain node runs for ${dataDir}`
          : `stopped the local chain node (anvil pid ${stopped.pid}); ${stopped.saved ? `its state is saved in ${stopped.stateFile}` : 'it did not answer, so its state was not saved'}`,
      );
    });
}

function describeStatus(dataDir: string, s: LocalNodeStatus): string {
  if (!s.running) return `no local chain node runs for ${dataDir}${s.hasState ? ` (its state is in ${s.stateFile}; the next command starts it from there)` : ''}`;
  const keeper = s.ownerAlive
    ? `kept by process ${s.ownerPid}${s.persistent ? ' (an orchestrator or nbcli up: it saves and stops the node when it stops)' : ' (a command using it)'}`
    : `left running: process ${s.ownerPid} that kept it is gone (nbcli chain stop stops it; the next command of this data dir adopts it)`;
  const warn = s.anvil ? '' : `\n  process ${s.pid} is not an anvil node: node.json is stale`;
  return `local chain node of ${dataDir}: anvil pid ${s.pid}, ${s.rpcUrl} (chain ${s.chainId}${s.answering ? '' : ', not answering'}), since ${s.startedAt}, ${keeper}${warn}`;
}
